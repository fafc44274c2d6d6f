#include "train/run_config.h"

#include <algorithm>
#include <filesystem>

#include <cctype>
#include <cmath>
#include <utility>
#include <string>

#include "core/checked.h"
#include "core/error.h"
#include "ops/ops.h"
#include "train/backend.h"

namespace meshlm {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw CollectiveError(msg, MESHLM_HERE); }
std::string str(int v) { return std::to_string(v); }

// parallel.dp = 0: every rank not used by tp and pp is a data-parallel replica.
void resolve_dp(ParallelConfig& p, int world_size) {
  if (p.dp != 0) return;
  const long long tp_pp = static_cast<long long>(p.tp) * p.pp;  // (int * int may overflow)
  if (p.tp < 1 || p.pp < 1 || world_size % tp_pp != 0)
    fail("parallel.dp = 0 takes the ranks left by parallel.tp (" + str(p.tp) + ") * parallel.pp (" +
         str(p.pp) + "), but the job has " + str(world_size) + " ranks, not a multiple of " +
         std::to_string(tp_pp));
  p.dp = static_cast<int>(world_size / tp_pp);
}

// train.micro_batch_size and parallel.micro_batches describe the same split
// of a step (batch_size = dp * micro_batches * micro_batch_size): either may
// be left 0 and is then derived from the other.
void resolve_micro_batches(TrainConfig& t, ParallelConfig& p) {
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
  p.micro_batches = m;
}

// [train] against itself and the model; [data], [output], [runtime], [debug].
void validate_train(const RunConfig& c) {
  const TrainConfig& t = c.train;
  auto positive = [](int v, const char* key) {
    if (v < 1) fail(std::string(key) + " must be >= 1 (got " + str(v) + ")");
  };
  positive(t.seq_len, "model.seq_len");
  positive(t.steps, "train.steps");
  positive(t.batch_size, "train.batch_size");
  positive(t.micro_batch_size, "train.micro_batch_size");
  positive(t.log_every, "train.log_every");
  positive(t.eval_batches, "train.eval_batches");
  if (t.eval_every < 0) fail("train.eval_every must be >= 0 (0 = no evaluation; got " + str(t.eval_every) + ")");
  if (t.seq_len > c.model.max_seq_len)
    fail("model.seq_len (" + str(t.seq_len) + ") is longer than the position table, model.max_seq_len (" +
         str(c.model.max_seq_len) + ")");
  if (t.batch_size % t.micro_batch_size != 0)
    fail("train.batch_size (" + str(t.batch_size) + ") must be a multiple of train.micro_batch_size (" +
         str(t.micro_batch_size) + ")");
  // Written so that NaN fails every test.
  if (!(t.lr > 0 && std::isfinite(t.lr))) fail("train.lr must be finite and > 0");
  if (!(t.lr_min_ratio >= 0 && t.lr_min_ratio <= 1)) fail("train.lr_min_ratio must lie in [0, 1]");
  if (t.warmup_steps < 0) fail("train.warmup_steps must be >= 0");
  if (!(t.grad_clip >= 0 && std::isfinite(t.grad_clip)))
    fail("train.grad_clip must be finite and >= 0 (0 turns clipping off)");
  if (t.seed < 0) fail("train.seed must be >= 0");
  t.adamw.validate();
  if (c.data.path.empty()) fail("data.path is required (a token file; see data.tokenize_from)");
  if (c.output.dir.empty()) fail("output.dir must not be empty");
  if (c.runtime.threads < 0) fail("runtime.threads must be >= 0 (0 = automatic)");
  const BackendCaps& caps = backend_caps(c.runtime.backend);
  const std::string backend = name_of(c.runtime.backend);
  if (!caps.built)
    fail("runtime.backend = " + backend + ", but " + caps.missing_build);
  // (Under quant.share = per_rank, or full training, nothing is broadcast.)
  if (c.quant.broadcast == quant::BaseBroadcast::nccl && (!caps.device_memory || !caps.nccl))
    fail("quant.broadcast = nccl: runtime.backend = " + backend +
         " has no GPUs to broadcast between; set quant.broadcast = mpi or runtime.backend = cuda");
  if (t.attention == Attention::flash && c.model.n_head > 0 &&
      c.model.n_embd % c.model.n_head == 0 &&
      !caps.flash_attention(t.precision, c.model.n_embd / c.model.n_head))
    fail("train.attention = flash on runtime.backend = cuda multiplies 16-bit tiles on the "
         "tensor cores: it needs train.precision = bf16 or fp16 (got " +
         std::string(name_of(t.precision)) + ") and a head size, model.n_embd / model.n_head, of "
         "16, 32, 64 or 128 (got " + str(c.model.n_embd) + " / " + str(c.model.n_head) +
         "); use train.attention = probabilities");
  const long long batch_heads = static_cast<long long>(t.micro_batch_size) *
                                (c.model.n_head / std::max(1, c.parallel.tp));
  if (t.attention == Attention::flash && caps.flash_max_batch_heads > 0 &&
      batch_heads > caps.flash_max_batch_heads)
    fail("train.attention = flash on runtime.backend = " + backend + " takes at most " +
         std::to_string(caps.flash_max_batch_heads) + " (sequence, head) pairs per micro-batch: "
         "train.micro_batch_size (" + str(t.micro_batch_size) + ") x model.n_head / parallel.tp (" +
         str(c.model.n_head) + " / " + str(c.parallel.tp) + ") is " + std::to_string(batch_heads) +
         "; lower train.micro_batch_size");
  if (!(t.loss_scale.initial >= 1 && t.loss_scale.initial <= LossScaler::kMax))
    fail("train.loss_scale must lie in [1, 2^32]");
  if (t.loss_scale.window < 1) fail("train.loss_scale_window must be >= 1");
  if (c.debug.fail_step < 1) fail("debug.fail_step must be >= 1 (got " + str(c.debug.fail_step) + ")");
}

