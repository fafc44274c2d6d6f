#include "plan/memory.h"

#include "model/gpt.h"

namespace meshlm {

MemoryByCategory predict_memory(const GPTConfig& model, int micro_batch_size, int seq_len,
                                uint64_t windows_per_epoch, bool shuffle) {
  MemoryByCategory m{};
  const size_t param_bytes = table_numel(gpt_param_table(model)) * sizeof(float);
  at(m, MemCategory::params) = param_bytes;
  at(m, MemCategory::grads) = param_bytes;
  at(m, MemCategory::optimizer) = 2 * param_bytes;
  at(m, MemCategory::activations) = GPT::activation_bytes(model, micro_batch_size, seq_len);
  at(m, MemCategory::other) = shuffle ? windows_per_epoch * sizeof(uint32_t) : 0;
  return m;
}

}  // namespace meshlm
