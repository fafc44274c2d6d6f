#include "app/parameter_file.h"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <type_traits>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string_view>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/enum_names.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "core/suggest.h"
#include "load/hf_dir.h"
#include "load/model_meta.h"
#include "plan/partition.h"
#include "train/loss_scaler.h"

namespace po = boost::program_options;

namespace meshlm {

// ---- values the parameter file binds directly -----------------------------------
//
// Boost.Program_options converts each value through validate(), found by
// argument-dependent lookup in the namespace of the value's type. These
// overloads bind every keyword enum through its name table, and the two
// list types through their parsers; a bad value is a po::error that names
// the key (po fills in the option) and lists what is accepted.

namespace {
// "the argument ('zigzag') for option 'parallel.schedule' is invalid; use one of gpipe | 1f1b"
class BadValue : public po::error_with_option_name {
public:
  BadValue(const std::string& value, const std::string& hint)
      : po::error_with_option_name("the argument ('%value%') for option '%canonical_option%' is "
                                   "invalid; %hint%") {
    set_substitute("value", value);
    set_substitute("hint", hint);  // not in the template: it may quote the value (message_of)
  }
};
}  // namespace

template <NamedEnum E>
void validate(boost::any& v, const std::vector<std::string>& values, E*, int) {
  po::validators::check_first_occurrence(v);
  const std::string& s = po::validators::get_single_string(values);
  const std::optional<E> e = enum_from_name<E>(s);
  if (!e) throw BadValue(s, "use one of " + enum_choices<E>());
  v = *e;
}

namespace {
// "qkv, attn-out, ...": the linear layers of a block of `arch`.
std::string slot_choices(ModelArch arch) {
  std::string out;
  for (const EnumName<LinearSlot>& n : kLinearSlotNames)
    if (LinearSlots::of(arch).has(n.value)) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}
}  // namespace

void validate(boost::any& v, const std::vector<std::string>& values, LinearSlots*, int) {
  po::validators::check_first_occurrence(v);
  const std::string& s = po::validators::get_single_string(values);
  LinearSlots slots;
  std::string bad;
  if (!parse_slots(s, slots, bad))
    throw BadValue(s, "unknown target '" + bad + "' (a comma-separated list of " +
                          slot_choices(ModelArch::gpt2) + ")");
  v = slots;
}

void validate(boost::any& v, const std::vector<std::string>& values, StageLayers*, int) {
  po::validators::check_first_occurrence(v);
  const std::string& s = po::validators::get_single_string(values);
  StageLayers layers;
  std::string why;
  if (!parse_layer_list(s, layers.layers, why)) throw BadValue(s, why);
  v = layers;
}

namespace quant {
using meshlm::validate;  // for QuantType and ShareMode, which live here
}
namespace ops {
using meshlm::validate;  // for Precision
}
namespace comm {
using meshlm::validate;  // for WaitPolicy
}

namespace {

// The text of a value as a user would write it: 0.1, not 0.10000000000000001.
std::string text_of(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
std::string text_of(bool v) { return v ? "true" : "false"; }
std::string text_of(const std::string& v) { return v; }
std::string text_of(LinearSlots v) { return slots_text(v); }
std::string text_of(const StageLayers& v) { return layers_text(v.layers); }
template <NamedEnum E>
std::string text_of(E v) { return name_of(v); }
template <typename T>
  requires std::is_arithmetic_v<T>
std::string text_of(T v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw CollectiveError(msg, MESHLM_HERE); }

// The values a numeric key accepts: from lo to hi, each end included unless
// marked open. Integer keys print their bounds as integers.
struct Range {
  double lo, hi;
  bool lo_open = false, hi_open = false;
  bool integer = true;

  static Range ints(double lo, double hi) { return {lo, hi}; }
  static Range reals(double lo, double hi, bool lo_open = false, bool hi_open = false) {
    return {lo, hi, lo_open, hi_open, false};
  }
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string text() const {
    auto num = [&](double v) -> std::string {
      if (!integer) return text_of(v);
      return v >= 0x1p63 ? "2^63 - 1" : std::to_string(static_cast<long long>(v));
    };
    return std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
  }
};

// The option table. add() binds one key to its field, with the field's
// current value as the default, and remembers how to print the field, so
// that the parser, --help and the resolved configuration can never disagree.
constexpr unsigned kHelpWidth = 100;  // columns of --help

class OptionTable {
public:
  po::options_description& section(const std::string& title) {
    sections_.emplace_back(std::make_unique<po::options_description>(title, kHelpWidth, kHelpWidth / 2));
    return *sections_.back();
  }
  template <typename T>
  void add(po::options_description& sec, const char* key, T* field, const std::string& help) {
    const std::string shown = text_of(*field);
    sec.add_options()(key, po::value(field)->default_value(*field, shown.empty() ? "\"\"" : shown),
                      help.c_str());
    printers_.emplace_back(key, [field] { return text_of(*field); });
    if constexpr (std::is_same_v<T, bool>) bool_keys_.insert(key);
  }
  // Program_options reads an empty value of a bool key as true: for meshlm
  // it is a value of the wrong type, as an empty number is.
  void check_bool_value(const std::string& where, const std::string& key, const std::string& value) const {
    if (value.empty() && bool_keys_.count(key))
      fail(where + key + " has an empty value: give true or false");
  }
  // A numeric key and the values it accepts (shown at the end of its help).
  // Floating-point keys must also be finite.
  template <typename T>
    requires std::is_arithmetic_v<T>
  void add(po::options_description& sec, const char* key, T* field, const std::string& help,
           const Range& range) {
    add(sec, key, field, help + " " + range.text());
    checks_.emplace_back([key, field, range] {
      const double v = static_cast<double>(*field);
      if (std::is_floating_point_v<T> && !std::isfinite(v))
        fail(std::string(key) + " = " + text_of(*field) + ": must be a finite number in " +
             range.text());
      if (!range.contains(v))
        fail(std::string(key) + " = " + text_of(*field) + ": must lie in " + range.text());
    });
  }
  // Every key's range (after the file and the command line are read).
  void check() const {
    for (const auto& c : checks_) c();
  }
  po::options_description all() const {
    po::options_description a(kHelpWidth, kHelpWidth / 2);
    for (const auto& s : sections_) a.add(*s);
    return a;
  }
  // "key = value" per key, grouped by section, as an INI text.
  std::string ini() const {
    std::string out, current;
    for (const auto& [key, print] : printers_) {
      const std::string k(key), section = k.substr(0, k.find('.'));
      if (section != current) out += "[" + section + "]\n";
      current = section;
      out += k.substr(k.find('.') + 1) + " = " + print() + "\n";
    }
    return out;
  }

private:
  std::vector<std::unique_ptr<po::options_description>> sections_;
  std::vector<std::pair<const char*, std::function<std::string()>>> printers_;
  std::vector<std::function<void()>> checks_;
  std::set<std::string> bool_keys_;
};

// "nf4 (4.127 bits/weight) | int8 (8.5) | f32 (32)"
std::string quant_type_help() {
  std::string s;
  for (const quant::QuantFormat& f : quant::kQuantFormats) {
    if (!s.empty()) s += " | ";
    s += fmt::format("{} ({:.4g}{})", f.name, f.bits_per_weight, s.empty() ? " bits/weight" : "");
  }
  return s;
}

// Upper bounds of the sizes: beyond them a value cannot make sense on any
// machine, and below them every element count of one tensor fits in 64 bits
// (the byte counts of a configuration as a whole are checked again by
// resolve_run_config).
constexpr double kMaxLayers = 1024, kMaxHeads = 4096, kMaxChannels = 1 << 17;
constexpr double kMaxVocabulary = 1 << 24, kMaxSequence = 1 << 20, kMaxBatch = 1 << 20;
constexpr double kMaxRanks = 1 << 24, kMaxThreads = 4096, kMaxInt = 2147483647;
constexpr double kMaxSeed = 9223372036854775807.0;  // 2^63 - 1 (rounds to 2^63 as a double)
constexpr double kMaxLossScale = LossScaler::kMax;

// The keys of [model] and [train]: the architecture and the optimisation.
void add_model_and_train_options(RunConfig& c, OptionTable& t) {
  auto& model = t.section("[model] the architecture: GPT-2 or a Llama-family model");
  t.add(model, "model.n_layer", &c.model.n_layer, "transformer blocks (L)",
        Range::ints(1, kMaxLayers));
  t.add(model, "model.n_head", &c.model.n_head, "attention heads (NH); must divide n_embd",
        Range::ints(1, kMaxHeads));
  t.add(model, "model.n_embd", &c.model.n_embd, "channels (C)",
        Range::ints(1, kMaxChannels));
  t.add(model, "model.vocab_size", &c.model.vocab_size, "vocabulary (V); padded to a multiple of 64 inside; 256 for byte-level data",
        Range::ints(2, kMaxVocabulary));
  t.add(model, "model.seq_len", &c.train.seq_len, "training sequence length (T); at most max_seq_len",
        Range::ints(1, kMaxSequence));
  t.add(model, "model.max_seq_len", &c.model.max_seq_len, "rows of the position table wpe; at least seq_len (GPT-2 uses 1024)",
        Range::ints(1, kMaxSequence));
  t.add(model, "model.arch", &c.model.arch, enum_choices<ModelArch>() + ": the model family; llama = RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU, no biases (the keys below), on every backend and layout");
  t.add(model, "model.n_kv_head", &c.model.n_kv_head, "llama: key/value heads (grouped-query attention), dividing n_head; 0 = n_head",
        Range::ints(0, kMaxHeads));
  t.add(model, "model.intermediate_size", &c.model.intermediate_size, "llama: the SwiGLU MLP's width; 0 = 4 n_embd",
        Range::ints(0, kMaxChannels * 8));
  t.add(model, "model.norm_eps", &c.model.norm_eps, "llama: RMSNorm's eps",
        Range::reals(0, 1, true));
  t.add(model, "model.rope_theta", &c.model.rope_theta, "llama: the rotary embeddings' base",
        Range::reals(1, 1e12, true));
  t.add(model, "model.rope_factor", &c.model.rope_scaling.factor, "llama: Llama 3's rope scaling factor (0 = no scaling)",
        Range::reals(0, 1e6));
  t.add(model, "model.rope_low_freq_factor", &c.model.rope_scaling.low_freq_factor, "llama: Llama 3's rope scaling, low_freq_factor",
        Range::reals(0, 1e6, true));
  t.add(model, "model.rope_high_freq_factor", &c.model.rope_scaling.high_freq_factor, "llama: Llama 3's rope scaling, high_freq_factor",
        Range::reals(0, 1e6, true));
  t.add(model, "model.rope_original_max_positions", &c.model.rope_scaling.original_max_positions, "llama: Llama 3's rope scaling, the original context (original_max_position_embeddings)",
        Range::ints(1, kMaxSequence));
  t.add(model, "model.tie_word_embeddings", &c.model.tie_word_embeddings, "llama: the classifier is the token embedding (false: a classifier lm_head of its own)");
  auto& train = t.section("[train] optimisation");
  t.add(train, "train.steps", &c.train.steps, "optimizer steps",
        Range::ints(1, kMaxInt));
  t.add(train, "train.batch_size", &c.train.batch_size, "sequences per optimizer step",
        Range::ints(1, kMaxBatch));
  t.add(train, "train.micro_batch_size", &c.train.micro_batch_size, "sequences per forward/backward of one rank; gradients accumulate over batch_size / (dp * micro_batch_size) micro-batches; 0 = batch_size / (dp * parallel.micro_batches)",
        Range::ints(0, kMaxBatch));
  t.add(train, "train.lr", &c.train.lr, "peak learning rate",
        Range::reals(0, 10, true));
  t.add(train, "train.lr_min_ratio", &c.train.lr_min_ratio, "final learning rate of the cosine decay, as a fraction of lr",
        Range::reals(0, 1));
  t.add(train, "train.warmup_steps", &c.train.warmup_steps, "steps of linear warmup before the cosine decay",
        Range::ints(0, kMaxInt));
  t.add(train, "train.weight_decay", &c.train.adamw.weight_decay, "AdamW decoupled weight decay (matrices only)",
        Range::reals(0, 100));
  t.add(train, "train.grad_clip", &c.train.grad_clip, "clip the global gradient norm to this; 0 = off",
        Range::reals(0, 1e30));
  t.add(train, "train.beta1", &c.train.adamw.beta1, "AdamW beta1",
        Range::reals(0, 1, false, true));
  t.add(train, "train.beta2", &c.train.adamw.beta2, "AdamW beta2",
        Range::reals(0, 1, false, true));
  t.add(train, "train.eps", &c.train.adamw.eps, "AdamW epsilon",
        Range::reals(0, 1, true));
  t.add(train, "train.seed", &c.train.seed, "seed of weight init and data shuffling; same seed, same run, bit for bit",
        Range::ints(0, kMaxSeed));
  t.add(train, "train.log_every", &c.train.log_every, "print and record metrics every this many steps (and at the last)",
        Range::ints(1, kMaxInt));
  t.add(train, "train.eval_every", &c.train.eval_every, "validation: every this many steps, and at the last, print and record (run.h5 metrics/val_loss, val_step) the mean loss over the same held-out windows, forward only; needs data.val_path or a dataset /val_tokens in data.path; 0 = off",
        Range::ints(0, kMaxInt));
  t.add(train, "train.eval_batches", &c.train.eval_batches, "validation: global batches per evaluation: the first eval_batches x batch_size windows of the held-out tokens, in file order (read around again from the start when the held-out tokens have fewer), each batch split over the ranks like a training batch",
        Range::ints(1, kMaxInt));
  t.add(train, "train.on_nonfinite", &c.train.on_nonfinite, "a step whose loss or gradient norm is NaN or infinite: " + enum_choices<NonFinite>() + " (stop: the run ends naming the step and the first tensor whose gradient is not finite; skip: the step is dropped, nothing is updated, and it is counted and logged)");
  t.add(train, "train.max_skipped", &c.train.max_skipped, "under on_nonfinite = skip, this many skipped steps in a row end the run",
        Range::ints(1, kMaxInt));
  t.add(train, "train.precision", &c.train.precision, "number format of every GEMM's inputs: " + enum_choices<ops::Precision>() + " (fp32: exact, TF32 off on a GPU; bf16 and fp16: each GEMM reads its inputs rounded to 16 bits and accumulates in fp32, while master weights, AdamW moments and the other ops stay fp32; the CPU backend emulates the rounding; fp16 scales the loss dynamically)");
  t.add(train, "train.loss_scale", &c.train.loss_scale.initial, "under precision = fp16: the first loss scale; a step whose scaled gradients overflow is skipped and counted, and the scale halves",
        Range::reals(1, kMaxLossScale));
  t.add(train, "train.loss_scale_window", &c.train.loss_scale.window, "under precision = fp16: the loss scale doubles after this many steps in a row without overflow (up to 2^32)",
        Range::ints(1, kMaxInt));
  t.add(train, "train.attention", &c.train.attention, "what causal attention keeps for its backward: " + enum_choices<Attention>() + " (probabilities: the (B, n_head, T, T) softmax probabilities of every layer; flash: one log-sum-exp per row of a head, T times fewer floats, and the backward recomputes the probabilities a block at a time; on a GPU one fused kernel, where it needs train.precision = bf16 or fp16 and a head size of 16, 32, 64 or 128; auto: probabilities)");
}

// The keys of [data], [output], [runtime], [comm], [memory]: what the run reads, writes and runs on.
void add_run_options(RunConfig& c, OptionTable& t) {
  auto& data = t.section("[data] training tokens");
  t.add(data, "data.path", &c.data.path, "token file: HDF5 with dataset 'tokens' (uint16/uint32) or meshlm raw tokens (required)");
  t.add(data, "data.tokenize_from", &c.data.tokenize_from, "text file tokenized byte-level into data.path when data.path does not exist");
  t.add(data, "data.shuffle", &c.data.shuffle, "visit sequences in a seeded random order (true) or in file order (false)");
  t.add(data, "data.val_path", &c.data.val_path, "held-out tokens for train.eval_every: a token file like data.path (its dataset 'val_tokens' when it has one, else its tokens); empty = data.path's dataset 'val_tokens' (meshlm tokenize --val-fraction) when it has one; never the training tokens themselves");
  auto& output = t.section("[output] results");
  t.add(output, "output.dir", &c.output.dir, "directory of run.h5 (metrics, memory, timing, resolved configuration)");
  t.add(output, "output.overwrite", &c.output.overwrite, "replace the run log of an earlier run in output.dir, and let a fresh run (checkpoint.resume = none) write over the checkpoints of an earlier run in checkpoint.dir (false: either is an error); a file named run.h5 that is not a meshlm run log, a step_*.h5 that is not a meshlm checkpoint and a `latest` that is not meshlm's are never replaced");
  auto& runtime = t.section("[runtime] the process");
  t.add(runtime, "runtime.threads", &c.runtime.threads, "OpenMP/BLAS threads per rank; 0 = the cores of the rank's CPU affinity mask, shared with the ranks of its node whose masks overlap it",
        Range::ints(0, kMaxThreads));
  t.add(runtime, "runtime.op_timings", &c.runtime.op_timings, "time every op of the step (GEMMs, attention, LayerNorm, the optimizer, ...) and print a table of them at the end, min / avg / max over ranks; each op waits for the backend before and after it, so a timed run is slower and its ops do not overlap");
  t.add(runtime, "runtime.stall_timeout_s", &c.runtime.stall_timeout_s, "seconds without progress of training (no message or collective completed, no step ended, no block of a checkpoint written) after which a rank ends the job with exit status 3, printing what it waited for (an operation and the rank or ranks) and which ranks of its node have stopped running (SIGSTOP, a frozen process) or work outside communication; watched from the first step to the last checkpoint; must exceed the longest stretch between two messages (about one stage's forward or backward of a micro-batch, or a checkpoint's slowest block); 0 = off",
        Range::reals(0, 1e7));
  t.add(runtime, "runtime.backend", &c.runtime.backend, enum_choices<ComputeBackend>() + " (cuda: each rank computes on the GPU of its node-local rank modulo the node's GPUs, at train.precision, in any layout; full training or LoRA; emulated: the CPU's kernels behind the GPU's rules, device buffers in memory the host cannot touch between ops, for testing the GPU code paths on a machine without one; slow)");
  auto& comm = t.section("[comm] how ranks exchange data");
  t.add(comm, "comm.bucket_mb", &c.comm.bucket_mb, "reductions over ranks (gradients over dp, activations over tp, the tied embedding over pp) of more than 1 MiB run in meshlm's own ring of point-to-point messages, in pieces through one scratch buffer of at most this many MiB per rank (the comm row of the memory table); 0 = MPI's own collectives, whose temporaries (up to the message size, and more on a root) no prediction sees",
        Range::ints(0, 65536));
  t.add(comm, "comm.wait", &c.comm.wait, enum_choices<comm::WaitPolicy>() + ": how a CPU rank waits for its messages: poll keeps its core busy (Open MPI's MPI_Wait, the lowest latency); sleep tests and sleeps between tests (20 us doubling to 0.5 ms), giving its core to the ranks that share it; auto = sleep where a node's ranks share cores (ranks x runtime.threads above the cores of their affinity masks), poll otherwise. The planner's pipeline times assume the same");
  t.add(comm, "comm.device", &c.comm.device, enum_choices<comm::DeviceComm>() + ": how runtime.backend = cuda (or emulated) moves device buffers between the ranks of a group: nccl GPU to GPU (NCCL refuses two ranks on one GPU: an error then), host through host memory and MPI in pieces of at most comm.bucket_mb MiB (comm/staged_comm.h), auto = group by group, nccl for a group of two or more ranks that each have a GPU of their own and host for one in which two ranks share a GPU or a group of one rank, which moves nothing (each rank's line says which its groups took); the CPU backend's buffers are host memory, which MPI moves under any value. Under NCCL (cuda/nccl_comm.h) the pipeline's activations go over a pair of NCCL communicators per neighbouring stages (comm/pipeline_links.h). On runtime.backend = emulated, nccl is an emulation of NCCL's stream order by MPI (comm/ordered_comm.h), for testing, and its GPUs are cluster.gpus_per_node's. meshlm plan resolves each group as train does: NCCL's groups with the DP reduction overlapped with the backward, staged ones not overlapped, copied to the host and back");
  t.add(comm, "comm.overlap", &c.comm.overlap, enum_choices<Overlap>() + ": under ZeRO 0 and 1 with dp > 1, reduce the gradients over dp in buckets of whole layers of at least comm.bucket_mb MiB (1 MiB at least), each as soon as the last micro-batch's backward has finished its layers, while the backward of the layers below runs; the tensors outside the layers (embeddings, final norm) after the backward. on: always; off: after the backward, in one reduction (all-reduce under ZeRO 0, reduce-scatter under ZeRO 1); auto: on where the dp group is NCCL's (comm.device = nccl), whose reductions run on their own stream beside the compute, off elsewhere (MPI's and host staging's reductions finish where they are issued). ZeRO 2 reduces layer by layer always");
  auto& memory = t.section("[memory] limits, checked against the prediction before anything large is allocated");
  t.add(memory, "memory.limit_per_rank", &c.memory.limit_per_rank, "the most a rank may use (its predicted peak: the runtime's part plus its largest phase; e.g. 80GiB, 512M, 4e9; K M G T and KiB MiB GiB TiB are powers of 1024, kB MB GB TB of 1000); a rank predicted above it refuses to start, naming the rank and its bytes per category; empty = no limit");
  t.add(memory, "memory.limit_per_node", &c.memory.limit_per_node, "the most the ranks of one node may use together: the node's predicted peak of its ranks' summed PSS (the node's shared quantized base and the libraries counted once); empty = no limit");
  t.add(memory, "memory.force", &c.memory.force, "start even when a prediction exceeds memory.limit_per_rank, memory.limit_per_node or the node's physical memory (with a warning naming them)");
}

// The keys of [parallel] and [cluster]: the mesh, and the machines as the planner sees them.
void add_parallel_options(RunConfig& c, OptionTable& t) {
  auto& parallel = t.section("[parallel] the process mesh: ranks = dp * tp * pp");
  t.add(parallel, "parallel.layout", &c.parallel.layout, enum_choices<LayoutChoice>() + " (auto: meshlm train takes the layout that meshlm plan ranks fastest among those that fit memory.limit_per_rank and memory.limit_per_node (unset: on the CPU the node's memory / its ranks and the node's memory; on CUDA no limit per rank, so set memory.limit_per_rank to the GPU's memory), searching dp, tp, pp, zero_stage, micro_batches with train.micro_batch_size (the file's is replaced), activation_checkpointing and schedule; a key of this section given explicitly (dp, tp, pp, micro_batches: not as 0) holds its value in the search; the choice and why are printed and stored in run.h5 (attribute layout_choice))");
  t.add(parallel, "parallel.dp", &c.parallel.dp, "data-parallel replicas, each reading its own slice of every batch; 0 = ranks / (tp * pp)",
        Range::ints(0, kMaxRanks));
  t.add(parallel, "parallel.tp", &c.parallel.tp, "tensor-parallel ranks (Megatron); must divide n_head and the padded vocabulary",
        Range::ints(1, kMaxHeads));
  t.add(parallel, "parallel.pp", &c.parallel.pp, "pipeline stages; at most n_layer",
        Range::ints(1, kMaxLayers));
  t.add(parallel, "parallel.zero_stage", &c.parallel.zero_stage, "0 = replicated optimizer; 1 = AdamW moments sharded over dp; 2 = gradients sharded too",
        Range::ints(0, 2));
  t.add(parallel, "parallel.micro_batches", &c.parallel.micro_batches, "micro-batches per step and dp rank (pipeline and accumulation); 0 = batch_size / (dp * micro_batch_size)",
        Range::ints(0, kMaxBatch));
  t.add(parallel, "parallel.schedule", &c.parallel.schedule, "pipeline schedule: " + enum_choices<PipelineSchedule>() + " (1f1b needs micro_batches >= pp)");
  t.add(parallel, "parallel.activation_checkpointing", &c.parallel.activation_checkpointing, enum_choices<Checkpointing>() + " (full: keep each layer's input, recompute the layer in backward)");
  t.add(parallel, "parallel.stage_layers", &c.parallel.stage_layers, "layers per pipeline stage, e.g. 3,3,2,2; empty = balanced by cost (embedding and head included)");
  t.add(parallel, "parallel.ranks_per_node", &c.parallel.ranks_per_node, "split each node's ranks into groups of this many, as if they were nodes (tests); 0 = real nodes",
        Range::ints(0, kMaxRanks));
  auto& cluster = t.section("[cluster] the machines, as the planner sees them (meshlm plan, parallel.layout = auto; docs/planner.md); 0 or empty = the rates file's figure, else the preset's");
  t.add(cluster, "cluster.preset", &c.cluster.preset, enum_choices<ClusterPreset>() + " (cpu-node: 40 GFLOP/s per core shared by the node's ranks, 5 GB/s and 2 us between ranks of a node, 10 GB/s and 5 us between nodes; h100-ib: 8 H100 per node, 103 TFLOP/s per GPU (meshlm's bf16 step at 32 x 1024 rows; 0.45 of it at 1024 rows, by the measured curve), NVLink 300 GB/s and 3 us, InfiniBand NDR 50 GB/s per GPU and 5 us; auto: cpu-node on runtime.backend = cpu, h100-ib on cuda)");
  t.add(cluster, "cluster.rates", &c.cluster.rates, "a JSON file of meshlm plan --calibrate (GEMM rate, memory bandwidth, MPI bandwidth and latency, a rank's runtime memory, measured on this machine); its figures replace the preset's");
  t.add(cluster, "cluster.gflops_per_rank", &c.cluster.gflops_per_rank, "one rank's GEMM rate in GFLOP/s", Range::reals(0, 1e9));
  t.add(cluster, "cluster.intra_node_gbps", &c.cluster.intra_node_gbps, "bandwidth between two ranks of a node, GB/s", Range::reals(0, 1e6));
  t.add(cluster, "cluster.inter_node_gbps", &c.cluster.inter_node_gbps, "bandwidth of a rank to another node, GB/s", Range::reals(0, 1e6));
  t.add(cluster, "cluster.intra_node_latency_us", &c.cluster.intra_node_latency_us, "latency of a message within a node, microseconds", Range::reals(0, 1e6));
  t.add(cluster, "cluster.inter_node_latency_us", &c.cluster.inter_node_latency_us, "latency of a message between nodes, microseconds", Range::reals(0, 1e6));
  t.add(cluster, "cluster.gpus_per_node", &c.cluster.gpus_per_node, "GPUs of a node: meshlm plan's (runtime.backend = cuda: rank r computes on GPU (its node-local rank) mod this, and ranks that share one stage their groups through the host under comm.device = auto; 0 = the preset's, h100-ib: 8), and the emulated device's in train and plan (runtime.backend = emulated: the same rule; 0 = a GPU per rank). train on cuda takes the node's devices as the driver counts them", Range::ints(0, 4096));
  t.add(cluster, "cluster.runtime_per_rank", &c.cluster.runtime_per_rank, "a rank's resident memory outside meshlm's buffers (code, libraries, MPI, heap), a size as memory.limit_per_rank (cpu-node: 40MiB; h100-ib: 512MiB of host)");
  t.add(cluster, "cluster.runtime_pss_per_rank", &c.cluster.runtime_pss_per_rank, "its part of the node's memory, shared pages split between the ranks mapping them (cpu-node: 25MiB; h100-ib: 512MiB)");
  t.add(cluster, "cluster.device_runtime", &c.cluster.device_runtime, "device memory a CUDA rank holds outside meshlm's buffers: context, cuBLAS (600MiB; 597 MiB measured on an H100)");
}

// The keys of [finetune], [quant], [checkpoint]: what trains, the base, the saved state.
void add_finetune_options(RunConfig& c, OptionTable& t) {
  auto& finetune = t.section("[finetune] what trains");
  t.add(finetune, "finetune.mode", &c.finetune.mode, enum_choices<FinetuneMode>() + ": full = every parameter trains; lora = LoRA adapters on a frozen, quantized base ([quant])");
  t.add(finetune, "finetune.lora_rank", &c.finetune.lora_rank, "LoRA rank r",
        Range::ints(1, kMaxChannels));
  t.add(finetune, "finetune.lora_alpha", &c.finetune.lora_alpha, "LoRA alpha: adapters are scaled by alpha / r",
        Range::reals(0, 1e6, true));
  t.add(finetune, "finetune.lora_targets", &c.finetune.lora_targets, "matrices with adapters, comma-separated: " + slot_choices(ModelArch::gpt2));
  auto& quant = t.section("[quant] the base model: its weights and, under LoRA, their quantization");
  t.add(quant, "quant.type", &c.quant.type, "format of the base's matrices: " + quant_type_help() + "; vectors stay f32");
  t.add(quant, "quant.share", &c.quant.share, enum_choices<quant::ShareMode>() + ": node = quantized once on rank 0, one copy per node in MPI shared memory; per_rank = every rank loads and quantizes its own copy");
  t.add(quant, "quant.broadcast", &c.quant.broadcast, enum_choices<quant::BaseBroadcast>() + ": under LoRA with quant.share = node, how the node leaders (node-local rank 0 of each node) receive the quantized base from rank 0: mpi = MPI_Bcast straight into each node's shared window; nccl = through the leaders' GPUs (runtime.backend = cuda, or emulated, whose NCCL is an emulation): rank 0 uploads a chunk of comm.bucket_mb MiB, NCCL broadcasts it between the leaders' GPUs (each on a GPU of its own), each leader copies it into its node's window, next chunk (the chunk is a leader's device memory while the base loads, category quantized)");
  t.add(quant, "quant.base", &c.quant.base, "base weights: a Hugging Face model directory, GPT-2 or Llama (config.json, whose model.arch and shape the [model] keys take, and model.safetensors or the shards of model.safetensors.index.json), *.safetensors (Hugging Face GPT-2 names) or *.h5 (meshlm /params/<name>; a checkpoint's /meta gives the [model] keys as a directory's config.json does); empty = the model's initialisation from train.seed. With finetune.mode = full the whole model starts from them (fp32, nothing quantized)");
  t.add(quant, "quant.cache", &c.quant.cache, "HDF5 quantized-model cache: loaded when it matches the base and settings, (re)written otherwise; empty = none");
  t.add(finetune, "finetune.adapters_from", &c.checkpoint.adapters_from, "a checkpoint of a LoRA run whose adapters (/lora) start this fine-tune (step 0, fresh optimizer); its model, rank and targets must match; empty = adapters initialised from train.seed");
  auto& ckpt = t.section("[checkpoint] saving the training state, and resuming from it (docs/formats.md)");
  t.add(ckpt, "checkpoint.dir", &c.checkpoint.dir, "directory of the checkpoints (step_<8 digits>.h5) and of the file 'latest' naming the newest; empty = <output.dir>/checkpoints");
  t.add(ckpt, "checkpoint.every", &c.checkpoint.every, "write a checkpoint every this many steps; 0 = none but the final (and those of every_minutes and of a preemption signal)",
        Range::ints(0, kMaxInt));
  t.add(ckpt, "checkpoint.every_minutes", &c.checkpoint.every_minutes, "also write one when this many minutes have passed since the start or the last; 0 = off",
        Range::reals(0, 1e7));
  t.add(ckpt, "checkpoint.keep_last", &c.checkpoint.keep_last, "keep this many newest checkpoints in checkpoint.dir and remove older meshlm checkpoints there; 0 = keep all",
        Range::ints(0, kMaxInt));
  t.add(ckpt, "checkpoint.final", &c.checkpoint.final, "write a checkpoint at the end of training");
  t.add(ckpt, "checkpoint.async", &c.checkpoint.async, "write checkpoints from a background thread: training waits only while the state is copied to a host snapshot (kept for the run, memory category checkpoint) and for a write of the checkpoint before that is still going on");
  t.add(ckpt, "checkpoint.resume", &c.checkpoint.resume, "where training starts: none = fresh; auto = from the checkpoint that checkpoint.dir/latest names, or fresh when there is none (a requeued job); or the path of a checkpoint file. Any layout resumes any checkpoint; the model must match");
}

// The keys of [debug]: failure injection for tests.
void add_debug_options(RunConfig& c, OptionTable& t) {
  auto& debug = t.section("[debug] failure injection for tests");
  t.add(debug, "debug.fail_rank", &c.debug.fail_rank, "this rank throws an error in the forward of debug.fail_step; -1 = none",
        Range::ints(-1, kMaxRanks));
  t.add(debug, "debug.nan_step", &c.debug.nan_step, "from this step on (0 = never), world rank 0 puts a NaN into the first gradient it owns",
        Range::ints(0, kMaxInt));
  t.add(debug, "debug.nan_count", &c.debug.nan_count, "the number of steps debug.nan_step poisons",
        Range::ints(1, kMaxInt));
  t.add(debug, "debug.fail_step", &c.debug.fail_step, "the step at which debug.fail_rank fails",
        Range::ints(1, kMaxInt));
  t.add(debug, "debug.kill_in_checkpoint", &c.debug.kill_in_checkpoint, "debug.kill_rank kills itself (SIGKILL) while the checkpoint of debug.kill_step is written, at: create (the file made, nothing written) | tensors (half the datasets written) | checksums (the data written, no checksum yet) | rename (complete, not yet renamed) | latest (renamed, 'latest' not yet moved); empty = never");
  t.add(debug, "debug.kill_step", &c.debug.kill_step, "the step whose checkpoint debug.kill_in_checkpoint cuts short",
        Range::ints(1, kMaxInt));
  t.add(debug, "debug.kill_rank", &c.debug.kill_rank, "the world rank debug.kill_in_checkpoint kills",
        Range::ints(0, kMaxRanks));
}

// Every key, section by section, in the order of --help.
void make_options(RunConfig& c, OptionTable& t) {
  add_model_and_train_options(c, t);
  add_run_options(c, t);
  add_parallel_options(c, t);
  add_finetune_options(c, t);
  add_debug_options(c, t);
}

// The message of a Program_options error. Boost (1.74) builds it in what()
// by replacing each "%name%" of a template with the name's text until none is
// left, so a value that itself holds such a token ("lr = %value%") never
// ends. Its texts are escaped for what() ('%' -> "\1p", '\1' -> "\1e") and
// restored in the message.
struct PoTexts : po::error_with_option_name {
  static std::map<std::string, std::string>& of(po::error_with_option_name& e) {
    return e.*(&PoTexts::m_substitutions);  // a protected member, through a pointer to it
  }
};
// The value a message quotes is cut to this many bytes before the message is
// made, so that the key named after it ("... for option 'train.lr' is
// invalid") survives the cut of the whole message (kMaxMessage).
constexpr size_t kMaxQuotedValue = 64;

// What an unknown key was probably meant to be: "; it is a key of [model]:
// ..." for a section's key written before any section (or without its
// section on the command line), "; did you mean 'model.n_layer'?" for a key
// near a known one (core/suggest.h), else "".
std::string key_hint(std::string_view key, const po::options_description& desc) {
  std::vector<std::string> names, sections;
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    names.push_back(name);
    const size_t dot = name.find('.');
    if (key.find('.') == std::string_view::npos && dot != std::string::npos &&
        std::string_view(name).substr(dot + 1) == key)
      sections.push_back(name.substr(0, dot));
  }
  if (sections.empty()) return did_you_mean(key, names);
  std::string list;
  for (const std::string& sec : sections) list += (list.empty() ? "[" : ", [") + sec + "]";
  return "; it is a key of " + list + ": write it under its section in a file, as " + sections[0] +
         "." + std::string(key) + " on the command line";
}

std::string message_of(const po::error& e) {
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  if (!named) return e.what();
  auto escape = [](const std::string& s, bool percent) {
    std::string out;
    for (char ch : s) {
      if (ch == '\1') out += "\1e";
      else if (percent && ch == '%') out += "\1p";
      else out += ch;
    }
    return out;
  };
  po::error_with_option_name copy(*named);
  copy.m_error_template = escape(copy.m_error_template, false);  // its own tokens stay
  for (auto& [name, text] : PoTexts::of(copy)) {
    if (name == "value" || name == "original_token") text = log::printable(text, kMaxQuotedValue);
    text = escape(text, true);
  }
  const std::string escaped = copy.what();
  std::string msg;
  for (size_t i = 0; i < escaped.size(); ++i)
    if (escaped[i] == '\1' && i + 1 < escaped.size()) msg += escaped[++i] == 'p' ? '%' : '\1';
    else msg += escaped[i];
  return msg;
}

// Longest quotation of a user's text in a message.
constexpr size_t kMaxMessage = 512;

// A parameter file is text: a control byte (a NUL, a binary file) is named
// with its line before anything is parsed.
void check_text(std::string_view text, const std::string& source) {
  size_t line = 1;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') ++line;
    if ((c < 0x20 && c != '\n' && c != '\r' && c != '\t') || c == 0x7f)
      fail(source + ": line " + std::to_string(line) + " holds the byte " +
           log::printable(std::string_view(&ch, 1)) + "; a parameter file is text");
  }
}

// "--key=value" and "--key value" to one "--key" "value" pair per key, in
// first-seen order, the LAST value of a key winning: a job script may put
// its defaults before the user's overrides.
std::vector<std::string> normalise_overrides(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() < 3 || a[2] == '=')
      fail("command line: unexpected argument '" + log::printable(a, kMaxMessage) +
           "': overrides are written --section.key=value");
    std::string key, value;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      key = a;
      value = args[++i];
    } else {
      fail("command line: " + a + " needs a value (--section.key=value)");
    }
    auto same = [&](const auto& p) { return p.first == key; };
    if (auto it = std::find_if(kv.begin(), kv.end(), same); it != kv.end()) it->second = value;
    else kv.emplace_back(key, value);
  }
  std::vector<std::string> out;
  for (auto& [k, v] : kv) {
    out.push_back(k);
    out.push_back(v);  // the two-word form also takes an empty value
  }
  return out;
}

}  // namespace

