#include "train/pipeline_runner.h"

#include <cstring>

namespace meshlm {

PipelineRunner::PipelineRunner(GPT& model, std::vector<Action> schedule,
                               comm::Communicator& pp_send, comm::Communicator& pp_recv,
                               int micro_batch, int seq_len, float loss_scale,
                               SectionTimers& timers, bool through_host)
    : model_(model), schedule_(std::move(schedule)), send_(pp_send), recv_(pp_recv),
      B_(micro_batch), T_(seq_len), loss_scale_(loss_scale), timers_(timers),
      through_host_(through_host) {
  const int slots = model_.options().slots;
  const size_t act_bytes = static_cast<size_t>(B_) * T_ * model_.config().n_embd * sizeof(float);
  // In the model's memory, or the host's when the group moves host buffers.
  if (!model_.shard().first_stage)
    send_back_ = Buffer(slots * act_bytes, MemCategory::comm, "pipeline.send_back",
                        through_host_ ? Device::cpu : model_.kernels().device());
  if (through_host_ && send_.size() > 1) {
    if (!model_.shard().last_stage)
      send_forward_ = Buffer(slots * act_bytes, MemCategory::comm, "pipeline.send_forward");
    received_ = Buffer(act_bytes, MemCategory::comm, "pipeline.received");
  }
  fwd_sends_.resize(slots);
  bwd_sends_.resize(slots);
  for (const Action& a : schedule_)
    if (a.kind == ActionKind::forward) ++micro_batches_;
  forward_only_ = build_forward_schedule(send_.rank(), send_.size(), micro_batches_);
}

void PipelineRunner::run(const int32_t* tokens, const int32_t* targets,
                         const std::function<void(int micro)>& before_forward) {
  // The last stage runs the classifier's backward in the forward
  // (GPT::forward), at the scale backward() will use.
  walk(schedule_, tokens, targets, before_forward, loss_scale_);
}

double PipelineRunner::forward_only(const int32_t* tokens, const int32_t* targets) {
  walk(forward_only_, tokens, targets, nullptr, std::nullopt);
  return losses();
}

double PipelineRunner::losses() const {
  if (!model_.shard().last_stage) return 0.0;
  double sum = 0;
  for (const float loss : model_.queued_losses(micro_batches_)) sum += loss;
  return sum;
}

void PipelineRunner::receive(float* dst, size_t count, int peer) {
  if (!through_host_) {
    recv_.recv(dst, count, DType::f32, peer).wait();
    return;
  }
  recv_.recv(received_.as<float>(), count, DType::f32, peer).wait();
  model_.kernels().upload(dst, received_.data(), count * sizeof(float));
}

void PipelineRunner::walk(const std::vector<Action>& actions, const int32_t* tokens,
                          const int32_t* targets,
                          const std::function<void(int micro)>& before_forward,
                          std::optional<float> head_scale) {
  const size_t BT = static_cast<size_t>(B_) * T_;
  const size_t act = BT * model_.config().n_embd;
  const int stage = send_.rank();
  const int slots = model_.options().slots;
  for (const Action& a : actions) {
    const int slot = a.micro % slots;
    switch (a.kind) {
      case ActionKind::recv_forward: {
        ScopedTimer t(timers_, Section::pp_comm);
        receive(model_.stage_input(slot), act, stage - 1);
        break;
      }
      case ActionKind::forward: {
        {
          ScopedTimer t(timers_, Section::pp_comm);
          fwd_sends_[slot].wait();  // the slot's output is about to be overwritten
        }
        ScopedTimer t(timers_, Section::forward);
        if (before_forward) before_forward(a.micro);
        model_.forward_queued(slot, a.micro, tokens + a.micro * BT, targets + a.micro * BT, B_,
                              T_, head_scale);
        break;
      }
      case ActionKind::send_forward: {
        ScopedTimer t(timers_, Section::pp_comm);
        const float* out = model_.stage_output(slot);
        if (through_host_) {
          float* buf = send_forward_.as<float>() + slot * act;
          model_.kernels().download(buf, out, act * sizeof(float));
          out = buf;
        }
        fwd_sends_[slot] = send_.send(out, act, DType::f32, stage + 1);
        break;
      }
      case ActionKind::recv_backward: {
        ScopedTimer t(timers_, Section::pp_comm);
        receive(model_.grad_stream(), act, stage + 1);
        break;
      }
      case ActionKind::backward: {
        if (before_backward_) before_backward_(a.micro);
        ScopedTimer t(timers_, Section::backward);
        model_.backward(slot, loss_scale_);
        break;
      }
      case ActionKind::send_backward: {
        ScopedTimer t(timers_, Section::pp_comm);
        bwd_sends_[slot].wait();
        float* buf = send_back_.as<float>() + slot * act;
        if (through_host_)
          model_.kernels().download(buf, model_.grad_stream(), act * sizeof(float));
        else
          model_.kernels().copy(buf, model_.grad_stream(), act);
        bwd_sends_[slot] = send_.send(buf, act, DType::f32, stage - 1);
        break;
      }
    }
  }
  ScopedTimer t(timers_, Section::pp_comm);
  for (auto& h : fwd_sends_) h.wait();
  for (auto& h : bwd_sends_) h.wait();
}

}  // namespace meshlm
