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
  if (!v.is_number_integer() || v.get<long long>() < 1 ||
      v.get<long long>() > std::numeric_limits<int>::max())
    fail(path, std::string("'") + used + "' must be a positive integer (got " +
                   log::printable(v.dump(), 60) + ")");
  return static_cast<int>(v.get<long long>());
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

// `name` of the index as a file inside `dir` (symbolic links followed).
std::string inside(const std::string& dir, const std::string& index, const std::string& name) {
  if (name.empty() || fs::path(name).is_absolute())
    fail(index, "weight_map names '" + log::printable(name, 200) +
                    "', which is not a file name inside the directory");
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  const fs::path path = fs::path(dir) / name;
  if (!fs::exists(path, ec))
    fail(index, "weight_map names '" + log::printable(name, 200) + "', which does not exist");
  const fs::path real = fs::canonical(path, ec);
  if (ec) fail(index, "weight_map names '" + log::printable(name, 200) + "': " + ec.message());
  const auto [r, p] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  if (r != root.end())
    fail(index, "weight_map names '" + log::printable(name, 200) + "', which lies outside " +
                    root.string() + " (at " + real.string() + ")");
  if (!fs::is_regular_file(real, ec))
    fail(index, "weight_map names '" + log::printable(name, 200) + "', which is not a regular file");
  return path.string();
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
    fail(config, "has no string 'model_type' (meshlm reads gpt2)");
  const std::string type = j.at("model_type").get<std::string>();
  if (type != "gpt2")
    fail(config, "model_type '" + log::printable(type, 60) + "' is not one meshlm trains (gpt2)");
  d.model = gpt2_config(j, config);

  const std::string index = (fs::path(dir) / kHfIndex).string();
  const std::string single = (fs::path(dir) / kHfWeights).string();
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    if (!fs::exists(single, ec))
      fail(dir, std::string("holds neither ") + kHfWeights + " nor " + kHfIndex);
    d.shards = {single};
    return d;
  }
  const json x = read_json(index);
  if (!x.contains("weight_map") || !x.at("weight_map").is_object() || x.at("weight_map").empty())
    fail(index, "has no 'weight_map' object naming the tensors' files");
  std::set<std::string> seen;
  for (const auto& [tensor, file] : x.at("weight_map").items()) {
    if (!file.is_string())
      fail(index, "weight_map's '" + log::printable(tensor, 200) + "' is not a file name");
    const std::string path = inside(dir, index, file.get<std::string>());
    d.weight_map[tensor] = path;
    if (seen.insert(path).second) d.shards.push_back(path);
  }
  return d;
}

}  // namespace meshlm::load
