// The compute backend of a rank (runtime.backend): the CPU ops, or one GPU
// with its stream and device allocator (cuda/context.h). The model, ZeRO and
// AdamW run on backend().kernels(); their buffers live in its memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "mesh/mesh.h"
#include "ops/kernels.h"
#include "ops/timed_kernels.h"
#include "quant/dequantizer.h"
#include "train/group_comm.h"
#include "train/run_config.h"

namespace meshlm {

namespace cuda {
class DeviceContext;
}
class EmulatedDevice;

// What a backend is and can do, known without opening a device: the run's
// checks, the memory prediction, the plan and the run's report ask this,
// never which backend it is. backend_caps() (train/backend.cpp) is the one
// place that knows which backends this meshlm was built with.
struct BackendCaps {
  ComputeBackend kind = ComputeBackend::cpu;
  bool built = true;              // compiled into this meshlm
  const char* missing_build = "";  // why it is not, and how to get it
  // Buffers in a device's memory (a GPU's), whose use its driver reports;
  // the host stages the trained tensors' initialisation for it.
  bool device_memory = false;
  // The device kernels' own scratch on the device (ops/gpu_workspace.h: the
  // GEMMs' 16-bit copies, the reductions' partial sums, the upload staging),
  // which the memory prediction adds to the workspace.
  bool device_workspace = false;
  // Where the device's memory in use (Backend::device_used_bytes) comes from.
  const char* device_used_source = "";
  // bf16/fp16 GEMMs on hardware; false: emulated by rounding their inputs.
  bool native_16bit_gemm = false;
  // Appended to "fp32" in the run's precision line.
  const char* fp32_note = "";
  // Device buffers move between GPUs by NCCL (comm.device = nccl).
  bool nccl = false;
  // ... by comm/ordered_comm.h's emulation of NCCL (the emulated device).
  bool nccl_emulated = false;
  // The start-up GEMM that makes OpenBLAS's per-thread buffer resident (and
  // the memory prediction's line for it).
  bool openblas_warm_up = false;
  // The model's work sizes on this backend (model/gpt_options.h): LoRA tiles
  // of qtile_rows rows (0: the CPU's), the classifier's chunk of
  // classifier_chunk_floats logits (0: the CPU's automatic), the quantized
  // classifier dequantized whole once per pass.
  int qtile_rows = 0;
  size_t classifier_chunk_floats = 0;
  bool whole_classifier_tile = false;
  // Whether train.attention = flash runs at this precision and head size.
  bool (*flash_attention)(ops::Precision, int head_size) = nullptr;
  // The most (sequence, head) pairs of one micro-batch the flash kernels
  // take (the GPU's: one grid dimension of them); 0 = no limit.
  long long flash_max_batch_heads = 0;
};
const BackendCaps& backend_caps(ComputeBackend kind);
// Sets the model's work sizes of `caps` in `o` (qtile_rows, the classifier's
// rows for a vocabulary part of `vocab_part` rows, whole_classifier_tile):
// what Engine::plan_of gives a rank and meshlm_bench its model.
void apply_work_sizes(const BackendCaps& caps, size_t vocab_part, GPTOptions& o);
// The threads of a rank of `threads` whose GEMMs round their inputs on the
// CPU at `precision` (bf16 / fp16 on a backend without native 16-bit GEMMs),
// each with its part of an ops::RoundingScratch; 0: none. What the trainer
// makes and the memory prediction counts.
int rounding_threads(const BackendCaps& caps, ops::Precision precision, int threads);

class Backend {
public:
  // Collective over mesh.world(): a rank that can use no GPU under
  // runtime.backend = cuda makes every rank throw (CollectiveError naming it).
  // The kernels compute at `precision` (train.precision).
  // With op_timings, kernels() times every op (ops/timed_kernels.h).
  // `gpus_per_node`: the emulated device's GPUs per node (cluster.gpus_per_node;
  // 0: one per rank), which device_ordinal() gives ranks as cuda's do.
  Backend(ComputeBackend kind, const ProcessMesh& mesh,
          ops::Precision precision = ops::Precision::fp32, bool op_timings = false,
          int gpus_per_node = 0);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  ComputeBackend kind() const { return kind_; }
  const BackendCaps& caps() const { return backend_caps(kind_); }
  const ops::Kernels& kernels() const;
  // The op timings of kernels(), or null without runtime.op_timings.
  const ops::TimedKernels* op_timer() const { return timed_.get(); }
  // The frozen base's dequantization, beside kernels() (LoRA).
  const quant::Dequantizer& dequantizer() const;
  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)" or the emulated device's line.
  std::string describe() const;
  // "cpu", the GPU's name as its driver gives it ("NVIDIA H100 80GB HBM3"),
  // or "emulated".
  std::string device_name() const;
  // The device this rank computes on, among its node's (0 on the CPU; under
  // emulated the node-local rank modulo gpus_per_node, or the node-local
  // rank: train/group_paths.h, emulated_device_ordinal).
  int device_ordinal() const;
  // The GPU's compute stream (cudaStream_t; null elsewhere).
  void* device_stream() const;
  // A GPU's memory as its driver reports it (every process on the device),
  // and its size; 0 on the CPU.
  size_t device_used_bytes() const;
  size_t device_total_bytes() const;
  // Bytes this process holds in the GPU's caching allocator (in use and
  // cached); 0 on the CPU.
  size_t device_reserved_bytes() const;

private:
  const ops::Kernels& untimed_kernels() const;

  ComputeBackend kind_;
  ops::Precision precision_;
  int node_rank_ = 0;
  int emulated_ordinal_ = 0;
  std::unique_ptr<cuda::DeviceContext> gpu_;
  std::unique_ptr<EmulatedDevice> emulated_;  // runtime.backend = emulated
  std::unique_ptr<ops::TimedKernels> timed_;
};

// How the rank's groups move device buffers (train/group_comm.h): comm.device
// resolved per group from every rank's node and device (train/group_paths.h),
// the staging buffer of comm.bucket_mb (at least 1 MiB). Collective over
// mesh.world(); a refusal (nccl where two ranks of a group share a GPU, or
// on a backend without NCCL) is every rank's error.
DeviceRoute device_route(const RunConfig& cfg, const ProcessMesh& mesh, const Backend& backend);
// comm.overlap resolved: the bytes of the buckets in which ZeRO 0/1 reduce
// the gradients over dp during the last backward (train/zero.h), or 0 (one
// reduction after it; ZeRO 2; dp = 1). auto is on where the rank's dp group
// is NCCL's (`paths`).
size_t dp_overlap_bytes(const RunConfig& cfg, const GroupPaths& paths);

}  // namespace meshlm
