// The training loop: every function here is called by every rank of `job`
// together. The ranks form the process mesh of [parallel] (dp x tp x pp).
#pragma once

#include <mpi.h>

#include <vector>

#include "mesh/mesh.h"
#include "load/base_loader.h"
#include "train/faults.h"
#include "train/run_shape.h"
#include "train/run_config.h"

namespace meshlm {

struct StepRecord {
  int step = 0;
  double loss = 0;          // mean over the step's micro-batches
  double lr = 0;
  double grad_norm = 0;     // before clipping
  double seconds = 0;
  double tokens_per_s = 0;
};

// One evaluation (train.eval_every): the mean held-out loss after `step` steps.
struct EvalRecord {
  int step = 0;
  double loss = 0;
};

struct TrainSummary {
  // Every step, logged or not, but the skipped ones, when run_training was
  // asked for them (tests); a long run keeps none (it would grow by a
  // record a step: run.h5 has the logged ones).
  std::vector<StepRecord> steps;
  // Every evaluation, when run_training was asked for the records.
  std::vector<EvalRecord> evals;
  int trained_steps = 0;          // the steps trained, skipped ones not counted
  int skipped_steps = 0;          // train.on_nonfinite = skip: steps dropped
  int overflow_steps = 0;         // train.precision = fp16: steps skipped as overflowed
  int stopped_by_signal = 0;      // SIGTERM / SIGUSR1 ended training early (a checkpoint was written)
  double loss_scale = 1;          // fp16: the loss scale at the end
  double seconds = 0;
  // The whole model's parameters at the end, in the order of
  // gpt_param_table(cfg.model), on rank 0 when asked for (tests).
  std::vector<float> final_params;
};

// Collective over `job`: prepares the data (tokenizing data.tokenize_from
// when asked), builds and initialises the model, trains train.steps steps,
// prints a line every train.log_every steps and the memory and timing tables
// at the end, and writes <output.dir>/run.h5 on rank 0. Resumes from a
// checkpoint and writes checkpoints as [checkpoint] says (train/checkpoint.h);
// a SIGTERM or SIGUSR1 ends training after the current step with one. A [parallel] layout
// whose dp * tp * pp is not the size of `job` is a CollectiveError.
// `records` = every_step (a test's): keep every step's record and gather the
// final parameters (train/faults.h).
TrainSummary run_training(const RunConfig& cfg, MPI_Comm job,
                          debug::Records records = debug::Records::none);

}  // namespace meshlm