// Every element and byte count the configuration implies, bounded from above
// in checked 64-bit arithmetic. Each count the planner and the model compute
// is a product of some of the same factors, so once these fit, they fit.
void check_sizes(const RunConfig& c) {
  // The keys, each a factor named by its key.
  const SizeFactor L{uint64_t(c.model.n_layer), "model.n_layer"};
  const SizeFactor NH{uint64_t(c.model.n_head), "model.n_head"};
  const SizeFactor C{uint64_t(c.model.n_embd), "model.n_embd"};
  const SizeFactor Vp{uint64_t(c.model.padded_vocab_size()), "model.vocab_size (padded)"};
  const SizeFactor maxT{uint64_t(c.model.max_seq_len), "model.max_seq_len"};
  const SizeFactor T{uint64_t(c.train.seq_len), "model.seq_len"};
  const SizeFactor B{uint64_t(c.train.micro_batch_size), "train.micro_batch_size"};
  const SizeFactor m{uint64_t(c.parallel.micro_batches), "parallel.micro_batches"};
  const SizeFactor bs{uint64_t(c.train.batch_size), "train.batch_size"};
  // Parameters: wte, wpe, L blocks of 12 C^2 + 13 C, ln_f; 4 bytes each in
  // four buffers (parameters, gradients, AdamW's two moments).
  const uint64_t block = checked_sum("the parameters of one block",
                                     checked_product("the matrices of one block", {{12, "12"}, C, C}),
                                     13 * C.value);
  uint64_t params = checked_product(
      "the blocks' parameters", {L, {block, "one block's parameters (from model.n_embd)"}});
  params = checked_sum("the model's parameters", params, checked_product("wte", {Vp, C}));
  params = checked_sum("the model's parameters", params, checked_product("wpe", {maxT, C}));
  checked_product("the bytes of parameters, gradients and optimizer state",
                  {{params, "the parameters (from model.n_layer, model.n_embd, model.vocab_size, "
                            "model.max_seq_len)"},
                   {16, "16 bytes each"}});
  // Activations of the micro-batches in flight: per block about 16 B T C
  // plus the attention scores B NH T^2, and the logits B T Vp.
  const uint64_t per_block =
      checked_sum("one block's activations",
                  checked_product("one block's activations", {{16, "16"}, B, T, C}),
                  checked_product("the attention scores", {B, NH, T, T}));
  const uint64_t acts = checked_sum(
      "the activations",
      checked_product("the activations of the blocks",
                      {L, {per_block, "one block's activations (from train.micro_batch_size, "
                                      "model.seq_len, model.n_embd, model.n_head)"}}),
      checked_product("the logits", {B, T, Vp}));
  checked_product("the bytes of the activations in flight",
                  {{acts, "the activations of a micro-batch (from model.n_layer, "
                          "train.micro_batch_size, model.seq_len, model.n_embd, model.n_head, "
                          "model.vocab_size)"},
                   m,
                   {4, "4 bytes each"}});
  checked_product("the tokens of a step", {bs, T, {8, "8 bytes each"}});
  checked_product("the tokens of an evaluation",
                  {{uint64_t(c.train.eval_batches), "train.eval_batches"}, bs, T});
}

}  // namespace

