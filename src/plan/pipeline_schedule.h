// Pipeline-parallel schedules as plain data: for one stage, the ordered list
// of what it does in one optimizer step of m micro-batches. No model, no MPI:
// the trainer walks the list and maps each action to a p2p call or an op, and
// the tests simulate all stages together to show the lists cannot deadlock.
//
// p = parallel.pp stages, m = parallel.micro_batches, stage s in 0..p-1.
// Stage s receives activations from s-1 and gradients from s+1:
//
//   forward i:   recv_forward i (s > 0)      forward i    send_forward i (s < p-1)
//   backward i:  recv_backward i (s < p-1)   backward i   send_backward i (s > 0)
//
// GPipe: F0 F1 .. F(m-1) B0 B1 .. B(m-1). Every stage keeps m micro-batches of
// activations.
//
// 1F1B (PipeDream-flush, the Megatron-LM default): a warm-up of
// w = min(p - s - 1, m) forwards, then m - w rounds of one forward and one
// backward, then w cool-down backwards. Stage s keeps at most p - s
// micro-batches of activations, whatever m is. Example p = 4, m = 6 (F/B only):
//
//   stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
//   stage 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5
//
// Both have the same bubble: with forward and backward of equal duration every
// stage idles (p - 1) / (m + p - 1) of the step; 1F1B only saves memory.
#pragma once

#include <string>
#include <vector>

#include "plan/parallel_config.h"

namespace meshlm {


enum class ActionKind {
  recv_forward,   // activations of the previous stage
  forward,
  send_forward,   // activations to the next stage
  recv_backward,  // gradient of this stage's output, from the next stage
  backward,
  send_backward,  // gradient of this stage's input, to the previous stage
};
const char* action_name(ActionKind kind);

struct Action {
  ActionKind kind;
  int micro;  // micro-batch index, 0..m-1
  bool operator==(const Action&) const = default;
};

// The actions of `stage` (0..num_stages-1) for one optimizer step of
// `micro_batches` micro-batches, in the order the stage must run them.
// CollectiveError (a parameter-file problem, the same on every rank) when
// micro_batches < 1, num_stages < 1, or micro_batches < num_stages under 1F1B.
std::vector<Action> build_schedule(PipelineSchedule kind, int stage, int num_stages,
                                   int micro_batches);

// A forward-only pass (evaluation: the loss, no gradients) of `stage`:
// recv_forward i (s > 0), forward i, send_forward i (s < p-1) for i = 0..m-1,
// whatever the training schedule. No backward frees a slot, so a forward
// reuses slot i % slots once the send of its earlier micro-batch is done.
std::vector<Action> build_forward_schedule(int stage, int num_stages, int micro_batches);

// Largest number of micro-batches whose forward has run and backward has not,
// over the list: how many micro-batches of activations the stage must keep.
int max_in_flight(const std::vector<Action>& actions);

// Idle fraction of every stage when forward and backward take equal time:
// (p - 1) / (m + p - 1), out of a step of 2 (m + p - 1) forward-times.
double bubble_fraction(int num_stages, int micro_batches);

}  // namespace meshlm
