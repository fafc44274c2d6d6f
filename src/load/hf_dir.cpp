#include "load/hf_dir.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace meshlm::load {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw RankError("Hugging Face directory: '" + file + "': " + what, MESHLM_HERE);
}

json read_json(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "no such file");
  if (!fs::is_regular_file(path, ec)) fail(path, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  try {
    json j = json::parse(text.str());
    if (!j.is_object()) fail(path, "is not a JSON object");
    return j;
  } catch (const json::parse_error& e) {
    fail(path, std::string("is not valid JSON: ") + log::printable(e.what(), 200));
  }
}

// A positive integer of config.json; `alt` is an older name of the same key.
int int_key(const json& j, const std::string& path, const char* key, const char* alt = nullptr) {
  const char* used = j.contains(key) || alt == nullptr ? key : alt;
  if (!j.contains(used))
    fail(path, std::string("has no key '") + key + "'" + (alt ? std::string(" (nor '") + alt + "')" : ""));
  const json& v = j.at(used);
  // transformers takes a float of an integer's value (32.0) as that integer.
  const bool integral = v.is_number_integer() ||
                        (v.is_number_float() && std::isfinite(v.get<double>()) &&
                         v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 1e15);
  const long long n = integral ? (v.is_number_integer() ? v.get<long long>()
                                                         : static_cast<long long>(v.get<double>()))
                               : 0;
  if (!integral || n < 1 || n > std::numeric_limits<int>::max())
    fail(path, std::string("'") + used + "' must be a positive integer (got " +
                   log::printable(v.dump(), 60) + ")");
  return static_cast<int>(n);
}

// GPT-2's config.json.
GPTConfig gpt2_config(const json& j, const std::string& path) {
  GPTConfig c;
  c.arch = ModelArch::gpt2;
  c.n_layer = int_key(j, path, "n_layer");
  c.n_head = int_key(j, path, "n_head");
  c.n_embd = int_key(j, path, "n_embd");
  c.vocab_size = int_key(j, path, "vocab_size");
  c.max_seq_len = int_key(j, path, "n_positions", "n_ctx");
  if (j.contains("activation_function")) {
    const json& a = j.at("activation_function");
    const std::string s = a.is_string() ? a.get<std::string>() : a.dump();
    if (s != "gelu_new" && s != "gelu_pytorch_tanh")
      fail(path, "activation_function '" + log::printable(s, 60) +
                     "' is not GPT-2's tanh GELU (gelu_new), which meshlm computes");
  }
  if (j.contains("layer_norm_epsilon")) {
    const json& e = j.at("layer_norm_epsilon");
    if (!e.is_number() || std::fabs(e.get<double>() - 1e-5) > 1e-12)
      fail(path, "layer_norm_epsilon " + log::printable(e.dump(), 60) +
                     " is not 1e-5, the LayerNorm eps meshlm's GPT-2 uses");
  }
  if (j.contains("tie_word_embeddings") && j.at("tie_word_embeddings") != json(true))
    fail(path, "tie_word_embeddings must be true for GPT-2 (its lm_head is wte)");
  return c;
}

// A number of config.json, `fallback` where the key is absent.
double number_key(const json& j, const std::string& path, const char* key, double fallback,
                  bool positive = true) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  const json& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || (positive && v.get<double>() <= 0))
    fail(path, std::string("'") + key + "' must be a " + (positive ? "positive " : "") +
                   "number (got " + log::printable(v.dump(), 60) + ")");
  return v.get<double>();
}

// A key that, where present, must be `want` for meshlm to compute the model.
void must_be(const json& j, const std::string& path, const char* key, const json& want,
             const std::string& why) {
  if (j.contains(key) && !j.at(key).is_null() && j.at(key) != want)
    fail(path, std::string("'") + key + "' is " + log::printable(j.at(key).dump(), 60) + "; " + why);
}

