// The GPT-2 model configuration ([model] section of the parameter file).
#pragma once

#include <string>

namespace meshlm {

struct GPTConfig {
  int n_layer = 2;        // L
  int n_head = 4;         // NH
  int n_embd = 64;        // C
  int vocab_size = 256;   // V, real tokens
  int max_seq_len = 64;   // rows of the position table wpe

  // Vp: the vocabulary padded to a multiple of 64 for friendly GEMM shapes.
  int padded_vocab_size() const { return (vocab_size + 63) / 64 * 64; }
  int head_size() const { return n_embd / n_head; }
  // Throws CollectiveError naming the [model] key when impossible.
  void validate() const;
};

}  // namespace meshlm
