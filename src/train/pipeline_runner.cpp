#include "train/pipeline_runner.h"

#include <cstring>

namespace meshlm {

PipelineRunner::PipelineRunner(GPT& model, std::vector<Action> schedule,
                               comm::Communicator& pp_send, comm::Communicator& pp_recv,
                               int micro_batch, int seq_len, float loss_scale,
                               SectionTimers& timers)
    : model_(model), schedule_(std::move(schedule)), send_(pp_send), recv_(pp_recv),
      B_(micro_batch), T_(seq_len), loss_scale_(loss_scale), timers_(timers) {
  const int slots = model_.options().slots;
  if (!model_.shard().first_stage)
    send_back_ = Buffer(static_cast<size_t>(slots) * B_ * T_ * model_.config().n_embd *
                            sizeof(float),
                        MemCategory::comm, "pipeline.send_back");
  fwd_sends_.resize(slots);
  bwd_sends_.resize(slots);
  int micro_batches = 0;
  for (const Action& a : schedule_)
    if (a.kind == ActionKind::forward) ++micro_batches;
  forward_only_ = build_forward_schedule(send_.rank(), send_.size(), micro_batches);
}

double PipelineRunner::run(const int32_t* tokens, const int32_t* targets,
                           const std::function<void(int micro)>& before_forward) {
  // The last stage runs the classifier's backward in the forward
  // (GPT::forward), at the scale backward() will use.
  return walk(schedule_, tokens, targets, before_forward, loss_scale_);
}

double PipelineRunner::forward_only(const int32_t* tokens, const int32_t* targets) {
  return walk(forward_only_, tokens, targets, nullptr, std::nullopt);
}

double PipelineRunner::walk(const std::vector<Action>& actions, const int32_t* tokens,
                            const int32_t* targets,
                            const std::function<void(int micro)>& before_forward,
                            std::optional<float> head_scale) {
  const size_t BT = static_cast<size_t>(B_) * T_;
  const size_t act = BT * model_.config().n_embd;
  const int stage = send_.rank();
  const int slots = model_.options().slots;
  double loss_sum = 0;
  for (const Action& a : actions) {
    const int slot = a.micro % slots;
    switch (a.kind) {
      case ActionKind::recv_forward: {
        ScopedTimer t(timers_, Section::pp_comm);
        recv_.recv(model_.stage_input(slot), act, DType::f32, stage - 1).wait();
        break;
      }
      case ActionKind::forward: {
        {
          ScopedTimer t(timers_, Section::pp_comm);
          fwd_sends_[slot].wait();  // the slot's output is about to be overwritten
        }
        ScopedTimer t(timers_, Section::forward);
        if (before_forward) before_forward(a.micro);
        loss_sum += model_.forward(slot, tokens + a.micro * BT, targets + a.micro * BT, B_, T_,
                                   head_scale);
        break;
      }
      case ActionKind::send_forward: {
        ScopedTimer t(timers_, Section::pp_comm);
        fwd_sends_[slot] = send_.send(model_.stage_output(slot), act, DType::f32, stage + 1);
        break;
      }
      case ActionKind::recv_backward: {
        ScopedTimer t(timers_, Section::pp_comm);
        recv_.recv(model_.grad_stream(), act, DType::f32, stage + 1).wait();
        break;
      }
      case ActionKind::backward: {
        ScopedTimer t(timers_, Section::backward);
        model_.backward(slot, loss_scale_);
        break;
      }
      case ActionKind::send_backward: {
        ScopedTimer t(timers_, Section::pp_comm);
        bwd_sends_[slot].wait();
        float* buf = send_back_.as<float>() + slot * act;
        // The gradient stream lives in the model's memory (a device's on a
        // GPU); the message leaves from the host.
        model_.kernels().download(buf, model_.grad_stream(), act * sizeof(float));
        bwd_sends_[slot] = send_.send(buf, act, DType::f32, stage - 1);
        break;
      }
    }
  }
  ScopedTimer t(timers_, Section::pp_comm);
  for (auto& h : fwd_sends_) h.wait();
  for (auto& h : bwd_sends_) h.wait();
  return loss_sum;
}

}  // namespace meshlm
