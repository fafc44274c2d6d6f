// `meshlm generate`: text (or token ids) from a model, with a key/value
// cache (model/decode.h) and meshlm's deterministic sampling
// (model/sampling.h). The command line and what it prints: kGenerateUsage in
// generate.cpp, docs/usage.md ("Generating text").
#pragma once

#include <string>
#include <vector>

namespace meshlm {

// The arguments after "generate". World rank 0 generates; the other ranks
// of a job (if any) wait for its outcome, which every rank returns: a
// failure is a CollectiveError carrying rank 0's message.
int cmd_generate(const std::vector<std::string>& args);

}  // namespace meshlm
