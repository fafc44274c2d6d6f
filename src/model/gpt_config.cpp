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
  if (arch != ModelArch::llama) return;
  if (n_kv_head < 0 || (n_kv_head > 0 && n_head % n_kv_head != 0))
    fail("model.n_head (" + std::to_string(n_head) + ") must be a multiple of model.n_kv_head (" +
         std::to_string(n_kv_head) + ")");
  if (head_size() % 2 != 0)
    fail("model.arch = llama: the head size model.n_embd / model.n_head = " +
         std::to_string(head_size()) + " must be even (the rotary embeddings turn pairs)");
  if (intermediate_size < 0)
    fail("model.intermediate_size must be >= 1, or 0 for 4 model.n_embd (got " +
         std::to_string(intermediate_size) + ")");
  if (!(norm_eps > 0)) fail("model.norm_eps must be > 0 (got " + std::to_string(norm_eps) + ")");
  if (!(rope_theta > 1)) fail("model.rope_theta must be > 1 (got " + std::to_string(rope_theta) + ")");
  const ops::RopeScaling& s = rope_scaling;
  if (s.factor != 0 && !(s.factor >= 1 && s.low_freq_factor > 0 &&
                         s.high_freq_factor > s.low_freq_factor && s.original_max_positions >= 1))
    fail("model.rope_scaling: factor >= 1, 0 < low_freq_factor < high_freq_factor and "
         "original_max_positions >= 1 (or factor 0: no scaling)");
}

std::string GPTConfig::describe() const {
  if (arch != ModelArch::llama)
    return "GPT-2 L=" + std::to_string(n_layer) + " NH=" + std::to_string(n_head) +
           " C=" + std::to_string(n_embd) + " V=" + std::to_string(vocab_size);
  return "Llama L=" + std::to_string(n_layer) + " NH=" + std::to_string(n_head) +
         " NKV=" + std::to_string(kv_heads()) + " C=" + std::to_string(n_embd) +
         " F=" + std::to_string(mlp_width()) + " V=" + std::to_string(vocab_size) +
         (tie_word_embeddings ? " tied" : "");
}

}  // namespace meshlm
