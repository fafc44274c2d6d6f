// The pre-tokenizers of byte-level BPE: a text is cut into pieces by a
// regular expression with Unicode properties (GPT-2's and Llama 3's patterns,
// or whatever a tokenizer.json's Split names), each piece then merged by BPE
// on its own. The expressions run through PCRE2 (UTF + UCP, JIT-compiled);
// nothing here interprets a pattern by hand.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshlm::text {

// GPT-2's pre-tokenizer pattern (also Hugging Face's ByteLevel with
// use_regex = true).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The length of the longest prefix of `s` that is valid UTF-8 (no overlong
// forms, no surrogates, nothing above U+10FFFF).
size_t valid_utf8_prefix(std::string_view s);

// A compiled pattern. split() is not thread-safe (it reuses one match
// buffer): one Regex per thread.
class Regex {
public:
  // Throws RankError naming `where` (e.g. the tokenizer file) and PCRE2's
  // message with the offset in the pattern.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Hugging Face's "Isolated" split: every match is a piece and so is every
  // stretch between two matches; empty matches are skipped. `text` must be
  // valid UTF-8 (valid_utf8_prefix(text) == text.size()). Appends to `out`
  // views into `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshlm::text