// Llama's rope scaling: rope_scaling (or transformers 5's rope_parameters),
// absent, null, of type "default" or of type "llama3" with its four keys.
ops::RopeScaling llama_rope_scaling(const json& j, const std::string& path) {
  // transformers: rope_scaling or rope_parameters (a null or empty
  // rope_scaling gives way).
  const auto given = [&](const char* k) {
    return j.contains(k) && !j.at(k).is_null() && !(j.at(k).is_object() && j.at(k).empty());
  };
  const char* key = given("rope_scaling") || !given("rope_parameters") ? "rope_scaling" : "rope_parameters";
  ops::RopeScaling r;
  if (!j.contains(key) || j.at(key).is_null()) return r;
  const json& s = j.at(key);
  if (!s.is_object()) fail(path, std::string("'") + key + "' must be an object or null");
  const char* type_key = s.contains("rope_type") ? "rope_type" : "type";
  const std::string type =
      s.contains(type_key) && s.at(type_key).is_string() ? s.at(type_key).get<std::string>() : "";
  if (type == "default") return r;
  if (type != "llama3")
    fail(path, std::string("'") + key + "' of type '" + log::printable(type, 60) +
                   "': meshlm computes Llama 3's scaling (\"llama3\") or none");
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if (!s.contains(k)) fail(path, std::string("'") + key + "' of type llama3 has no '" + k + "'");
  r.factor = number_key(s, path, "factor", 0);
  r.low_freq_factor = number_key(s, path, "low_freq_factor", 0);
  r.high_freq_factor = number_key(s, path, "high_freq_factor", 0);
  r.original_max_positions = int_key(s, path, "original_max_position_embeddings");
  if (r.factor < 1 || r.high_freq_factor <= r.low_freq_factor)
    fail(path, std::string("'") + key + "': factor must be at least 1 and high_freq_factor above "
               "low_freq_factor");
  return r;
}

// A Llama-family config.json (LlamaConfig's keys and defaults).
GPTConfig llama_config(const json& j, const std::string& path) {
  GPTConfig c;
  c.arch = ModelArch::llama;
  c.n_layer = int_key(j, path, "num_hidden_layers");
  c.n_head = int_key(j, path, "num_attention_heads");
  c.n_kv_head = j.contains("num_key_value_heads") && !j.at("num_key_value_heads").is_null()
                    ? int_key(j, path, "num_key_value_heads")
                    : c.n_head;
  c.n_embd = int_key(j, path, "hidden_size");
  c.intermediate_size = int_key(j, path, "intermediate_size");
  c.vocab_size = int_key(j, path, "vocab_size");
  c.max_seq_len = int_key(j, path, "max_position_embeddings");
  c.norm_eps = number_key(j, path, "rms_norm_eps", 1e-6);
  const json& params = j.contains("rope_parameters") && j.at("rope_parameters").is_object()
                           ? j.at("rope_parameters")
                           : j;
  c.rope_theta = number_key(params, path, "rope_theta", number_key(j, path, "rope_theta", 10000));
  c.rope_scaling = llama_rope_scaling(j, path);
  if (j.contains("tie_word_embeddings")) {
    if (!j.at("tie_word_embeddings").is_boolean())
      fail(path, "'tie_word_embeddings' must be true or false");
    c.tie_word_embeddings = j.at("tie_word_embeddings").get<bool>();
  } else {
    c.tie_word_embeddings = false;  // LlamaConfig's default
  }
  must_be(j, path, "hidden_act", "silu", "meshlm's Llama MLP is SwiGLU (silu)");
  must_be(j, path, "attention_bias", false, "meshlm's Llama attention has no biases");
  must_be(j, path, "mlp_bias", false, "meshlm's Llama MLP has no biases");
  must_be(j, path, "pretraining_tp", 1, "meshlm computes the unsplit layers (pretraining_tp 1)");
  if (c.n_embd % c.n_head != 0)
    fail(path, "hidden_size " + std::to_string(c.n_embd) + " is not a multiple of num_attention_heads " +
                   std::to_string(c.n_head) + (j.contains("head_dim") ? " (head_dim " +
                   log::printable(j.at("head_dim").dump(), 20) + ")" : std::string()) +
                   ": meshlm's heads are hidden_size / num_attention_heads wide");
  must_be(j, path, "head_dim", c.n_embd / c.n_head,
          "meshlm's heads are hidden_size / num_attention_heads = " +
              std::to_string(c.n_embd / c.n_head) + " wide");
  if (c.n_head % c.n_kv_head != 0)
    fail(path, "num_attention_heads " + std::to_string(c.n_head) +
                   " is not a multiple of num_key_value_heads " + std::to_string(c.n_kv_head));
  return c;
}

