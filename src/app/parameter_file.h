// The parameter file of `meshlm train`: INI sections read with
// Boost.Program_options, every key overridable on the command line as
// --section.key=value. The option table in config.cpp is the single source of
// every key, its default and its meaning; `meshlm train --help` prints it and
// the README's reference is generated from that output.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt_config.h"

namespace meshlm {

struct TrainConfig {
  int seq_len = 64;            // [model] seq_len: T of every training sequence
  int steps = 100;
  int batch_size = 8;          // sequences per optimizer step
  int micro_batch_size = 0;    // sequences per forward/backward of one rank; 0 = derived
  double lr = 3e-4;
  double lr_min_ratio = 0.1;
  int warmup_steps = 10;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  uint64_t seed = 1337;
  int log_every = 10;
};

struct DataConfig {
  std::string path;           // token file (HDF5 dataset "tokens" or raw)
  std::string tokenize_from;  // text file tokenized into `path` when it is missing
  bool shuffle = true;
};

struct OutputConfig {
  std::string dir = "out";
};

struct RuntimeConfig {
  int threads = 0;  // OpenMP threads per rank; 0 = cores of the node / ranks on it
};

// [parallel] the process mesh and how the step is split over it.
struct ParallelConfig {
  int dp = 0, tp = 1, pp = 1;         // dp * tp * pp = ranks of the job; dp 0 = ranks / (tp * pp)
  int zero_stage = 0;                 // 0, 1 (optimizer sharded over DP), 2 (+ gradients)
  int micro_batches = 0;              // per DP rank and step; 0 = from train.micro_batch_size
  std::string schedule = "1f1b";      // gpipe | 1f1b
  std::string activation_checkpointing = "none";  // none | full
  std::string stage_layers;           // "3,3,2,2"; empty = balanced by cost
  int ranks_per_node = 0;             // > 0 splits each node into groups of this many ranks
};

// [finetune] what trains: the whole model, or LoRA adapters on a frozen base.
struct FinetuneConfig {
  std::string mode = "full";  // full | lora
  int lora_rank = 8;          // r
  double lora_alpha = 16;     // adapters scaled by alpha / r
  std::string lora_targets = "qkv,attn-out,mlp-up,mlp-down";
};

// [quant] the frozen base model under finetune.mode = lora.
struct QuantConfig {
  std::string type = "nf4";    // nf4 | int8 | f32: format of the base's matrices
  std::string share = "node";  // node: one copy per node in shared memory; per_rank: one per rank
  std::string base;            // *.safetensors (Hugging Face GPT-2) | *.h5 (meshlm /params) | "" = GPT-2 init from train.seed
  std::string cache;           // HDF5 quantized-model cache; "" = none
};

// [debug] switches for tests of the failure paths.
struct DebugConfig {
  int fail_rank = -1;  // this rank throws a RankError ...
  int fail_step = 1;   // ... in the forward of this step
};

struct RunConfig {
  GPTConfig model;
  TrainConfig train;
  DataConfig data;
  OutputConfig output;
  RuntimeConfig runtime;
  ParallelConfig parallel;
  FinetuneConfig finetune;
  QuantConfig quant;
  DebugConfig debug;
  std::string source;    // the parameter file, or "(defaults)"
  std::string resolved;  // every key with its final value, as an INI text
};

// Parses the parameter file text (named `source` in messages) and the
// command-line overrides ("--section.key=value" or "--section.key value").
// Throws CollectiveError naming the key or the file on any error; every rank
// that calls it with the same text throws the same error.
// `world_size` (the ranks of the job) resolves parallel.dp = 0.
RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides, int world_size = 1);

// Collective over `job`: rank 0 reads `path`, every rank parses the same
// bytes (so a file visible on one node only still gives one clear error).
RunConfig load_run_config(MPI_Comm job, const std::string& path,
                          const std::vector<std::string>& overrides);

// Every key: "  --model.n_layer arg (=2)  transformer blocks (L)".
std::string run_config_help();

}  // namespace meshlm
