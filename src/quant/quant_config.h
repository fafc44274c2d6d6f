// [quant] the base model's weights and, under LoRA, how they are quantized
// and shared.
#pragma once

#include <span>
#include <string>

#include "core/enum_names.h"
#include "quant/quantize.h"

namespace meshlm::quant {

// Where each rank finds the frozen base's bytes.
enum class ShareMode {
  node,      // one copy per node in shared memory, quantized once on rank 0
  per_rank,  // every rank loads and quantizes its own copy (the naive baseline)
};
inline constexpr EnumName<ShareMode> kShareModeNames[] = {
    {ShareMode::node, "node"},
    {ShareMode::per_rank, "per_rank"},
};
constexpr std::span<const EnumName<ShareMode>> enum_names(ShareMode) { return kShareModeNames; }

// How the node leaders receive the quantized bytes from rank 0 (quant.share
// = node).
enum class BaseBroadcast {
  mpi,   // MPI_Bcast into the leaders' node windows
  nccl,  // NCCL broadcasts between the leaders' GPUs, in chunks, then into the windows
};
inline constexpr EnumName<BaseBroadcast> kBaseBroadcastNames[] = {
    {BaseBroadcast::mpi, "mpi"},
    {BaseBroadcast::nccl, "nccl"},
};
constexpr std::span<const EnumName<BaseBroadcast>> enum_names(BaseBroadcast) {
  return kBaseBroadcastNames;
}

struct QuantConfig {
  QuantType type = QuantType::nf4;   // of the base's matrices; vectors stay f32
  ShareMode share = ShareMode::node;
  BaseBroadcast broadcast = BaseBroadcast::mpi;
  std::string base;   // *.safetensors | *.h5 | "" = GPT-2 initialisation from train.seed
  std::string cache;  // HDF5 quantized-model cache; "" = none
};

}  // namespace meshlm::quant
