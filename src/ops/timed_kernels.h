// runtime.op_timings: a Kernels that times every op of another one, for the
// breakdown of a step by op (which kernels a GPU step spends its time in).
//
// Each op waits for the backend's queue before and after it
// (Kernels::synchronize), so its time is its own, launch included, and ops
// no longer overlap with the host or with communication: a timed step is
// slower than a plain one, and its total is the sum of its ops. The results
// are the same bits as the inner backend's: every call is passed on as is.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "ops/forwarding_kernels.h"

namespace meshlm::ops {

struct GemmStat {
  double seconds = 0, flops = 0;
  uint64_t calls = 0;
};

class TimedKernels : public ForwardingKernels {
public:
  // `inner` must outlive this.
  explicit TimedKernels(const Kernels& inner) : ForwardingKernels(inner) {}

  double seconds(KernelOp op) const { return seconds_[static_cast<int>(op)]; }
  uint64_t calls(KernelOp op) const { return calls_[static_cast<int>(op)]; }
  // The work booked to `op` so far (OpWork's model).
  const OpWork& work(KernelOp op) const { return work_[static_cast<int>(op)]; }
  // Seconds, FLOPs and calls of matmul_forward, matmul_backward and gemm by shape.
  const std::map<GemmShape, GemmStat>& gemm_shapes() const { return shapes_; }
  // Forgets everything booked so far (a benchmark's warmup steps).
  void reset() const {
    seconds_ = {};
    calls_ = {};
    work_ = {};
    shapes_.clear();
  }

protected:
  // Runs the op between two waits for the inner backend and books the time
  // and the work (and, for a GEMM, its shape).
  void around(KernelOp op, const OpWork& w, const GemmShape* shape,
              const OpBody& body) const override;

private:
  mutable std::array<double, static_cast<int>(KernelOp::count)> seconds_{};
  mutable std::array<uint64_t, static_cast<int>(KernelOp::count)> calls_{};
  mutable std::array<OpWork, static_cast<int>(KernelOp::count)> work_{};
  mutable std::map<GemmShape, GemmStat> shapes_;
};

}  // namespace meshlm::ops
