#include "load/hf_gpt2.h"

#include <regex>

namespace meshlm::load::hf {

Layout layout_of(const ParamSpec& p) {
  switch (p.role) {
    case ParamRole::token_embedding: return Layout::vocab_rows;
    case ParamRole::position_embedding: return Layout::first_rows;
    case ParamRole::linear_weight: return Layout::transposed;
    default: return Layout::same;
  }
}

std::vector<int64_t> file_shape(const ParamSpec& p, const GPTConfig& cfg) {
  std::vector<int64_t> d(p.full_shape.dims.begin(), p.full_shape.dims.begin() + p.full_shape.ndim);
  switch (layout_of(p)) {
    case Layout::transposed: return {d[1], d[0]};
    case Layout::vocab_rows: return {cfg.vocab_size, d[1]};
    case Layout::same:
    case Layout::first_rows: break;
  }
  return d;
}

std::vector<std::string> file_names(const std::string& name) {
  return {name, std::string(kPrefix) + name};
}

std::optional<long long> block_of(const std::string& file_name) {
  static const std::regex block(R"(^(?:transformer\.)?h\.(\d+)\..*)");
  std::smatch m;
  if (!std::regex_match(file_name, m, block) || m[1].length() > 9) return std::nullopt;
  return std::stoll(m[1]);
}

}  // namespace meshlm::load::hf
