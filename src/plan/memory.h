// The memory model: bytes per category that one rank will hold, predicted
// from the configuration before anything is allocated, and set beside what
// the tracked allocator measured at the end of the run.
//
// One rank, no parallelism yet (the process mesh divides these by the DP,
// TP and PP degrees and ZeRO stage when it comes):
//   params      = N * 4                 N = parameters of the table (fp32)
//   grads       = N * 4
//   optimizer   = 2 N * 4               AdamW m and v
//   activations = GPT::activation_bytes(cfg, micro_batch_size, seq_len)
//   other       = windows * 4           the shuffled order of one epoch
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/alloc.h"
#include "model/config.h"

namespace meshlm {

MemoryByCategory predict_memory(const GPTConfig& model, int micro_batch_size, int seq_len,
                                uint64_t windows_per_epoch, bool shuffle);

}  // namespace meshlm