namespace {
// The model of quant.base where the base says it: a Hugging Face model
// directory (DIR/config.json, load/hf_dir.h) or a meshlm checkpoint (its
// /meta: meshlm ckpt import's, a run's). Every [model] key the parameter
// file and the command line leave out is taken from it; one they give must
// agree (model.max_seq_len may be less than a directory's n_positions or
// max_position_embeddings, or a Llama checkpoint's: the position table's
// first rows are taken, or the rotary embeddings need none).
void take_model_from_base(RunConfig& c, const std::function<bool(const char*)>& given) {
  const bool dir = load::is_directory(c.quant.base);
  GPTConfig h;
  std::string from;
  try {
    if (dir) {
      h = load::read_hf_directory(c.quant.base).model;
      from = "quant.base's " + (std::filesystem::path(c.quant.base) / load::kHfConfig).string();
    } else if (const std::optional<GPTConfig> m = load::checkpoint_model(c.quant.base)) {
      h = *m;
      from = "quant.base '" + c.quant.base + "' (its /meta)";
    } else {
      return;
    }
  } catch (const Error& e) {
    fail(std::string("quant.base: ") + e.what());
  }
  const bool llama = h.arch == ModelArch::llama;
  // The key's name where the model comes from: config.json's, or meshlm's.
  auto named = [&](const char* key, const char* gpt2_name, const char* llama_name) {
    return !dir ? std::string(key + 6) : std::string(llama ? llama_name : gpt2_name);
  };
  auto show = [](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, bool>) return std::string(v ? "true" : "false");
    else if constexpr (std::is_same_v<V, ModelArch>) return std::string(name_of(v));
    else return fmt::format("{}", v);
  };
  auto take = [&](const char* key, const std::string& hf_key, auto& field, auto value,
                  bool at_most = false) {
    if (!given(key)) {
      field = value;
      return;
    }
    if (field == value || (at_most && field < value)) return;
    fail(std::string(key) + " = " + show(field) + ", but " + from + " has " + hf_key + " " +
         show(value) + (at_most ? " (at most that)" : "") +
         ": leave the key out to take the base's, or give the same");
  };
  GPTConfig& m = c.model;
  take("model.arch", named("model.arch", "model_type", "model_type"), m.arch, h.arch);
  take("model.n_layer", named("model.n_layer", "n_layer", "num_hidden_layers"), m.n_layer, h.n_layer);
  take("model.n_head", named("model.n_head", "n_head", "num_attention_heads"), m.n_head, h.n_head);
  take("model.n_embd", named("model.n_embd", "n_embd", "hidden_size"), m.n_embd, h.n_embd);
  take("model.vocab_size", named("model.vocab_size", "vocab_size", "vocab_size"), m.vocab_size,
       h.vocab_size);
  take("model.max_seq_len", named("model.max_seq_len", "n_positions", "max_position_embeddings"),
       m.max_seq_len, h.max_seq_len, dir || llama);
  if (!llama) return;
  if (given("model.n_kv_head") && m.n_kv_head == 0) m.n_kv_head = m.n_head;  // 0 = n_head
  take("model.n_kv_head", named("model.n_kv_head", "", "num_key_value_heads"), m.n_kv_head,
       h.n_kv_head);
  take("model.intermediate_size", named("model.intermediate_size", "", "intermediate_size"),
       m.intermediate_size, h.intermediate_size);
  take("model.norm_eps", named("model.norm_eps", "", "rms_norm_eps"), m.norm_eps, h.norm_eps);
  take("model.rope_theta", named("model.rope_theta", "", "rope_theta"), m.rope_theta, h.rope_theta);
  take("model.tie_word_embeddings", named("model.tie_word_embeddings", "", "tie_word_embeddings"),
       m.tie_word_embeddings, h.tie_word_embeddings);
  ops::RopeScaling& r = m.rope_scaling;
  const ops::RopeScaling& hr = h.rope_scaling;
  // A model without rope scaling has its keys at 0.
  const char* factor_name = hr.factor == 0 ? "no rope scaling: rope_scaling factor" : "rope_scaling factor";
  take("model.rope_factor", named("model.rope_factor", "", factor_name), r.factor, hr.factor);
  take("model.rope_low_freq_factor", named("model.rope_low_freq_factor", "", "rope_scaling low_freq_factor"),
       r.low_freq_factor, hr.low_freq_factor);
  take("model.rope_high_freq_factor",
       named("model.rope_high_freq_factor", "", "rope_scaling high_freq_factor"),
       r.high_freq_factor, hr.high_freq_factor);
  take("model.rope_original_max_positions",
       named("model.rope_original_max_positions", "", "rope_scaling original_max_position_embeddings"),
       r.original_max_positions, hr.original_max_positions);
}
}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides, int world_size,
                           const LayoutChooser& choose) {
  RunConfig c;
  OptionTable table;
  make_options(c, table);
  const po::options_description desc = table.all();
  po::variables_map vm;
  // The command line is stored first: program_options keeps the first value
  // stored for a key, so an override beats the file.
  const std::vector<std::string> args = normalise_overrides(overrides);
  for (size_t i = 0; i + 1 < args.size(); i += 2)
    table.check_bool_value("command line: ", args[i].substr(2), args[i + 1]);
  try {
    po::store(po::command_line_parser(args)
                  .options(desc)
                  .style(po::command_line_style::default_style &
                         ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
  } catch (const po::unknown_option& e) {
    std::string key = e.get_option_name();
    if (key.starts_with("--")) key.erase(0, 2);
    fail("command line: " + log::printable(message_of(e), kMaxMessage) + key_hint(key, desc));
  } catch (const po::error& e) {
    fail("command line: " + log::printable(message_of(e), kMaxMessage));
  }
  // A UTF-8 byte order mark, which some editors put first, is not a line.
  std::string_view body = text;
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);
  check_text(body, source);
  try {
    std::istringstream in{std::string(body)};
    const po::parsed_options parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/false);
    // A key given twice in the file is an error even where the command
    // line overrides it (program_options would skip the file's values then).
    std::set<std::string> seen;
    for (const po::option& o : parsed.options) {
      if (!seen.insert(o.string_key).second)
        fail(source + ": key '" + log::printable(o.string_key, kMaxMessage) + "' is given twice");
      table.check_bool_value(source + ": ", o.string_key, o.value.empty() ? "" : o.value.front());
    }
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    fail(source + ": unknown key '" + log::printable(e.get_option_name(), kMaxMessage) +
         "' (see meshlm train --help)" + key_hint(e.get_option_name(), desc));
  } catch (const po::error& e) {
    fail(source + ": " + log::printable(message_of(e), kMaxMessage));
  }
  table.check();
  auto given = [&](const char* key) { return vm.count(key) && !vm[key].defaulted(); };
  take_model_from_base(c, given);
  // finetune.lora_targets by default: every linear layer of the architecture.
  if (!given("finetune.lora_targets")) c.finetune.lora_targets = LinearSlots::of(c.model.arch);
  if (c.parallel.layout == LayoutChoice::automatic) {
    if (given("parallel.stage_layers") && !c.parallel.stage_layers.layers.empty())
      fail("parallel.stage_layers with parallel.layout = auto: the planner splits the stages; "
           "give one of them");
    LayoutConstraints k;
    auto keep = [&](const char* key, int v, std::optional<int>& into) {
      if (given(key) && v > 0) into = v;  // 0 = derived: not a constraint
    };
    keep("parallel.dp", c.parallel.dp, k.dp);
    keep("parallel.tp", c.parallel.tp, k.tp);
    keep("parallel.pp", c.parallel.pp, k.pp);
    keep("parallel.micro_batches", c.parallel.micro_batches, k.micro_batches);
    if (given("parallel.zero_stage")) k.zero_stage = c.parallel.zero_stage;
    if (given("parallel.schedule")) k.schedule = c.parallel.schedule;
    if (given("parallel.activation_checkpointing"))
      k.activation_checkpointing = c.parallel.activation_checkpointing;
    // Every other key checked on one rank; the search sets [parallel].
    RunConfig one = c;
    one.parallel.dp = one.parallel.tp = one.parallel.pp = 1;
    one.parallel.zero_stage = 0;
    one.parallel.micro_batches = 0;
    one.parallel.stage_layers = {};
    one.train.micro_batch_size = one.train.batch_size;
    one.debug.fail_rank = -1;
    one.debug.kill_rank = 0;
    resolve_run_config(one, 1);
    if (!choose) {
      one.source = source;
      one.resolved = table.ini();
      return one;
    }
    const RunConfig chosen = choose(one, k);
    c.parallel = chosen.parallel;
    c.parallel.layout = LayoutChoice::automatic;
    c.train.micro_batch_size = chosen.train.micro_batch_size;
    c.layout_choice = chosen.layout_choice;
  }
  resolve_run_config(c, world_size);
  c.source = source;
  c.resolved = table.ini();  // the fields now hold the resolved values
  return c;
}

