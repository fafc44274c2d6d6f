#include "load/model_meta.h"

#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "io/h5.h"
#include "load/hf_dir.h"

namespace meshlm::load {

namespace ck = io::ckpt;

void set_model_meta(ck::Meta& m, const GPTConfig& g) {
  m.sizes = {g.n_layer, g.n_head, g.n_embd, g.vocab_size, g.max_seq_len};
  m.arch = name_of(g.arch);
  m.llama.reset();
  if (g.arch != ModelArch::llama) return;
  const ops::RopeScaling& r = g.rope_scaling;
  m.llama = ck::LlamaMeta{g.kv_heads(), g.mlp_width(), g.tie_word_embeddings ? 1 : 0, g.norm_eps,
                          g.rope_theta, r.factor, r.low_freq_factor, r.high_freq_factor,
                          r.original_max_positions};
}

GPTConfig model_of_meta(const ck::Meta& m) {
  GPTConfig g;
  g.n_layer = static_cast<int>(m.sizes.n_layer);
  g.n_head = static_cast<int>(m.sizes.n_head);
  g.n_embd = static_cast<int>(m.sizes.n_embd);
  g.vocab_size = static_cast<int>(m.sizes.vocab_size);
  g.max_seq_len = static_cast<int>(m.sizes.max_seq_len);
  g.arch = enum_from_name<ModelArch>(m.arch).value_or(ModelArch::gpt2);
  if (g.arch != ModelArch::llama || !m.llama) return g;
  const ck::LlamaMeta& l = *m.llama;
  g.n_kv_head = static_cast<int>(l.n_kv_head);
  g.intermediate_size = static_cast<int>(l.intermediate_size);
  g.tie_word_embeddings = l.tie_word_embeddings != 0;
  g.norm_eps = l.norm_eps;
  g.rope_theta = l.rope_theta;
  g.rope_scaling = {l.rope_factor, l.rope_low_freq_factor, l.rope_high_freq_factor,
                    static_cast<int>(l.rope_original_max_positions)};
  return g;
}

std::optional<GPTConfig> checkpoint_model(const std::string& path) {
  // Only a regular file is opened: a FIFO would block the reader forever
  // (the base's own reader names what it is).
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  if (!io::h5::is_hdf5_file(path)) return std::nullopt;
  io::h5::File f = io::h5::open_file(path);
  if (!io::h5::exists(f, "meta")) return std::nullopt;
  return model_of_meta(ck::read_meta(f, path));
}

std::string kept_hf_config(const std::string& base) {
  if (base.empty()) return "";
  if (is_directory(base)) return read_hf_directory(base).kept;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(base, ec) || !io::h5::is_hdf5_file(base)) return "";
  io::h5::File f = io::h5::open_file(base);
  if (!io::h5::exists(f, "meta")) return "";
  return ck::read_meta(f, base).hf_config;
}

std::string model_meta_difference(const ck::Meta& m, const GPTConfig& cfg,
                                  const std::string& here) {
  if (m.arch != name_of(cfg.arch))
    return fmt::format("model.arch = {} there, {} {}", m.arch, name_of(cfg.arch), here);
  return model_difference(model_of_meta(m), cfg, here);
}

std::string model_difference(const GPTConfig& t, const GPTConfig& cfg, const std::string& here) {
  if (t.arch != cfg.arch)
    return fmt::format("model.arch = {} there, {} {}", name_of(t.arch), name_of(cfg.arch), here);
  auto differs = [&](const char* key, const auto& there, const auto& ours) -> std::string {
    return there == ours ? "" : fmt::format("model.{} = {} there, {} {}", key, there, ours, here);
  };
  const ops::RopeScaling &a = t.rope_scaling, &b = cfg.rope_scaling;
  const bool llama = cfg.arch == ModelArch::llama;
  for (const std::string& d :
       {differs("n_layer", t.n_layer, cfg.n_layer), differs("n_head", t.n_head, cfg.n_head),
        differs("n_embd", t.n_embd, cfg.n_embd), differs("vocab_size", t.vocab_size, cfg.vocab_size),
        differs("max_seq_len", t.max_seq_len, cfg.max_seq_len),
        llama ? differs("n_kv_head", t.kv_heads(), cfg.kv_heads()) : "",
        llama ? differs("intermediate_size", t.mlp_width(), cfg.mlp_width()) : "",
        llama ? differs("tie_word_embeddings", t.tie_word_embeddings, cfg.tie_word_embeddings) : "",
        llama ? differs("norm_eps", t.norm_eps, cfg.norm_eps) : "",
        llama ? differs("rope_theta", t.rope_theta, cfg.rope_theta) : "",
        llama ? differs("rope_factor", a.factor, b.factor) : "",
        llama ? differs("rope_low_freq_factor", a.low_freq_factor, b.low_freq_factor) : "",
        llama ? differs("rope_high_freq_factor", a.high_freq_factor, b.high_freq_factor) : "",
        llama ? differs("rope_original_max_positions", a.original_max_positions,
                        b.original_max_positions)
              : ""})
    if (!d.empty()) return d;
  return "";
}

}  // namespace meshlm::load
