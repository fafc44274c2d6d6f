#include "ops/timed_kernels.h"

#include "core/timer.h"

namespace meshlm::ops {

void TimedKernels::around(KernelOp op, const OpWork& w, const GemmShape* shape,
                          const OpBody& f) const {
  inner_.synchronize();
  const double t0 = now_seconds();
  f();
  inner_.synchronize();
  const double dt = now_seconds() - t0;
  const int i = static_cast<int>(op);
  seconds_[i] += dt;
  ++calls_[i];
  work_[i].flops += w.flops;
  work_[i].bytes += w.bytes;
  if (shape) {
    GemmStat& g = shapes_[*shape];
    g.seconds += dt;
    g.flops += w.flops;
    ++g.calls;
  }
}

}  // namespace meshlm::ops
