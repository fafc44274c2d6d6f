// The Decoder's cases (model/decode.h) that the unit tests run on the CPU
// and the emulated device (tests/unit/test_decode.cpp) and the CUDA tests
// on a GPU (tests/cuda/test_cuda_gpt.cpp): GPT-2 and Llama (grouped-query,
// multi-query and multi-head, Llama 3 rope scaling, tied and untied
// classifier), random weights far from a uniform prediction, and the check
// that a backend's cached decode gives the CPU's logits of one forward over
// the whole sequence.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/decode.h"
#include "model/gpt_config.h"
#include "model/param_table.h"
#include "ops/kernels.h"

namespace meshlm {

inline GPTConfig gpt2_config() {
  return {.n_layer = 2, .n_head = 4, .n_embd = 32, .vocab_size = 90, .max_seq_len = 40};
}

inline GPTConfig llama_config(bool tied, int kv_heads) {
  GPTConfig c{.n_layer = 2, .n_head = 4, .n_embd = 32, .vocab_size = 90, .max_seq_len = 40};
  c.arch = ModelArch::llama;
  c.n_kv_head = kv_heads;
  c.intermediate_size = 48;
  c.rope_theta = 500000;
  c.rope_scaling = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                    .original_max_positions = 16};
  c.tie_word_embeddings = tied;
  return c;
}

// Random weights large enough that attention and the logits are far from
// uniform: matrices N(0, 0.3^2), norm gains 1 + N(0, 0.1^2), biases
// N(0, 0.1^2); the padded vocabulary rows zero.
inline void random_weights(const GPTConfig& cfg, const std::vector<ParamSpec>& table, float* params,
                    uint64_t seed) {
  Rng r(seed);
  for (const ParamSpec& p : table) {
    float* t = params + p.offset;
    const bool vocab = p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head;
    const size_t real = vocab ? static_cast<size_t>(cfg.vocab_size) * p.full_shape[1] : p.numel();
    for (size_t i = 0; i < p.numel(); ++i) {
      double v = 0;
      if (i < real) {
        switch (p.role) {
          case ParamRole::ln1_weight:
          case ParamRole::ln2_weight:
          case ParamRole::lnf_weight: v = 1 + 0.1 * r.normal(); break;
          case ParamRole::ln1_bias:
          case ParamRole::ln2_bias:
          case ParamRole::lnf_bias:
          case ParamRole::linear_bias: v = 0.1 * r.normal(); break;
          default: v = 0.3 * r.normal(); break;
        }
      }
      t[i] = static_cast<float>(v);
    }
  }
}

inline std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(r.below(V));
  return t;
}

struct DecodeCase {
  std::string name;
  GPTConfig cfg;
};

inline std::vector<DecodeCase> decode_cases() {
  return {{"gpt2", gpt2_config()},
          {"llama GQA untied", llama_config(false, 2)},
          {"llama MQA tied", llama_config(true, 1)},
          {"llama MHA untied", llama_config(false, 4)}};
}

// Every case: the CPU's decoder runs the whole sequence as one chunk (the
// reference); a decoder on `kernels` prefills 7 tokens in chunks of 3 rows,
// then runs one token at a time against its cache, and then after reset()
// the prefill's last row alone and one more token. Each position's logits
// within `tol` of the reference row's largest.
inline void expect_decode_matches_whole_forward(const ops::Kernels& kernels, double tol) {
  for (const DecodeCase& c : decode_cases()) {
    SCOPED_TRACE(c.name);
    const int T = c.cfg.max_seq_len, Vp = c.cfg.padded_vocab_size(), P = 7;
    const std::vector<int32_t> x = random_tokens(T, c.cfg.vocab_size, 5);
    Decoder whole(c.cfg, T, /*chunk_rows=*/T);
    random_weights(c.cfg, whole.table(), whole.params(), 3);
    std::vector<float> ref(static_cast<size_t>(T) * Vp);
    whole.forward(x.data(), T, ref.data(), true);

    auto expect_row = [&](const float* got, int t) {
      const float* r = ref.data() + static_cast<size_t>(t) * Vp;
      float scale = 0;
      for (int v = 0; v < Vp; ++v) scale = std::max(scale, std::abs(r[v]));
      float worst = 0;
      for (int v = 0; v < Vp; ++v) worst = std::max(worst, std::abs(got[v] - r[v]));
      EXPECT_LE(worst, tol * scale) << "position " << t;
    };
    Decoder dec(c.cfg, T, /*chunk_rows=*/3, kernels);
    const float* weights = whole.params();
    dec.load([&](const ParamSpec& p, float* out) {
      std::copy(weights + p.offset, weights + p.offset + p.numel(), out);
    });
    std::vector<float> rows(static_cast<size_t>(P) * Vp), last(Vp);
    dec.forward(x.data(), P, rows.data(), /*all_rows=*/true);
    for (int t = 0; t < P; ++t) expect_row(rows.data() + static_cast<size_t>(t) * Vp, t);
    for (int t = P; t < T; ++t) {
      dec.forward(x.data() + t, 1, last.data());
      expect_row(last.data(), t);
    }
    EXPECT_EQ(dec.position(), T);
    dec.reset();
    dec.forward(x.data(), P, last.data());
    expect_row(last.data(), P - 1);
    dec.forward(x.data() + P, 1, last.data());
    expect_row(last.data(), P);
  }
}

}  // namespace meshlm
