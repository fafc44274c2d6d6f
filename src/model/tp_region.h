// Tensor-parallel communication, named by what it does to a region of the
// computation (Megatron's mappings), in forward/backward pairs:
//
//   copy_to_region       forward: identity     backward: all-reduce (sum)
//       enters a column-parallel layer: every rank needs the whole input;
//       each rank's part contributes to the input's gradient.
//   reduce_from_region   forward: all-reduce   backward: identity
//       leaves a row-parallel layer (or the vocabulary-parallel embedding):
//       the partial outputs are summed; the gradient of the sum is the
//       same on every rank.
//
// Both are collective over the TP group and no-ops when it has one rank.
// Time spent in them is booked as Section::tp_comm.
#pragma once

#include <cstddef>

#include "comm/comm.h"
#include "core/timer.h"

namespace meshlm {

class TPRegion {
public:
  TPRegion() = default;
  TPRegion(comm::Communicator* group, SectionTimers* timers) : group_(group), timers_(timers) {}
  void set_timers(SectionTimers* t) { timers_ = t; }

  void copy_to_region_forward(const float* /*x*/, size_t /*n*/) {}
  void copy_to_region_backward(float* dx, size_t n) { all_reduce(dx, n, comm::ReduceOp::sum); }
  void reduce_from_region_forward(float* y, size_t n) { all_reduce(y, n, comm::ReduceOp::sum); }
  void reduce_from_region_backward(const float* /*dy*/, size_t /*n*/) {}

  // Vocabulary-parallel cross-entropy: per-row statistics combined over the
  // group (the logits themselves are never gathered).
  void max_over_region(float* x, size_t n) { all_reduce(x, n, comm::ReduceOp::max); }
  void sum_over_region(float* x, size_t n) { all_reduce(x, n, comm::ReduceOp::sum); }

private:
  void all_reduce(float* x, size_t n, comm::ReduceOp op) {
    if (group_ == nullptr || group_->size() == 1) return;
    if (timers_) timers_->begin(Section::tp_comm);
    group_->all_reduce(x, x, n, DType::f32, op).wait();
    if (timers_) timers_->end();
  }

  comm::Communicator* group_ = nullptr;
  SectionTimers* timers_ = nullptr;
};

}  // namespace meshlm