// Whether `real` (a resolved path) is a file of Hugging Face's download
// cache that the snapshot `root` (<repo>/snapshots/<revision>, resolved)
// links to: <repo>/blobs/<hash>.
bool in_hub_blobs(const fs::path& root, const fs::path& real) {
  const fs::path snapshots = root.parent_path();
  return snapshots.filename() == "snapshots" &&
         real.parent_path() == snapshots.parent_path() / "blobs";
}

// The file `name` of `dir`, which `what` ("weight_map names 'x'") names in
// errors about `file`: inside `dir` once symbolic links are followed, or a
// link of a snapshot of Hugging Face's download cache to its blobs.
std::string inside(const std::string& dir, const std::string& file, const std::string& what,
                   const std::string& name) {
  if (name.empty() || fs::path(name).is_absolute())
    fail(file, what + ", which is not a file name inside the directory");
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  const fs::path lexical = fs::path(name).lexically_normal();
  if (lexical.empty() || *lexical.begin() == "..")
    fail(file, what + ", which lies outside " + root.string());
  const fs::path path = fs::path(dir) / name;
  if (!fs::exists(path, ec)) fail(file, what + ", which does not exist");
  const fs::path real = fs::canonical(path, ec);
  if (ec) fail(file, what + ": " + ec.message());
  const auto [r, p] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  if (r != root.end() && !(fs::is_symlink(path, ec) && in_hub_blobs(root, real)))
    fail(file, what + ", which lies outside " + root.string() + " (at " + real.string() + ")");
  if (!fs::is_regular_file(real, ec)) fail(file, what + ", which is not a regular file");
  return path.string();
}

// config.json's kKeptConfigKeys, as a JSON object ("" for none).
std::string kept_keys(const json& j) {
  json kept = json::object();
  for (const char* k : kKeptConfigKeys)
    if (j.contains(k) && !j.at(k).is_null()) kept[k] = j.at(k);
  return kept.empty() ? "" : kept.dump();
}

}  // namespace

bool is_directory(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec);
}

HfDirectory read_hf_directory(const std::string& dir) {
  HfDirectory d;
  d.dir = dir;
  const std::string config = (fs::path(dir) / kHfConfig).string();
  const json j = read_json(config);
  if (!j.contains("model_type") || !j.at("model_type").is_string())
    fail(config, "has no string 'model_type' (meshlm reads gpt2 and llama)");
  const std::string type = j.at("model_type").get<std::string>();
  if (type == "gpt2")
    d.model = gpt2_config(j, config);
  else if (type == "llama")
    d.model = llama_config(j, config);
  else
    fail(config, "model_type '" + log::printable(type, 60) +
                     "' is not one meshlm trains (gpt2, llama)");
  d.kept = kept_keys(j);

  const std::string index = (fs::path(dir) / kHfIndex).string();
  const std::string single = (fs::path(dir) / kHfWeights).string();
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    if (!fs::exists(single, ec))
      fail(dir, std::string("holds neither ") + kHfWeights + " nor " + kHfIndex);
    d.shards = {inside(dir, dir, std::string("'") + kHfWeights + "'", kHfWeights)};
    return d;
  }
  const json x = read_json(index);
  if (!x.contains("weight_map") || !x.at("weight_map").is_object() || x.at("weight_map").empty())
    fail(index, "has no 'weight_map' object naming the tensors' files");
  std::set<std::string> seen;
  for (const auto& [tensor, file] : x.at("weight_map").items()) {
    if (!file.is_string())
      fail(index, "weight_map's '" + log::printable(tensor, 200) + "' is not a file name");
    const std::string path = inside(dir, index, "weight_map names '" + log::printable(file.get<std::string>(), 200) + "'",
                                    file.get<std::string>());
    d.weight_map[tensor] = path;
    if (seen.insert(path).second) d.shards.push_back(path);
  }
  return d;
}

