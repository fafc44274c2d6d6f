// Everything a training run is told, as typed values: one struct per section
// of the parameter file, each owned by the layer that uses it (the model's
// shape and LoRA by model/, the layout by plan/, the base weights and their
// quantization by quant/, the rest here). app/parameter_file.cpp fills them
// from the file and the command line and nothing below app/ knows that a
// file exists.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "comm/comm.h"
#include "comm/device_comm.h"
#include "core/enum_names.h"

#include "model/gpt_config.h"
#include "model/gpt_options.h"
#include "model/lora.h"
#include "plan/cost.h"
#include "plan/parallel_config.h"
#include "quant/quant_config.h"
#include "ops/precision.h"
#include "train/adamw.h"
#include "train/loss_scaler.h"

namespace meshlm {

// train.on_nonfinite: what a step whose loss or gradient norm is NaN or
// infinite does. Either way nothing is updated from it.
enum class NonFinite {
  stop,  // the run ends with an error naming the step and the first bad tensor
  skip,  // the step is dropped, counted and logged; train.max_skipped in a row end the run
};
inline constexpr EnumName<NonFinite> kNonFiniteNames[] = {
    {NonFinite::stop, "stop"},
    {NonFinite::skip, "skip"},
};
constexpr std::span<const EnumName<NonFinite>> enum_names(NonFinite) { return kNonFiniteNames; }

// runtime.backend: where a rank computes.
enum class ComputeBackend {
  cpu,   // OpenMP + BLAS on the rank's cores
  cuda,  // the GPU of its node-local rank modulo the node's GPUs (cuBLAS + meshlm's kernels)
  emulated,  // the CPU's kernels behind a GPU's rules, for tests (train/emulated_device.h)
};
inline constexpr EnumName<ComputeBackend> kComputeBackendNames[] = {
    {ComputeBackend::cpu, "cpu"},
    {ComputeBackend::cuda, "cuda"},
    {ComputeBackend::emulated, "emulated"},
};
constexpr std::span<const EnumName<ComputeBackend>> enum_names(ComputeBackend) {
  return kComputeBackendNames;
}

// [train] (and model.seq_len): the optimisation.
struct TrainConfig {
  int seq_len = 64;            // [model] seq_len: T of every training sequence
  int steps = 100;
  int batch_size = 8;          // sequences per optimizer step
  int micro_batch_size = 0;    // sequences per forward/backward of one rank; 0 = derived
  double lr = 3e-4;
  double lr_min_ratio = 0.1;
  int warmup_steps = 10;
  double grad_clip = 1.0;
  AdamWConfig adamw;           // train.beta1, beta2, eps, weight_decay
  int64_t seed = 1337;        // 0 .. 2^63 - 1
  int log_every = 10;
  // Validation: the mean loss over the same held-out windows every this many
  // steps and at the last (0 = never), over this many global batches of
  // held-out windows (train/trainer.cpp, "Evaluation").
  int eval_every = 0;
  int eval_batches = 8;
  NonFinite on_nonfinite = NonFinite::stop;
  int max_skipped = 10;        // consecutive skipped steps that end the run (skip)
  ops::Precision precision = ops::Precision::fp32;  // of the GEMMs' inputs (ops/precision.h)
  // What attention keeps for its backward; resolve_run_config turns auto
  // into probabilities.
  Attention attention = Attention::automatic;
  LossScaleConfig loss_scale;  // fp16 only
};

// [data] the training tokens.
struct DataConfig {
  std::string path;           // token file (HDF5 dataset "tokens" or raw)
  std::string tokenize_from;  // text file tokenized into `path` when it is missing
  bool shuffle = true;
  // Held-out tokens for train.eval_every: a token file (its dataset
  // "val_tokens" when it has one, else read like `path`); "" = `path`'s
  // "val_tokens" dataset, when it has one.
  std::string val_path;
};

struct OutputConfig {
  std::string dir = "out";
  bool overwrite = false;  // a run may replace the run log of an earlier run in dir
};

struct RuntimeConfig {
  int threads = 0;  // OpenMP threads per rank; 0 = from the CPU affinity mask (train/threads.h)
  ComputeBackend backend = ComputeBackend::cpu;
  bool op_timings = false;  // time every op, waiting for the backend around each (ops/timed_kernels.h)
  // No progress of training for this long (seconds) ends the job, naming
  // what was waited for (comm/stall_watchdog.h); 0 = off.
  double stall_timeout_s = 600;
};

// comm.overlap: whether ZeRO 0/1 reduce the DP gradients in buckets during
// the last micro-batch's backward (train/zero.h).
enum class Overlap { automatic, on, off };
inline constexpr EnumName<Overlap> kOverlapNames[] = {
    {Overlap::automatic, "auto"},
    {Overlap::on, "on"},
    {Overlap::off, "off"},
};
constexpr std::span<const EnumName<Overlap>> enum_names(Overlap) { return kOverlapNames; }

// [comm] how ranks exchange data.
struct CommConfig {
  // Reductions above 1 MiB run in meshlm's ring, in pieces through a scratch
  // of at most this many MiB (comm/mpi_comm.h); 0 = MPI's own collectives,
  // whose temporaries no prediction sees.
  int bucket_mb = 32;
  // How a rank waits for its messages (comm/mpi_comm.h); auto = sleep where
  // the node's ranks share cores, poll otherwise.
  comm::WaitPolicy wait = comm::WaitPolicy::automatic;
  // How the CUDA backend's device buffers move between a group's ranks
  // (comm/device_comm.h); the planner's cuda estimates follow it.
  comm::DeviceComm device = comm::DeviceComm::automatic;
  // The DP reduction in buckets of staging_bytes() during the backward: auto
  // = where the dp group is NCCL's (its reductions run beside the compute).
  Overlap overlap = Overlap::automatic;
  // Host staging's buffer of a group, at most (comm/staged_comm.h): bucket_mb
  // MiB, at least 1 MiB.
  size_t staging_bytes() const { return static_cast<size_t>(bucket_mb > 1 ? bucket_mb : 1) << 20; }
};

// [memory] what a rank and a node may use: before anything large is
// allocated, the run is refused when a prediction exceeds a limit.
struct MemoryConfig {
  // Sizes as text: a number of bytes with an optional unit (KiB, MiB, GiB,
  // TiB, or K, M, G, T as SLURM's --mem: powers of 1024; kB, MB, GB, TB:
  // powers of 1000); "" or 0 = no limit. resolve_run_config parses them into
  // the byte counts below.
  std::string limit_per_rank, limit_per_node;
  bool force = false;  // start anyway, with a warning, when a prediction exceeds a limit
  uint64_t rank_limit_bytes = 0, node_limit_bytes = 0;  // 0 = no limit
};
// The bytes of a size as MemoryConfig takes it; CollectiveError naming `key`
// and the text when it is not one.
uint64_t parse_memory_size(const std::string& key, const std::string& text);

// [checkpoint] saving the training state and resuming from it
// (train/checkpoint.h; the file: docs/formats.md, "Checkpoints").
struct CheckpointConfig {
  std::string dir;           // "" = <output.dir>/checkpoints
  int every = 0;             // a checkpoint every this many steps; 0 = none
  double every_minutes = 0;  // ... and when this many minutes passed since the last; 0 = off
  int keep_last = 3;         // older checkpoints of dir removed; 0 = keep all
  bool final = true;         // one at the end of training
  // Written by a background thread from a host snapshot while training
  // goes on; the step waits only for the snapshot (and for a write still in
  // flight from the checkpoint before).
  bool async = false;
  std::string resume = "none";  // none | auto (dir's latest, if any) | a checkpoint file
  std::string adapters_from;  // [finetune] adapters_from: LoRA adapters to start from
  // The directory, with its default resolved (resolve_run_config).
  std::string resolved_dir;
};

// [debug] switches for tests of the failure paths.
struct DebugConfig {
  int fail_rank = -1;  // this rank (-1 = none, else < the job's ranks) throws a RankError ...
  int fail_step = 1;   // ... in the forward of this step
  int nan_step = 0;    // 0 = none; else world rank 0 puts a NaN into its first owned gradient ...
  int nan_count = 1;   // ... in this many steps from nan_step on
  // The checkpoint of step kill_step is cut short: world rank kill_rank
  // kills itself (SIGKILL) at the point kill_in_checkpoint names
  // (train/checkpoint.cpp: kKillPoints); "" = never.
  std::string kill_in_checkpoint;
  int kill_step = 1;
  int kill_rank = 0;
};

struct RunConfig {
  GPTConfig model;
  TrainConfig train;
  DataConfig data;
  OutputConfig output;
  RuntimeConfig runtime;
  CommConfig comm;
  MemoryConfig memory;
  ParallelConfig parallel;
  ClusterConfig cluster;
  FinetuneConfig finetune;
  quant::QuantConfig quant;
  CheckpointConfig checkpoint;
  DebugConfig debug;
  std::string source;    // the parameter file, or "(defaults)"
  std::string resolved;  // every key with its final value, as an INI text
  // parallel.layout = auto: why the planner chose this layout (the lines it
  // printed), stored in run.h5; empty otherwise.
  std::string layout_choice;
};

// Fills the derived values (parallel.dp = 0 from the job's `world_size`;
// train.micro_batch_size and parallel.micro_batches from each other) and
// checks every section and the rules between sections, each by the layer
// that owns it. CollectiveError naming the key(s); every rank given the same
// configuration throws the same error.
void resolve_run_config(RunConfig& c, int world_size);

}  // namespace meshlm