uint64_t parse_memory_size(const std::string& key, const std::string& text) {
  auto bad = [&](const std::string& why) -> uint64_t {
    fail(key + " = '" + text + "': " + why +
         " (a size such as 80GiB, 512M or 4e9; units KiB MiB GiB TiB or K M G T are powers of "
         "1024, kB MB GB TB powers of 1000; empty or 0 = no limit)");
  };
  size_t a = 0, b = text.size();
  while (a < b && std::isspace(static_cast<unsigned char>(text[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
  if (a == b) return 0;
  const std::string t = text.substr(a, b - a);
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(t, &used);
  } catch (const std::exception&) {
    return bad("not a number");
  }
  std::string unit = t.substr(used);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},          {"B", 1},         {"K", 0x1p10},   {"KiB", 0x1p10}, {"M", 0x1p20},
      {"MiB", 0x1p20},  {"G", 0x1p30},    {"GiB", 0x1p30}, {"T", 0x1p40},   {"TiB", 0x1p40},
      {"kB", 1e3},      {"KB", 1e3},      {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12}};
  double scale = 0;
  for (const auto& [name, factor] : kUnits)
    if (unit == name) scale = factor;
  if (scale == 0) return bad("unknown unit '" + unit + "'");
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 0) return bad("not a size");
  if (bytes >= 0x1p63) return bad("too large");
  return static_cast<uint64_t>(std::ceil(bytes));
}

static void validate_checkpoint(RunConfig& c, int world_size) {
  CheckpointConfig& k = c.checkpoint;
  static const char* const kPoints[] = {"", "create", "tensors", "checksums", "rename", "latest"};
  if (std::find(std::begin(kPoints), std::end(kPoints), c.debug.kill_in_checkpoint) ==
      std::end(kPoints))
    fail("debug.kill_in_checkpoint = '" + c.debug.kill_in_checkpoint +
         "': use one of create | tensors | checksums | rename | latest, or empty");
  if (c.debug.kill_rank >= world_size)
    fail("debug.kill_rank (" + str(c.debug.kill_rank) + ") is not a rank of this job of " +
         str(world_size) + " ranks");
  k.resolved_dir = k.dir.empty() ? (std::filesystem::path(c.output.dir) / "checkpoints").string()
                                 : k.dir;
  if (k.resume.empty())
    fail("checkpoint.resume is empty: none, auto or the path of a checkpoint file");
  if (!k.adapters_from.empty() && c.finetune.mode != FinetuneMode::lora)
    fail("finetune.adapters_from = " + k.adapters_from +
         " needs finetune.mode = lora (adapters start a LoRA fine-tune)");
  if (!k.adapters_from.empty() && k.resume != "none")
    fail("finetune.adapters_from and checkpoint.resume = " + k.resume +
         " both say where training starts: give one");
}

void resolve_run_config(RunConfig& c, int world_size) {
  resolve_dp(c.parallel, world_size);
  resolve_micro_batches(c.train, c.parallel);
  c.model.validate();
  // auto: the probabilities on every backend; flash is asked for by name.
  if (c.train.attention == Attention::automatic) c.train.attention = Attention::probabilities;
  validate_train(c);
  c.parallel.validate(c.model);
  c.finetune.validate();
  if (const LinearSlots extra = c.finetune.lora_targets.outside(c.model.arch); !extra.empty())
    fail("finetune.lora_targets names " + slots_text(extra) + ", which model.arch = " +
         name_of(c.model.arch) + " does not have (its linear layers: " +
         slots_text(LinearSlots::of(c.model.arch)) + ")");
  if (c.debug.fail_rank >= world_size)
    fail("debug.fail_rank (" + str(c.debug.fail_rank) + ") is not a rank of this job of " +
         str(world_size) + " ranks (-1 = none)");
  check_sizes(c);
  validate_checkpoint(c, world_size);
  c.memory.rank_limit_bytes = parse_memory_size("memory.limit_per_rank", c.memory.limit_per_rank);
  c.memory.node_limit_bytes = parse_memory_size("memory.limit_per_node", c.memory.limit_per_node);
  ClusterConfig& k = c.cluster;
  k.runtime_bytes = parse_memory_size("cluster.runtime_per_rank", k.runtime_per_rank);
  k.runtime_pss_bytes = parse_memory_size("cluster.runtime_pss_per_rank", k.runtime_pss_per_rank);
  k.device_runtime_bytes = parse_memory_size("cluster.device_runtime", k.device_runtime);
}

}  // namespace meshlm
