// What GPT's step asks of a GPU backend besides the model's Buffers, as
// its forward and backward call the ops (model/gpt_forward.cpp,
// gpt_linear.cpp, quant/qlinear.cpp, model/lora.cpp): the 16-bit copies of
// every GEMM's inputs and the copies it holds (ops/gpu_workspace.h's rules),
// the scratch of the reductions over rows, the gradient norm's partial sums.
// The memory prediction (plan/memory.h, device_workspace_bytes) reads the
// model's step from here; test_gpu_workspace checks each against the calls
// a step really makes.
#pragma once

#include <cstddef>
#include <vector>

#include "model/gpt.h"
#include "model/gpt_config.h"
#include "model/param_table.h"
#include "ops/precision.h"

namespace meshlm {

// The CUDA backend's 16-bit copies of its GEMM inputs at bf16 and fp16
// for a rank holding `shard` with `o`, training micro-batches of (B, T):
// the largest set of spans any GEMM of the step rounds, each GEMM written
// down with the arguments of its call, plus the buffers of the operands it
// holds rounded (Kernels::hold_rounded); 0 at fp32.
size_t gpu_gemm_copies_bytes(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                             ops::Precision p, int B, int T);
// The CUDA backend's scratch of sums over rows (ops/gpu_workspace.h).
size_t gpu_reduction_scratch_bytes(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                                   int B, int T);
// The gradient norm's partial sums on a GPU, for the trained tensors.
size_t gpu_norm_scratch_bytes(const std::vector<ParamSpec>& trained);
// All of it, and the pinned staging of uploads: the workspace a GPU rank
// holds beyond the model's Buffers.
size_t gpu_step_workspace_bytes(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                                ops::Precision p, int B, int T);

}  // namespace meshlm
