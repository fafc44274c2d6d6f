#include "io/checkpoint_meta.h"

#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "io/h5.h"

namespace meshlm::io::ckpt {

namespace {

// The run's integer attributes, each named as its field.
constexpr std::pair<const char*, int64_t RunMeta::*> kRunInt64[] = {
    {"loss_scale_good_steps", &RunMeta::loss_scale_good_steps},
    {"skipped_steps", &RunMeta::skipped_steps},
    {"overflow_steps", &RunMeta::overflow_steps},
    {"data_seq_len", &RunMeta::data_seq_len},
    {"layout_dp", &RunMeta::layout_dp},
    {"layout_tp", &RunMeta::layout_tp},
    {"layout_pp", &RunMeta::layout_pp},
    {"layout_zero_stage", &RunMeta::layout_zero_stage},
    {"layout_micro_batches", &RunMeta::layout_micro_batches},
};
// Llama's attributes, each named as its field.
constexpr std::pair<const char*, int64_t LlamaMeta::*> kLlamaInt64[] = {
    {"n_kv_head", &LlamaMeta::n_kv_head},
    {"intermediate_size", &LlamaMeta::intermediate_size},
    {"tie_word_embeddings", &LlamaMeta::tie_word_embeddings},
    {"rope_original_max_positions", &LlamaMeta::rope_original_max_positions},
};
constexpr std::pair<const char*, double LlamaMeta::*> kLlamaReal[] = {
    {"norm_eps", &LlamaMeta::norm_eps},
    {"rope_theta", &LlamaMeta::rope_theta},
    {"rope_factor", &LlamaMeta::rope_factor},
    {"rope_low_freq_factor", &LlamaMeta::rope_low_freq_factor},
    {"rope_high_freq_factor", &LlamaMeta::rope_high_freq_factor},
};
// The model sizes, on / and on /meta.
constexpr std::pair<const char*, int64_t ModelSizes::*> kSizes[] = {
    {"n_layer", &ModelSizes::n_layer},
    {"n_head", &ModelSizes::n_head},
    {"n_embd", &ModelSizes::n_embd},
    {"vocab_size", &ModelSizes::vocab_size},
    {"max_seq_len", &ModelSizes::max_seq_len},
};
constexpr std::pair<const char*, uint64_t RunMeta::*> kRunUInt64[] = {
    {"data_epoch", &RunMeta::data_epoch},
    {"data_position", &RunMeta::data_position},
    {"data_windows_per_epoch", &RunMeta::data_windows_per_epoch},
};

}  // namespace

void write_meta(hid_t file, const Meta& m) {
  h5::Group meta = write_identity(file, m.sizes, m.created, m.config, m.lora ? "lora" : "full");
  h5::write_string_attr(meta, "arch", m.arch);
  if (m.llama) {
    for (const auto& [name, field] : kLlamaInt64) h5::write_scalar_attr<int64_t>(meta, name, (*m.llama).*field);
    for (const auto& [name, field] : kLlamaReal) h5::write_scalar_attr<double>(meta, name, (*m.llama).*field);
  }
  if (m.lora) {
    const LoraMeta& l = *m.lora;
    h5::write_scalar_attr<int64_t>(meta, "lora_rank", l.rank);
    h5::write_scalar_attr<double>(meta, "lora_alpha", l.alpha);
    h5::write_string_attr(meta, "lora_targets", l.targets);
    h5::write_string_attr(meta, "quant_type", l.quant_type);
    h5::write_string_attr(meta, "quant_base", l.quant_base);
    h5::write_string_attr(meta, "base_hash", l.base_hash);
  }
  h5::write_scalar_attr<int64_t>(meta, "step", m.step);
  h5::write_scalar_attr<int64_t>(meta, "tokens_seen", m.tokens_seen);
  h5::write_scalar_attr<int64_t>(meta, "adamw_step", m.adamw_step);
  if (m.seed) h5::write_scalar_attr<int64_t>(meta, "seed", *m.seed);
  if (!m.hf_config.empty()) h5::write_string_attr(meta, "hf_config", m.hf_config);
  if (!m.run) return;
  const RunMeta& r = *m.run;
  h5::write_scalar_attr<double>(meta, "loss_scale", r.loss_scale);
  for (const auto& [name, field] : kRunInt64) h5::write_scalar_attr<int64_t>(meta, name, r.*field);
  for (const auto& [name, field] : kRunUInt64) h5::write_scalar_attr<uint64_t>(meta, name, r.*field);
  h5::write_scalar_attr<int64_t>(meta, "data_shuffle", r.data_shuffle ? 1 : 0);
  h5::write_string_attr(meta, "data_path", r.data_path);
  h5::write_scalar_attr<int64_t>(meta, "layout_world",
                                 r.layout_dp * r.layout_tp * r.layout_pp);
}

namespace {

// /meta's attributes, each required, each error naming the file.
class Reader {
public:
  Reader(hid_t meta, const std::string& path) : meta_(meta), path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw RankError(path_ + ": " + what, MESHLM_HERE);
  }
  bool has(const char* name) const { return h5::has_attr(meta_, name); }
  void require(const char* name) const {
    if (!has(name)) fail(fmt::format("/meta has no attribute '{}'", name));
  }
  std::string text(const char* name) const {
    require(name);
    return h5::read_string_attr(meta_, name);
  }
  double real(const char* name) const {
    require(name);
    return h5::read_scalar_attr<double>(meta_, name);
  }
  int64_t i64(const char* name) const {
    require(name);
    return h5::read_scalar_attr<int64_t>(meta_, name);
  }
  uint64_t u64(const char* name) const {
    require(name);
    return h5::read_scalar_attr<uint64_t>(meta_, name);
  }
  int64_t model_size(const char* name) const {
    const int64_t v = i64(name);
    if (v < 1 || v > std::numeric_limits<int>::max())
      fail(fmt::format("/meta attribute '{}' = {} is not a model size", name, v));
    return v;
  }

private:
  hid_t meta_;
  const std::string& path_;
};

LoraMeta read_lora(const Reader& r) {
  LoraMeta l;
  l.rank = r.i64("lora_rank");
  if (l.rank < 1 || l.rank > std::numeric_limits<int>::max())
    r.fail(fmt::format("/meta lora_rank = {} is not a rank", l.rank));
  l.alpha = r.real("lora_alpha");
  if (!(l.alpha > 0) || !std::isfinite(l.alpha))
    r.fail(fmt::format("/meta lora_alpha = {} is not positive", l.alpha));
  l.targets = r.text("lora_targets");
  l.quant_type = r.text("quant_type");
  l.quant_base = r.text("quant_base");
  l.base_hash = r.text("base_hash");
  return l;
}

RunMeta read_run(const Reader& r) {
  RunMeta s;
  s.loss_scale = r.real("loss_scale");
  for (const auto& [name, field] : kRunInt64) s.*field = r.i64(name);
  for (const auto& [name, field] : kRunUInt64) s.*field = r.u64(name);
  s.data_shuffle = r.i64("data_shuffle") != 0;
  s.data_path = r.text("data_path");
  return s;
}

// The counters of a training checkpoint against each other, as training
// keeps them: every step is either applied (AdamW steps once), skipped
// (train.on_nonfinite = skip) or overflowed (fp16); the loss scale's run of
// good steps is part of the applied ones; the data cursor has read at most
// batch_size (an int) windows per step (one step more, for a loader that
// reads ahead).
void check_run(const Reader& r, const Meta& m) {
  const RunMeta& s = *m.run;
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"skipped_steps", s.skipped_steps},
                                    {"overflow_steps", s.overflow_steps}})
    if (value < 0 || value > m.step)
      r.fail(fmt::format("/meta {} = {} does not lie in [0, step = {}]", name, value, m.step));
  const int64_t applied = m.step - s.skipped_steps - s.overflow_steps;
  if (m.adamw_step != applied)
    r.fail(fmt::format("/meta adamw_step = {}, but step {} less skipped_steps {} and "
                       "overflow_steps {} is {}: AdamW steps once per step not skipped",
                       m.adamw_step, m.step, s.skipped_steps, s.overflow_steps, applied));
  if (s.loss_scale_good_steps < 0 || s.loss_scale_good_steps > m.adamw_step)
    r.fail(fmt::format("/meta loss_scale_good_steps = {} does not lie in [0, adamw_step = {}]",
                       s.loss_scale_good_steps, m.adamw_step));
  if (s.data_windows_per_epoch < 1)
    r.fail("/meta data_windows_per_epoch = 0: an epoch has at least one window");
  if (s.data_position >= s.data_windows_per_epoch)
    r.fail(fmt::format("/meta data_position = {} is not below data_windows_per_epoch = {}",
                       s.data_position, s.data_windows_per_epoch));
  using u128 = unsigned __int128;
  const u128 read = u128{s.data_epoch} * s.data_windows_per_epoch + s.data_position;
  const u128 most = u128{static_cast<uint64_t>(m.step) + 1} * std::numeric_limits<int>::max();
  if (read > most)
    r.fail(fmt::format("/meta data_epoch = {} (data_position {}, {} windows per epoch) is past "
                       "any cursor {} steps can have reached",
                       s.data_epoch, s.data_position, s.data_windows_per_epoch, m.step));
}

}  // namespace

