// Byte-level BPE (GPT-2, Llama 3, ...): the text's bytes are mapped to
// printable characters (GPT-2's bytes_to_unicode), cut into pieces by the
// pre-tokenizer's regular expressions, and each piece's bytes are merged by
// the ranked merge list, lowest rank first, leftmost first on a tie (Hugging
// Face's order; OpenAI's "merge every occurrence of the best pair" gives the
// same ids for a merge list learnt by BPE).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/pretokenize.h"
#include "text/tokenizer.h"

namespace meshlm::text {

// The character GPT-2's byte-level alphabet gives byte b, as UTF-8.
const std::string& byte_char(uint8_t b);

// What a loader read, in the vocabulary's own (byte-mapped) strings.
struct BpeSpec {
  std::string source;                                   // the file(s), for messages
  std::vector<std::pair<std::string, uint64_t>> vocab;  // token -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  struct Added {
    std::string content;  // raw text, matched in the input before pre-tokenizing
    uint64_t id = 0;
    // Hugging Face's two passes: the tokens that are not normalized are
    // split out of the text first, the normalized ones out of what is left.
    bool normalized = false;
  };
  std::vector<Added> added;               // split out of the text (specials)
  // The pre-tokenizer's steps, applied in turn to the pieces of the step
  // before (the first to each stretch between added tokens): Split's
  // pattern, or ByteLevel's space before each piece that does not start
  // with one (add_prefix_space) then GPT-2's pattern (use_regex).
  struct Step {
    bool add_prefix_space = false;
    std::string pattern;  // "Isolated" split; "" for none
  };
  std::vector<Step> pre_tokenizer;
  bool ignore_merges = false;             // a piece that is a token is not merged
  std::optional<uint64_t> bos;            // what a post-processor puts first
};

class BpeTokenizer final : public Tokenizer {
public:
  // Throws RankError naming spec.source for a merge that names an unknown
  // token, a vocabulary without one of the 256 byte characters, two tokens
  // with one id, or an id that does not fit 32 bits.
  explicit BpeTokenizer(const BpeSpec& spec);

  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  std::string token_bytes(uint32_t id) const override;
  uint64_t vocab_size() const override { return bytes_.size(); }
  bool has_token(uint32_t id) const override { return id < assigned_.size() && assigned_[id]; }
  std::optional<uint32_t> token_id(std::string_view content) const override;
  std::optional<uint32_t> bos_id() const override { return bos_; }
  std::string kind() const override { return "bpe"; }

private:
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  // The ids of one piece (raw bytes), appended to `out`.
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<uint32_t>& out) const;
  // A segment between two added tokens: pre-tokenized, then merged.
  void encode_segment(std::string_view text, std::vector<uint32_t>& out) const;

  // The added tokens of one pass, matched leftmost, the longest at a
  // position first.
  struct AddedTokens {
    std::vector<std::pair<std::string, uint32_t>> tokens;  // longest first
    std::array<bool, 256> first{};                          // their first bytes
    // Where the next one starts in text[from:] (npos: none), and which.
    size_t find(std::string_view text, size_t from, size_t* which) const;
    // Their ids to `out` in text order, each stretch between them (not
    // empty) to between(stretch).
    template <typename F>
    void split(std::string_view text, std::vector<uint32_t>& out, F&& between) const;
  };

  std::vector<std::string> bytes_;       // id -> raw bytes
  std::vector<bool> assigned_;           // id -> has a token
  std::unordered_map<std::string, uint32_t> by_bytes_;  // vocabulary, raw bytes -> id
  std::unordered_map<uint64_t, Merge> merges_;         // (left << 32 | right) -> merge
  std::array<uint32_t, 256> byte_id_{};
  AddedTokens raw_added_, normalized_added_;  // normalized = false, true
  struct Step {
    bool add_prefix_space;
    std::unique_ptr<Regex> regex;  // null: no split
  };
  std::vector<Step> steps_;
  bool ignore_merges_ = false;
  std::optional<uint32_t> bos_;

  // Encoding state: the regexes' match buffers and a cache of short pieces.
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache_;  // -> pool range
  mutable std::vector<uint32_t> cache_pool_;
  mutable std::vector<std::string_view> pieces_, subpieces_;
  mutable std::deque<std::string> spaced_;  // pieces given their prefix space
};

}  // namespace meshlm::text
