// How a rank's GPT shard is built: activation slots and checkpointing (from
// [parallel]), the padding of its flat buffers (ZeRO), where its gradients
// go, and LoRA ([finetune]).
#pragma once

#include <cstddef>
#include <span>

#include "core/enum_names.h"
#include "model/lora.h"

namespace meshlm::ops {
class Kernels;  // ops/kernels.h
}
namespace meshlm::quant {
class Dequantizer;  // quant/dequantizer.h
}

namespace meshlm {

// parallel.activation_checkpointing: what a pipeline slot keeps of a block.
enum class Checkpointing {
  none,  // every activation of every block
  full,  // each block's output only; backward recomputes the block
};
inline constexpr EnumName<Checkpointing> kCheckpointingNames[] = {
    {Checkpointing::none, "none"},
    {Checkpointing::full, "full"},
};
constexpr std::span<const EnumName<Checkpointing>> enum_names(Checkpointing) {
  return kCheckpointingNames;
}

// train.attention: what causal attention keeps for its backward.
enum class Attention {
  automatic,      // resolved by the run configuration (train/run_config.h)
  probabilities,  // the (B, NH, T, T) softmax probabilities (ops::attention_*)
  flash,          // each row's log-sum-exp (ops::flash_attention_*); backward recomputes
};
inline constexpr EnumName<Attention> kAttentionNames[] = {
    {Attention::automatic, "auto"},
    {Attention::probabilities, "probabilities"},
    {Attention::flash, "flash"},
};
constexpr std::span<const EnumName<Attention>> enum_names(Attention) { return kAttentionNames; }

struct GPTOptions {
  int slots = 1;  // micro-batches whose activations are kept at once (pipeline in-flight)
  int micro_batches = 1;  // of a step: the mean losses kept until the step reads them
  Checkpointing checkpointing = Checkpointing::none;
  Attention attention = Attention::probabilities;  // never automatic here
  size_t pad_multiple = 1;  // flat buffers padded to a multiple of this (ZeRO shards)
  bool own_grads = true;    // false: gradients go where set_grad_target() says (ZeRO-2)
  LoraOptions lora;         // enabled: the base is frozen (attach_base) and only adapters train
  int classifier_rows = 0;  // rows of logits the classifier computes at once; 0 = automatic
  // Rows of a frozen quantized matrix dequantized per GEMM under LoRA; 0 =
  // quant::kQLinearTileRows (the CPU's); a GPU takes kGpuQTileRows.
  int qtile_rows = 0;
  // Under LoRA, a GPU's choice: the quantized classifier (wte, this rank's
  // vocabulary part) dequantized whole once per pass over the head's row
  // chunks, into a tile buffer sized for it, and each chunk one GEMM on it
  // (ops::matmul_*), where tiles of qtile_rows would dequantize and multiply
  // tile by tile in every chunk.
  bool whole_classifier_tile = false;
  // The backend of the ops (it must outlive the model); null = ops::Kernels::cpu().
  const ops::Kernels* kernels = nullptr;
  // Dequantizes the frozen base under LoRA, on the same backend as `kernels`
  // (it must outlive the model); null = quant::Dequantizer::cpu().
  const quant::Dequantizer* dequantizer = nullptr;
  auto operator<=>(const GPTOptions&) const = default;  // a key of kept results
};

}  // namespace meshlm