Meta read_meta(hid_t file, const std::string& path) {
  if (!h5::exists(file, "meta"))
    throw RankError(path + ": no /meta group: not a meshlm checkpoint", MESHLM_HERE);
  h5::Group group = h5::open_group(file, "meta");
  const Reader r(group, path);
  if (!r.has("kind") || r.text("kind") != kKind)
    r.fail(fmt::format("/meta has no attribute kind = '{}': not a meshlm checkpoint", kKind));
  const int64_t version = r.i64("format_version");
  if (version != kFormatVersion)
    r.fail(fmt::format("/meta format_version = {}; this meshlm reads version {}", version,
                       kFormatVersion));
  Meta m;
  m.sizes = {r.model_size("n_layer"), r.model_size("n_head"), r.model_size("n_embd"),
             r.model_size("vocab_size"), r.model_size("max_seq_len")};
  // The root repeats the sizes (a checkpoint is also a base file, read there
  // by quant.base): a file whose two copies disagree is not one meshlm wrote.
  for (const auto& [name, field] : kSizes) {
    if (!h5::has_attr(file, name)) continue;
    const int64_t root = h5::read_scalar_attr<int64_t>(file, name);
    if (root != m.sizes.*field)
      r.fail(fmt::format("the root attribute {} = {} differs from /meta {} = {}", name, root, name,
                         m.sizes.*field));
  }
  if (r.has("arch")) m.arch = r.text("arch");
  if (m.arch == "llama") {
    LlamaMeta l;
    for (const auto& [name, field] : kLlamaInt64) l.*field = r.i64(name);
    for (const auto& [name, field] : kLlamaReal) l.*field = r.real(name);
    m.llama = l;
  } else if (m.arch != "gpt2") {
    r.fail("/meta arch is '" + log::printable(m.arch) + "', neither 'gpt2' nor 'llama'");
  }
  const std::string mode = r.text("finetune_mode");
  if (mode != "full" && mode != "lora")
    r.fail("/meta finetune_mode is '" + log::printable(mode) + "', neither 'full' nor 'lora'");
  if (mode == "lora") m.lora = read_lora(r);
  m.step = r.i64("step");
  if (r.has("seed")) m.seed = r.i64("seed");
  if (r.has("hf_config")) m.hf_config = r.text("hf_config");
  if (r.has("loss_scale")) {  // a training checkpoint: all of it
    m.run = read_run(r);
    r.require("tokens_seen");
    r.require("adamw_step");
    r.require("seed");  // the data order of a resume depends on it
    m.seed = r.i64("seed");
  }
  if (r.has("tokens_seen")) m.tokens_seen = r.i64("tokens_seen");
  if (r.has("adamw_step")) m.adamw_step = r.i64("adamw_step");
  const double scale = m.run ? m.run->loss_scale : 1.0;
  if (m.step < 0 || m.adamw_step < 0 || m.adamw_step > m.step || !std::isfinite(scale) ||
      scale <= 0)
    r.fail(fmt::format("/meta holds an impossible state (step {}, adamw_step {}, loss_scale {})",
                       m.step, m.adamw_step, scale));
  if (m.tokens_seen < 0)
    r.fail(fmt::format("/meta tokens_seen = {} is negative", m.tokens_seen));
  if (m.run) check_run(r, m);
  return m;
}

}  // namespace meshlm::io::ckpt
