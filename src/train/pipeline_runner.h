// One pipeline stage's share of a step: walks the stage's action list
// (plan/pipeline_schedule.h) and maps each action to a forward or backward
// of the model for one micro-batch, or to a send or receive of activations
// (forward) or their gradients (backward) between neighbouring stages.
//
// Micro-batches in flight at once are consecutive, so micro-batch i uses
// activation slot i % slots and never meets one still in flight. A slot's
// output (or the gradient sent back) is not overwritten before its send has
// completed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/comm.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "model/gpt.h"
#include "plan/pipeline_schedule.h"

namespace meshlm {

class PipelineRunner {
public:
  // `model`, the two views of the PP group and `timers` must outlive the
  // runner: operations on one Communicator complete in issue order, and a
  // receive must not wait behind a send still in flight (under NCCL both
  // views are the group's links, comm/pipeline_links.h, a communicator per
  // neighbour and direction). `loss_scale` multiplies each
  // micro-batch's mean loss in backward. `through_host`: the model's
  // buffers are a device's and the PP group moves host buffers (host
  // staging): activations leave from and arrive in host buffers of the
  // runner's, copied from and to the device.
  PipelineRunner(GPT& model, std::vector<Action> schedule, comm::Communicator& pp_send,
                 comm::Communicator& pp_recv, int micro_batch, int seq_len, float loss_scale,
                 SectionTimers& timers, bool through_host = false);

  // Collective over the PP group: the step's actions. tokens/targets hold
  // the micro-batches of (B, T) one after the other; before_forward(micro)
  // runs before each forward. The losses stay on the backend (losses()).
  void run(const int32_t* tokens, const int32_t* targets,
           const std::function<void(int micro)>& before_forward);
  // The sum of the last run's micro-batches' mean losses, in micro-batch
  // order, on the last stage (one wait for the backend); 0 elsewhere.
  double losses() const;
  // Collective over the PP group: the forward of the same micro-batches
  // only (evaluation), by the forward-only list (build_forward_schedule):
  // the loss, no gradient is touched and no loss scale applies. Returns the
  // sum of the micro-batches' mean losses on the last stage, 0 elsewhere.
  double forward_only(const int32_t* tokens, const int32_t* targets);

  const std::vector<Action>& schedule() const { return schedule_; }
  // Called before each backward of run() with its micro-batch.
  void set_before_backward(std::function<void(int micro)> f) { before_backward_ = std::move(f); }
  // The factor of the next run()'s backward (the engine's fp16 loss scale
  // times 1 / (micro_batches * dp)).
  void set_loss_scale(float s) { loss_scale_ = s; }

private:
  // Walks `actions`; each forward runs at `head_scale` (the classifier's
  // backward in the forward, training) or without (evaluation).
  void walk(const std::vector<Action>& actions, const int32_t* tokens, const int32_t* targets,
            const std::function<void(int micro)>& before_forward, std::optional<float> head_scale);

  GPT& model_;
  std::vector<Action> schedule_;
  std::vector<Action> forward_only_;  // the same micro-batches, forward only
  int micro_batches_ = 0;
  comm::Communicator &send_, &recv_;
  int B_, T_;
  float loss_scale_;
  SectionTimers& timers_;
  // Receives `count` floats from `peer` into the model's `dst` (collective
  // with the peer's send).
  void receive(float* dst, size_t count, int peer);

  // Gradients sent back to the previous stage, one per slot (comm category;
  // in the model's memory, or the host's through the host).
  Buffer send_back_;
  // Through the host: the activations sent forward, one per slot, and the
  // message received last (comm category).
  bool through_host_ = false;
  Buffer send_forward_, received_;
  std::vector<comm::Handle> fwd_sends_, bwd_sends_;
  std::function<void(int micro)> before_backward_;
};

}  // namespace meshlm