bool read_parameter_text(const std::string& path, std::string& text, std::string& why) {
  // Not opened unless a regular file: a FIFO would block, a directory reads as empty.
  why = non_regular_kind(path);
  if (!why.empty()) {
    why = ": it is " + why;
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  text = s.str();
  return true;
}

RunConfig load_run_config(MPI_Comm job, const std::string& path,
                          const std::vector<std::string>& overrides, bool choose_layout) {
  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  std::string text, why;
  bool ok = true;
  if (all->rank() == 0) ok = read_parameter_text(path, text, why);
  check_all(job, ok, "cannot read parameter file '" + path + "'" + why, MESHLM_HERE);
  text = comm::broadcast_string(*all, std::move(text));
  // Every rank runs rank 0's run: the same file and the same overrides (an
  // MPMD launch, or a script that gives ranks other arguments, would train
  // ranks on other settings or hang them in different collectives).
  std::string args = path;
  for (const std::string& o : overrides) args += '\n' + o;
  std::string first = comm::broadcast_string(*all, args);
  std::string shown;
  for (const std::string& o : overrides) shown += " " + o;
  std::string first_shown = first;
  std::replace(first_shown.begin(), first_shown.end(), '\n', ' ');
  check_all(job, args == first,
            "its command line (" + log::printable(path + shown, 300) + ") is not rank 0's (" +
                log::printable(first_shown, 300) + "): every rank must be given the same parameter file "
                "and overrides",
            MESHLM_HERE);
  LayoutChooser choose;
  if (choose_layout)
    choose = [job](const RunConfig& base, const LayoutConstraints& k) {
      return choose_auto_layout(job, base, k);
    };
  return parse_run_config(text, path, overrides, all->size(), choose);
}

std::string run_config_help() {
  RunConfig c;
  OptionTable table;
  make_options(c, table);
  std::ostringstream o;
  o << table.all();
  return o.str();
}

}  // namespace meshlm
