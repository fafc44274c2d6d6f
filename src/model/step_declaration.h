// What GPT's step asks of a backend besides the model's Buffers, declared
// once beside the forward and backward that ask it (model/gpt_forward.cpp,
// gpt_linear.cpp, quant/qlinear.cpp, model/lora.cpp): every GEMM with the
// arguments of its call, the inputs other ops round to 16 bits at once, the
// operands held rounded for several GEMMs (Kernels::hold_rounded), the sums
// over rows (bias and LayerNorm gradients) and the embedding gradient's
// index. The linear layers come from the parameter table (each linear weight
// of the shard's first block, its local shape and slot), so an architecture
// whose table lists other layers is declared by that table; the classifier
// and attention are the forward's own.
//
// The memory predictor (plan/memory.h, device_workspace_bytes) turns the
// declaration into a GPU backend's bytes by ops/gpu_workspace.h's rules;
// test_gpu_workspace records the calls a real step makes and checks both.
#pragma once

#include <cstddef>
#include <vector>

#include "model/gpt.h"
#include "model/gpt_config.h"
#include "model/param_table.h"

namespace meshlm {

// A GEMM as Kernels::gemm takes it (C(M,N) = op(A) op(B), `batch` of them
// strided sa and sb apart); a_held / b_held: a hold covers that operand.
struct DeclaredGemm {
  bool ta = false, tb = false;
  int M = 0, N = 0, K = 0, lda = 0, ldb = 0;
  long long sa = 0, sb = 0;
  int batch = 1;
  bool a_held = false, b_held = false;
};
// Inputs one op rounds at once outside Kernels::gemm, in elements: a linear
// layer's backward (dout once for its two GEMMs, w, inp), fused attention
// (qkv, and dout in the backward), the classifier's chunks.
struct DeclaredRounding {
  size_t a = 0, b = 0, c = 0;
};
// An operand held rounded while the GEMMs that read it run, at its depth of
// nesting (0: outermost).
struct DeclaredHold {
  int depth = 0;
  size_t elements = 0;
};
// A sum over `rows` rows of `columns` columns (all quantities of one call).
struct DeclaredRowSum {
  long long rows = 0;
  size_t columns = 0;
};

struct StepDeclaration {
  std::vector<DeclaredGemm> gemms;
  std::vector<DeclaredRounding> roundings;
  std::vector<DeclaredHold> holds;
  std::vector<DeclaredRowSum> row_sums;
  long long embedding_rows = 0;  // positions whose token-embedding gradient is summed by index
};

// The step of a rank holding `shard` with `o`, on micro-batches of (B, T).
StepDeclaration declare_step(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                             int B, int T);

}  // namespace meshlm
