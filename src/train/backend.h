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
#include "train/run_config.h"

namespace meshlm {

namespace cuda {
class DeviceContext;
}

class Backend {
public:
  // Collective over mesh.world(): a rank that can use no GPU under
  // runtime.backend = cuda makes every rank throw (CollectiveError naming it).
  // The kernels compute at `precision` (train.precision).
  // With op_timings, kernels() times every op (ops/timed_kernels.h).
  Backend(ComputeBackend kind, const ProcessMesh& mesh,
          ops::Precision precision = ops::Precision::fp32, bool op_timings = false);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  ComputeBackend kind() const { return kind_; }
  const ops::Kernels& kernels() const;
  // The op timings of kernels(), or null without runtime.op_timings.
  const ops::TimedKernels* op_timer() const { return timed_.get(); }
  // The frozen base's dequantization, beside kernels() (LoRA).
  const quant::Dequantizer& dequantizer() const;
  // "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)".
  std::string describe() const;
  // A GPU's memory as its driver reports it (every process on the device),
  // and its size; 0 on the CPU.
  size_t device_used_bytes() const;
  size_t device_total_bytes() const;

private:
  const ops::Kernels& untimed_kernels() const;

  ComputeBackend kind_;
  ops::Precision precision_;
  std::unique_ptr<cuda::DeviceContext> gpu_;
  std::unique_ptr<ops::TimedKernels> timed_;
};

}  // namespace meshlm