std::string hf_config_json(const GPTConfig& cfg, const std::string& dtype,
                           const std::map<std::string, std::string>& origin,
                           const std::string& kept) {
  json j;
  if (cfg.arch == ModelArch::llama) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["num_hidden_layers"] = cfg.n_layer;
    j["num_attention_heads"] = cfg.n_head;
    j["num_key_value_heads"] = cfg.kv_heads();
    j["hidden_size"] = cfg.n_embd;
    j["head_dim"] = cfg.head_size();
    j["intermediate_size"] = cfg.mlp_width();
    j["vocab_size"] = cfg.vocab_size;
    j["max_position_embeddings"] = cfg.max_seq_len;
    j["rms_norm_eps"] = cfg.norm_eps;
    j["rope_theta"] = cfg.rope_theta;
    const ops::RopeScaling& r = cfg.rope_scaling;
    if (r.factor > 0)
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r.factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"original_max_position_embeddings", r.original_max_positions}};
    else
      j["rope_scaling"] = nullptr;
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["tie_word_embeddings"] = cfg.tie_word_embeddings;
  } else {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["n_layer"] = cfg.n_layer;
    j["n_head"] = cfg.n_head;
    j["n_embd"] = cfg.n_embd;
    j["vocab_size"] = cfg.vocab_size;
    j["n_positions"] = cfg.max_seq_len;
    j["n_ctx"] = cfg.max_seq_len;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = 1e-5;
    j["tie_word_embeddings"] = true;
  }
  if (!kept.empty()) {
    const json k = json::parse(kept, nullptr, /*allow_exceptions=*/false);
    if (!k.is_object())
      throw RankError("the kept config.json keys (/meta hf_config) are not a JSON object: " +
                          log::printable(kept, 200),
                      MESHLM_HERE);
    for (const auto& [key, value] : k.items()) {
      // GPT-2's n_positions is its position table's rows: never replaced.
      if (key == "max_position_embeddings" && cfg.arch != ModelArch::llama) continue;
      j[key] = value;
    }
    if (cfg.arch == ModelArch::llama && k.contains("max_position_embeddings") &&
        (!k.at("max_position_embeddings").is_number_integer() ||
         k.at("max_position_embeddings").get<long long>() < cfg.max_seq_len))
      j["max_position_embeddings"] = cfg.max_seq_len;
  }
  j["torch_dtype"] = dtype;
  j["meshlm"] = origin;
  return j.dump(2) + "\n";
}

std::vector<uint32_t> eos_token_ids(const std::string& dir, const std::string& kept) {
  json j;
  std::string from = "/meta hf_config";
  const fs::path generation = fs::path(dir) / "generation_config.json";
  std::error_code ec;
  if (!dir.empty() && fs::exists(generation, ec)) {
    from = generation.string();
    j = read_json(from);
  }
  if (!j.contains("eos_token_id") && !kept.empty()) {
    from = "/meta hf_config";
    j = json::parse(kept, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) fail(from, "is not a JSON object");
  }
  if (!j.is_object() || !j.contains("eos_token_id") || j.at("eos_token_id").is_null()) return {};
  const json& v = j.at("eos_token_id");
  std::vector<uint32_t> ids;
  for (const json& e : v.is_array() ? v : json::array({v})) {
    if (!e.is_number_integer() || e.get<long long>() < 0 ||
        e.get<long long>() > std::numeric_limits<uint32_t>::max())
      fail(from, "'eos_token_id' must be a token id or a list of them (got " +
                     log::printable(v.dump(), 60) + ")");
    ids.push_back(static_cast<uint32_t>(e.get<long long>()));
  }
  return ids;
}

bool written_by_meshlm(const std::string& dir) {
  const fs::path config = fs::path(dir) / kHfConfig;
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return false;
  std::ifstream in(config, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("meshlm") && j.at("meshlm").is_object();
}

}  // namespace meshlm::load
