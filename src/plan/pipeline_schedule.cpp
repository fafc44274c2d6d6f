#include "plan/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace meshlm {


const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::recv_forward: return "recv_forward";
    case ActionKind::forward: return "forward";
    case ActionKind::send_forward: return "send_forward";
    case ActionKind::recv_backward: return "recv_backward";
    case ActionKind::backward: return "backward";
    case ActionKind::send_backward: return "send_backward";
  }
  return "?";
}

std::vector<Action> build_schedule(PipelineSchedule kind, int stage, int num_stages,
                                   int micro_batches) {
  const int p = num_stages, m = micro_batches;
  const std::string pp = "parallel.pp = " + std::to_string(p);
  const std::string mb = "parallel.micro_batches = " + std::to_string(m);
  if (p < 1) throw CollectiveError(pp + ": need at least 1 stage", MESHLM_HERE);
  if (m < 1) throw CollectiveError(mb + ": need at least 1 micro-batch", MESHLM_HERE);
  // With m < p the warm-up of the early stages takes every micro-batch: the
  // run would be GPipe under another name, idle at least half the step.
  if (kind == PipelineSchedule::one_f_one_b && m < p)
    throw CollectiveError("parallel.schedule = 1f1b needs parallel.micro_batches >= " +
                              std::string("parallel.pp, got ") + mb + ", " + pp +
                              " (raise the micro-batches or use parallel.schedule = gpipe)",
                          MESHLM_HERE);
  // The stage comes from this rank's coordinates, not from the file.
  MESHLM_CHECK(stage >= 0 && stage < p, "stage " + std::to_string(stage) + " of " +
                                            std::to_string(p));

  const bool first = stage == 0, last = stage == p - 1;
  std::vector<Action> out;
  out.reserve(6 * static_cast<size_t>(m));
  auto forward = [&](int i) {
    if (!first) out.push_back({ActionKind::recv_forward, i});
    out.push_back({ActionKind::forward, i});
    if (!last) out.push_back({ActionKind::send_forward, i});
  };
  auto backward = [&](int i) {
    if (!last) out.push_back({ActionKind::recv_backward, i});
    out.push_back({ActionKind::backward, i});
    if (!first) out.push_back({ActionKind::send_backward, i});
  };

  if (kind == PipelineSchedule::gpipe) {
    for (int i = 0; i < m; ++i) forward(i);
    for (int i = 0; i < m; ++i) backward(i);
    return out;
  }

  // 1F1B: stage s runs p - s - 1 forwards ahead so that the backward of
  // micro-batch 0, which starts on the last stage, reaches it just as its
  // pipe is full; from then on each backward frees the slot the next forward
  // takes, which bounds the activations kept to p - s micro-batches.
  const int warmup = std::min(p - stage - 1, m);
  const int steady = m - warmup;
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = 0; i < steady; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int i = steady; i < m; ++i) backward(i);
  return out;
}

std::vector<Action> build_forward_schedule(int stage, int num_stages, int micro_batches) {
  MESHLM_CHECK(num_stages >= 1 && micro_batches >= 1 && stage >= 0 && stage < num_stages,
               "stage " + std::to_string(stage) + " of " + std::to_string(num_stages) + ", " +
                   std::to_string(micro_batches) + " micro-batches");
  std::vector<Action> out;
  out.reserve(3 * static_cast<size_t>(micro_batches));
  for (int i = 0; i < micro_batches; ++i) {
    if (stage > 0) out.push_back({ActionKind::recv_forward, i});
    out.push_back({ActionKind::forward, i});
    if (stage < num_stages - 1) out.push_back({ActionKind::send_forward, i});
  }
  return out;
}

int max_in_flight(const std::vector<Action>& actions) {
  int live = 0, most = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::forward) most = std::max(most, ++live);
    if (a.kind == ActionKind::backward) --live;
  }
  return most;
}

double bubble_fraction(int num_stages, int micro_batches) {
  return static_cast<double>(num_stages - 1) / (micro_batches + num_stages - 1);
}

}  // namespace meshlm
