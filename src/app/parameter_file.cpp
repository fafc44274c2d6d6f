#include "app/parameter_file.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "model/gpt.h"
#include "model/lora.h"
#include "plan/partition.h"
#include "quant/quantize.h"
#include "train/pipeline_schedule.h"

namespace po = boost::program_options;

namespace meshlm {

namespace {

// The text of a default as a user would write it: 0.1, not 0.10000000000000001.
std::string text_of(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
std::string text_of(bool v) { return v ? "true" : "false"; }
std::string text_of(const std::string& v) { return v.empty() ? "\"\"" : v; }
template <typename T>
std::string text_of(const T& v) { return std::to_string(v); }

// A typed option bound to `field`, with the field's current value as default.
template <typename T>
po::typed_value<T>* opt(T* field) {
  return po::value(field)->default_value(*field, text_of(*field));
}

// The option table: one line per key. Kept in one function so that the
// parser, --help and the resolved-config dump can never disagree.
constexpr unsigned kHelpWidth = 100;  // columns of --help

po::options_description make_options(RunConfig& c) {
  po::options_description model("[model] the GPT-2 architecture", kHelpWidth, kHelpWidth / 2);
  model.add_options()
    ("model.n_layer", opt(&c.model.n_layer), "transformer blocks (L)")
    ("model.n_head", opt(&c.model.n_head), "attention heads (NH); must divide n_embd")
    ("model.n_embd", opt(&c.model.n_embd), "channels (C)")
    ("model.vocab_size", opt(&c.model.vocab_size), "vocabulary (V); padded to a multiple of 64 inside; 256 for byte-level data")
    ("model.seq_len", opt(&c.train.seq_len), "training sequence length (T); at most max_seq_len")
    ("model.max_seq_len", opt(&c.model.max_seq_len), "rows of the position table wpe; at least seq_len (GPT-2 uses 1024)");
  po::options_description train("[train] optimisation", kHelpWidth, kHelpWidth / 2);
  train.add_options()
    ("train.steps", opt(&c.train.steps), "optimizer steps")
    ("train.batch_size", opt(&c.train.batch_size), "sequences per optimizer step")
    ("train.micro_batch_size", opt(&c.train.micro_batch_size), "sequences per forward/backward of one rank; gradients accumulate over batch_size / (dp * micro_batch_size) micro-batches; 0 = batch_size / (dp * parallel.micro_batches)")
    ("train.lr", opt(&c.train.lr), "peak learning rate")
    ("train.lr_min_ratio", opt(&c.train.lr_min_ratio), "final learning rate of the cosine decay, as a fraction of lr")
    ("train.warmup_steps", opt(&c.train.warmup_steps), "steps of linear warmup before the cosine decay")
    ("train.weight_decay", opt(&c.train.weight_decay), "AdamW decoupled weight decay (matrices only)")
    ("train.grad_clip", opt(&c.train.grad_clip), "clip the global gradient norm to this; 0 = off")
    ("train.beta1", opt(&c.train.beta1), "AdamW beta1")
    ("train.beta2", opt(&c.train.beta2), "AdamW beta2")
    ("train.eps", opt(&c.train.eps), "AdamW epsilon")
    ("train.seed", opt(&c.train.seed), "seed of weight init and data shuffling; same seed, same run, bit for bit")
    ("train.log_every", opt(&c.train.log_every), "print and record metrics every this many steps (and at the last)");
  po::options_description data("[data] training tokens", kHelpWidth, kHelpWidth / 2);
  data.add_options()
    ("data.path", opt(&c.data.path), "token file: HDF5 with dataset 'tokens' (uint16/uint32) or meshlm raw tokens (required)")
    ("data.tokenize_from", opt(&c.data.tokenize_from), "text file tokenized byte-level into data.path when data.path does not exist")
    ("data.shuffle", opt(&c.data.shuffle), "visit sequences in a seeded random order (true) or in file order (false)");
  po::options_description output("[output] results", kHelpWidth, kHelpWidth / 2);
  output.add_options()
    ("output.dir", opt(&c.output.dir), "directory of run.h5 (metrics, memory, timing, resolved configuration)");
  po::options_description runtime("[runtime] the process", kHelpWidth, kHelpWidth / 2);
  runtime.add_options()
    ("runtime.threads", opt(&c.runtime.threads), "OpenMP/BLAS threads per rank; 0 = cores of the node / ranks on the node");
  po::options_description all(kHelpWidth, kHelpWidth / 2);
  po::options_description parallel("[parallel] the process mesh: ranks = dp * tp * pp", kHelpWidth, kHelpWidth / 2);
  parallel.add_options()
    ("parallel.dp", opt(&c.parallel.dp), "data-parallel replicas, each reading its own slice of every batch; 0 = ranks / (tp * pp)")
    ("parallel.tp", opt(&c.parallel.tp), "tensor-parallel ranks (Megatron); must divide n_head and the padded vocabulary")
    ("parallel.pp", opt(&c.parallel.pp), "pipeline stages; at most n_layer")
    ("parallel.zero_stage", opt(&c.parallel.zero_stage), "0 = replicated optimizer; 1 = AdamW moments sharded over dp; 2 = gradients sharded too")
    ("parallel.micro_batches", opt(&c.parallel.micro_batches), "micro-batches per step and dp rank (pipeline and accumulation); 0 = batch_size / (dp * micro_batch_size)")
    ("parallel.schedule", opt(&c.parallel.schedule), "pipeline schedule: gpipe | 1f1b (1f1b needs micro_batches >= pp)")
    ("parallel.activation_checkpointing", opt(&c.parallel.activation_checkpointing), "none | full (keep each layer's input, recompute the layer in backward)")
    ("parallel.stage_layers", opt(&c.parallel.stage_layers), "layers per pipeline stage, e.g. 3,3,2,2; empty = balanced by cost (embedding and head included)")
    ("parallel.ranks_per_node", opt(&c.parallel.ranks_per_node), "split each node's ranks into groups of this many, as if they were nodes (tests); 0 = real nodes");
  po::options_description finetune("[finetune] what trains", kHelpWidth, kHelpWidth / 2);
  finetune.add_options()
    ("finetune.mode", opt(&c.finetune.mode), "full = every parameter trains; lora = LoRA adapters on a frozen, quantized base ([quant])")
    ("finetune.lora_rank", opt(&c.finetune.lora_rank), "LoRA rank r")
    ("finetune.lora_alpha", opt(&c.finetune.lora_alpha), "LoRA alpha: adapters are scaled by alpha / r")
    ("finetune.lora_targets", opt(&c.finetune.lora_targets), "matrices with adapters, comma-separated: qkv, attn-out, mlp-up, mlp-down");
  po::options_description quant("[quant] the base model: its weights and, under LoRA, their quantization", kHelpWidth, kHelpWidth / 2);
  quant.add_options()
    ("quant.type", opt(&c.quant.type), "format of the base's matrices: nf4 (4.127 bits/weight) | int8 (8.5) | f32; vectors stay f32")
    ("quant.share", opt(&c.quant.share), "node = quantized once on rank 0, one copy per node in MPI shared memory; per_rank = every rank loads and quantizes its own copy")
    ("quant.base", opt(&c.quant.base), "base weights: *.safetensors (Hugging Face GPT-2 names) or *.h5 (meshlm /params/<name>); empty = GPT-2 initialisation from train.seed. With finetune.mode = full the whole model starts from them (fp32, nothing quantized)")
    ("quant.cache", opt(&c.quant.cache), "HDF5 quantized-model cache: loaded when it matches the base and settings, (re)written otherwise; empty = none");
  po::options_description debug("[debug] failure injection for tests", kHelpWidth, kHelpWidth / 2);
  debug.add_options()
    ("debug.fail_rank", opt(&c.debug.fail_rank), "this rank throws an error in the forward of debug.fail_step; -1 = none")
    ("debug.fail_step", opt(&c.debug.fail_step), "the step at which debug.fail_rank fails");
  all.add(model).add(train).add(data).add(output).add(runtime).add(parallel).add(finetune).add(quant).add(debug);
  return all;
}

[[noreturn]] void fail(const std::string& msg) { throw CollectiveError(msg, MESHLM_HERE); }

// Every key with its final value, grouped by section, as an INI text. `c`
// is the resolved configuration (derived values such as parallel.dp = 0
// filled in): its values are the defaults of a fresh option table.
std::string resolved_ini(RunConfig c) {
  const po::options_description desc = make_options(c);
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> sections;
  std::vector<std::string> order;
  for (const auto& opt : desc.options()) {
    const std::string& key = opt->long_name();
    const auto dot = key.find('.');
    const std::string section = key.substr(0, dot);
    boost::any v;
    opt->semantic()->apply_default(v);
    std::string s;
    if (auto p = boost::any_cast<int>(&v)) s = std::to_string(*p);
    else if (auto p = boost::any_cast<uint64_t>(&v)) s = std::to_string(*p);
    else if (auto p = boost::any_cast<bool>(&v)) s = text_of(*p);
    else if (auto p = boost::any_cast<std::string>(&v)) s = *p;
    else if (auto p = boost::any_cast<double>(&v)) s = text_of(*p);
    if (!sections.count(section)) order.push_back(section);
    sections[section].emplace_back(key.substr(dot + 1), s);
  }
  std::string out;
  for (const auto& sec : order) {
    out += "[" + sec + "]\n";
    for (const auto& [k, v] : sections[sec]) out += k + " = " + v + "\n";
  }
  return out;
}

// "--key=value" and "--key value" to one "--key" "value" pair per key, in
// first-seen order, the LAST value of a key winning: a job script may put
// its defaults before the user's overrides.
std::vector<std::string> normalise_overrides(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() < 3)
      fail("unexpected argument '" + a + "': overrides are written --section.key=value");
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

// parallel.dp = 0: every rank not used by tp and pp is a data-parallel replica.
void resolve_dp(RunConfig& c, int world_size) {
  auto& p = c.parallel;
  auto str = [](int v) { return std::to_string(v); };
  if (p.dp != 0) return;
  if (p.tp < 1 || p.pp < 1 || world_size % (p.tp * p.pp) != 0)
    fail("parallel.dp = 0 takes the ranks left by parallel.tp (" + str(p.tp) + ") * parallel.pp (" +
         str(p.pp) + "), but the job has " + str(world_size) + " ranks, not a multiple of " +
         str(p.tp * p.pp));
  p.dp = world_size / (p.tp * p.pp);
}

// train.micro_batch_size and parallel.micro_batches describe the same split
// of a step (batch_size = dp * micro_batches * micro_batch_size): either may
// be left 0 and is then derived from the other.
void resolve_micro_batches(RunConfig& c) {
  auto& t = c.train;
  const auto& p = c.parallel;
  auto str = [](int v) { return std::to_string(v); };
  if (p.dp < 1) fail("parallel.dp must be >= 1 (got " + str(p.dp) + ")");
  if (t.batch_size < 1) fail("train.batch_size must be >= 1 (got " + str(t.batch_size) + ")");
  if (t.micro_batch_size < 0) fail("train.micro_batch_size must be >= 0 (got " + str(t.micro_batch_size) + ")");
  if (p.micro_batches < 0) fail("parallel.micro_batches must be >= 0 (got " + str(p.micro_batches) + ")");
  if (t.batch_size % p.dp != 0)
    fail("train.batch_size (" + str(t.batch_size) + ") must be divisible by parallel.dp (" + str(p.dp) + ")");
  const int per_dp = t.batch_size / p.dp;
  if (t.micro_batch_size == 0) {
    const int m = p.micro_batches > 0 ? p.micro_batches : 1;
    if (per_dp % m != 0)
      fail("train.batch_size / parallel.dp (" + str(per_dp) + ") must be a multiple of parallel.micro_batches (" +
           str(m) + ")");
    t.micro_batch_size = per_dp / m;
  }
  if (per_dp % t.micro_batch_size != 0)
    fail("train.batch_size (" + str(t.batch_size) + ") must be a multiple of train.micro_batch_size (" +
         str(t.micro_batch_size) + ")" + (p.dp > 1 ? " times parallel.dp (" + str(p.dp) + ")" : ""));
  const int m = per_dp / t.micro_batch_size;
  if (p.micro_batches > 0 && p.micro_batches != m)
    fail("parallel.micro_batches (" + str(p.micro_batches) + ") disagrees with train.batch_size (" +
         str(t.batch_size) + ") / (parallel.dp (" + str(p.dp) + ") * train.micro_batch_size (" +
         str(t.micro_batch_size) + ")) = " + str(m) + "; set one of them to 0");
  c.parallel.micro_batches = m;
}

// The [parallel] keys against each other and the model. The world size is
// checked where it is known, by the process mesh.
void validate_parallel(const RunConfig& c) {
  const auto& p = c.parallel;
  const auto& m = c.model;
  auto str = [](int v) { return std::to_string(v); };
  if (p.tp < 1) fail("parallel.tp must be >= 1 (got " + str(p.tp) + ")");
  if (p.pp < 1) fail("parallel.pp must be >= 1 (got " + str(p.pp) + ")");
  if (p.zero_stage < 0 || p.zero_stage > 2)
    fail("parallel.zero_stage must be 0, 1 or 2 (got " + str(p.zero_stage) + ")");
  if (p.ranks_per_node < 0)
    fail("parallel.ranks_per_node must be >= 0 (got " + str(p.ranks_per_node) + ")");
  if (m.n_head % p.tp != 0)
    fail("model.n_head (" + str(m.n_head) + ") must be divisible by parallel.tp (" + str(p.tp) +
         "): tensor parallelism splits the heads");
  if (m.padded_vocab_size() % p.tp != 0)
    fail("the padded vocabulary (model.vocab_size " + str(m.vocab_size) + " -> " +
         str(m.padded_vocab_size()) + ") must be divisible by parallel.tp (" + str(p.tp) + ")");
  if (p.pp > m.n_layer)
    fail("parallel.pp (" + str(p.pp) + ") is more pipeline stages than model.n_layer (" +
         str(m.n_layer) + ") layers");
  const ScheduleKind kind = parse_schedule(p.schedule);
  if (kind == ScheduleKind::one_f_one_b && p.micro_batches < p.pp)
    fail("parallel.micro_batches (" + str(p.micro_batches) + ") must be >= parallel.pp (" + str(p.pp) +
         ") under parallel.schedule = 1f1b (raise train.batch_size, lower train.micro_batch_size, "
         "or use gpipe)");
  parse_checkpointing(p.activation_checkpointing);
  if (!p.stage_layers.empty()) parse_stage_layers(p.stage_layers, m.n_layer, p.pp);
  if (c.debug.fail_step < 1) fail("debug.fail_step must be >= 1 (got " + str(c.debug.fail_step) + ")");
}

// [finetune] and [quant].
void validate_finetune(const RunConfig& c) {
  const auto& f = c.finetune;
  const auto& q = c.quant;
  if (f.mode != "full" && f.mode != "lora")
    fail("finetune.mode must be full or lora (got '" + f.mode + "')");
  if (f.lora_rank < 1) fail("finetune.lora_rank must be >= 1 (got " + std::to_string(f.lora_rank) + ")");
  if (!(f.lora_alpha > 0)) fail("finetune.lora_alpha must be > 0");
  parse_lora_targets(f.lora_targets);
  quant::parse_quant_type(q.type);
  if (q.share != "node" && q.share != "per_rank")
    fail("quant.share must be node or per_rank (got '" + q.share + "')");
}

void validate(const RunConfig& c) {
  c.model.validate();
  const auto& t = c.train;
  auto positive = [](int v, const char* key) {
    if (v < 1) fail(std::string(key) + " must be >= 1 (got " + std::to_string(v) + ")");
  };
  positive(t.seq_len, "model.seq_len");
  positive(t.steps, "train.steps");
  positive(t.batch_size, "train.batch_size");
  positive(t.micro_batch_size, "train.micro_batch_size");
  positive(t.log_every, "train.log_every");
  if (t.seq_len > c.model.max_seq_len)
    fail("model.seq_len (" + std::to_string(t.seq_len) + ") is longer than the position table, model.max_seq_len (" +
         std::to_string(c.model.max_seq_len) + ")");
  if (t.batch_size % t.micro_batch_size != 0)
    fail("train.batch_size (" + std::to_string(t.batch_size) + ") must be a multiple of train.micro_batch_size (" +
         std::to_string(t.micro_batch_size) + ")");
  if (!(t.lr > 0)) fail("train.lr must be > 0");
  if (t.lr_min_ratio < 0 || t.lr_min_ratio > 1) fail("train.lr_min_ratio must lie in [0, 1]");
  if (t.warmup_steps < 0) fail("train.warmup_steps must be >= 0");
  if (t.weight_decay < 0) fail("train.weight_decay must be >= 0");
  if (t.grad_clip < 0) fail("train.grad_clip must be >= 0 (0 turns clipping off)");
  if (t.beta1 < 0 || t.beta1 >= 1) fail("train.beta1 must lie in [0, 1)");
  if (t.beta2 < 0 || t.beta2 >= 1) fail("train.beta2 must lie in [0, 1)");
  if (!(t.eps > 0)) fail("train.eps must be > 0");
  if (c.data.path.empty()) fail("data.path is required (a token file; see data.tokenize_from)");
  if (c.output.dir.empty()) fail("output.dir must not be empty");
  if (c.runtime.threads < 0) fail("runtime.threads must be >= 0 (0 = automatic)");
  validate_parallel(c);
  validate_finetune(c);
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides, int world_size) {
  RunConfig c;
  po::options_description desc = make_options(c);
  po::variables_map vm;
  // The command line is stored first: program_options keeps the first value
  // stored for a key, so an override beats the file.
  try {
    po::store(po::command_line_parser(normalise_overrides(overrides))
                  .options(desc)
                  .style(po::command_line_style::default_style &
                         ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
  } catch (const po::error& e) {
    fail("command line: " + std::string(e.what()));
  }
  try {
    std::istringstream in(text);
    po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    fail(source + ": unknown key '" + e.get_option_name() + "' (see meshlm train --help)");
  } catch (const po::invalid_option_value& e) {
    fail(source + ": " + e.what());
  } catch (const po::error& e) {
    fail(source + ": " + e.what());
  }
  resolve_dp(c, world_size);
  resolve_micro_batches(c);
  validate(c);
  c.source = source;
  c.resolved = resolved_ini(c);
  return c;
}

RunConfig load_run_config(MPI_Comm job, const std::string& path,
                          const std::vector<std::string>& overrides) {
  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  std::string text;
  bool ok = true;
  if (all->rank() == 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      ok = false;
    } else {
      std::ostringstream s;
      s << in.rdbuf();
      text = s.str();
    }
  }
  check_all(job, ok, "cannot read parameter file '" + path + "'", MESHLM_HERE);
  uint64_t len = text.size();
  all->broadcast(&len, sizeof(len), DType::u8, 0).wait();
  text.resize(len);
  all->broadcast(text.data(), len, DType::u8, 0).wait();
  return parse_run_config(text, path, overrides, all->size());
}

std::string run_config_help() {
  RunConfig c;
  std::ostringstream o;
  o << make_options(c);
  return o.str();
}

}  // namespace meshlm
