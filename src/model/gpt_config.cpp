#include "model/gpt_config.h"

#include <limits>

#include "core/error.h"

namespace meshlm {

void GPTConfig::validate() const {
  // The largest vocabulary whose padded size (a multiple of 64) is an int.
  constexpr int kMaxVocabSize = std::numeric_limits<int>::max() / 64 * 64;
  auto fail = [](const std::string& m) { throw CollectiveError(m, MESHLM_HERE); };
  if (n_layer < 1) fail("model.n_layer must be >= 1 (got " + std::to_string(n_layer) + ")");
  if (n_head < 1) fail("model.n_head must be >= 1 (got " + std::to_string(n_head) + ")");
  if (n_embd < 1) fail("model.n_embd must be >= 1 (got " + std::to_string(n_embd) + ")");
  if (n_embd % n_head != 0)
    fail("model.n_embd (" + std::to_string(n_embd) + ") must be divisible by model.n_head (" +
         std::to_string(n_head) + ")");
  if (vocab_size < 2) fail("model.vocab_size must be >= 2 (got " + std::to_string(vocab_size) + ")");
  if (vocab_size > kMaxVocabSize)  // padded_vocab_size() must fit in an int
    fail("model.vocab_size must be at most " + std::to_string(kMaxVocabSize) + " (got " +
         std::to_string(vocab_size) + ")");
  if (max_seq_len < 1) fail("model.max_seq_len must be >= 1 (got " + std::to_string(max_seq_len) + ")");
}

}  // namespace meshlm
