#include "load/hf_layout.h"

#include <regex>

namespace meshlm::load::hf {

const char* prefix(ModelArch arch) { return arch == ModelArch::llama ? "model." : "transformer."; }

Layout layout_of(const ParamSpec& p, ModelArch arch) {
  switch (p.role) {
    case ParamRole::token_embedding:
    case ParamRole::lm_head: return Layout::vocab_rows;
    case ParamRole::position_embedding: return Layout::first_rows;
    case ParamRole::linear_weight: return arch == ModelArch::gpt2 ? Layout::transposed : Layout::same;
    default: return Layout::same;
  }
}

std::vector<int64_t> file_shape(const ParamSpec& p, const GPTConfig& cfg) {
  std::vector<int64_t> d(p.full_shape.dims.begin(), p.full_shape.dims.begin() + p.full_shape.ndim);
  switch (layout_of(p, cfg.arch)) {
    case Layout::transposed: return {d[1], d[0]};
    case Layout::vocab_rows: return {cfg.vocab_size, d[1]};
    case Layout::same:
    case Layout::first_rows: break;
  }
  return d;
}

std::vector<std::string> file_names(const std::string& name, ModelArch arch) {
  return {name, std::string(prefix(arch)) + name};
}

std::string directory_name(const std::string& name, ModelArch arch) {
  if (arch == ModelArch::gpt2) return name;  // GPT2Model's names, as transformers saves GPT-2
  return name == "lm_head.weight" ? name : std::string(prefix(arch)) + name;
}

std::optional<long long> block_of(const std::string& file_name, ModelArch arch) {
  static const std::regex gpt2(R"(^(?:transformer\.)?h\.(\d+)\..*)");
  static const std::regex llama(R"(^(?:model\.)?layers\.(\d+)\..*)");
  std::smatch m;
  if (!std::regex_match(file_name, m, arch == ModelArch::llama ? llama : gpt2) || m[1].length() > 9)
    return std::nullopt;
  return std::stoll(m[1]);
}

}  // namespace meshlm::load::hf
