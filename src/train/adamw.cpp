#include "train/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace meshlm {

void AdamWConfig::validate() const {
  auto fail = [](const char* msg) { throw CollectiveError(msg, MESHLM_HERE); };
  // Written so that NaN fails every test.
  if (!(weight_decay >= 0 && std::isfinite(weight_decay))) fail("train.weight_decay must be finite and >= 0");
  if (!(beta1 >= 0 && beta1 < 1)) fail("train.beta1 must lie in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) fail("train.beta2 must lie in [0, 1)");
  if (!(eps > 0 && std::isfinite(eps))) fail("train.eps must be finite and > 0");
}

AdamW::AdamW(const std::vector<ParamSpec>& table, const AdamWConfig& cfg, size_t begin,
             size_t end, const ops::Kernels& kernels)
    : table_(table),
      cfg_(cfg),
      begin_(begin),
      end_(end == SIZE_MAX ? table_numel(table) : end),
      k_(kernels) {
  MESHLM_CHECK(begin_ <= end_, "AdamW range is reversed");
  segments_ = table_segments(table_, begin_, end_);
  // A ZeRO shard may reach into the padding past the table: its moments are
  // still end - begin long, so every DP rank holds the same bytes.
  const size_t n = end_ - begin_;
  m_ = Buffer(n * sizeof(float), MemCategory::optimizer, "adamw.m", k_.device());
  v_ = Buffer(n * sizeof(float), MemCategory::optimizer, "adamw.v", k_.device());
}

void AdamW::step(float* params, const float* grads, float lr, float unscale, float clip) {
  ++t_;
  // The update runs in float: the hyperparameters are rounded to float once.
  ops::AdamWHyper h{};
  h.lr = lr;
  h.beta1 = static_cast<float>(cfg_.beta1);
  h.beta2 = static_cast<float>(cfg_.beta2);
  h.eps = static_cast<float>(cfg_.eps);
  h.weight_decay = static_cast<float>(cfg_.weight_decay);
  h.bias_correction1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta1), t_));
  h.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t_)));
  h.unscale = unscale;
  h.clip = clip;
  k_.adamw_update(params + begin_, grads, m_.as<float>(), v_.as<float>(), segments_, h);
}

double sum_of_squares(const float* grads, size_t n) { return ops::sum_of_squares(grads, n); }

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef >= 1.0 ? 1.0f : static_cast<float>(coef);
}

void clip_to_norm(float* grads, size_t n, double norm, double max_norm, const ops::Kernels& k) {
  const float coef = clip_coefficient(norm, max_norm);
  if (coef != 1.0f) k.scale(grads, coef, n);
}

double clip_grad_norm(float* grads, size_t n, double max_norm) {
  const double norm = grad_norm(grads, n);
  clip_to_norm(grads, n, norm, max_norm);
  return norm;
}

}  // namespace meshlm
