// What a mistyped name was probably meant to be, for error messages: the
// known name two edits or fewer away (insertions, deletions, substitutions;
// case aside). "model.n_layers" -> "model.n_layer", "--max-new-token" ->
// "--max-new-tokens".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshlm {

// The name of `names` nearest to `word` within two edits, the first of
// equals; "" when none is (or `word` is over 100 bytes).
std::string nearest_name(std::string_view word, const std::vector<std::string>& names);

// "; did you mean 'NAME'?" for nearest_name's answer, "" for none.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& names);

}  // namespace meshlm
