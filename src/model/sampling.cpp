// The next token from a row of logits (model/sampling.h).
#include "model/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace meshlm {

uint32_t argmax(std::span<const float> logits) {
  MESHLM_CHECK(!logits.empty(), "argmax of no logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<uint32_t>(best);
}

uint32_t Sampler::next(std::span<const float> logits, Rng& rng) {
  if (o_.temperature == 0 || o_.top_k == 1) return argmax(logits);
  const size_t V = logits.size();
  // softmax(logits / T) in double, from the largest logit.
  const double mx = logits[argmax(logits)];
  p_.resize(V);
  double sum = 0;
  for (size_t i = 0; i < V; ++i) {
    p_[i] = std::exp((static_cast<double>(logits[i]) - mx) / o_.temperature);
    sum += p_[i];
  }
  for (double& x : p_) x /= sum;
  // The ids by probability, highest first; top-k's prefix only needs sorting.
  order_.resize(V);
  for (size_t i = 0; i < V; ++i) order_[i] = static_cast<uint32_t>(i);
  auto higher = [&](uint32_t a, uint32_t b) { return p_[a] > p_[b] || (p_[a] == p_[b] && a < b); };
  size_t kept = V;
  if (o_.top_k > 0 && static_cast<size_t>(o_.top_k) < V) {
    kept = static_cast<size_t>(o_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + kept, order_.end(), higher);
  } else {
    std::sort(order_.begin(), order_.end(), higher);
  }
  double mass = 0;
  for (size_t i = 0; i < kept; ++i) mass += p_[order_[i]];
  if (o_.top_p < 1) {
    // The shortest prefix holding top_p of the kept mass.
    double c = 0;
    size_t n = 0;
    while (n < kept) {
      c += p_[order_[n++]];
      if (c >= o_.top_p * mass) break;
    }
    kept = n;
    mass = c;
  }
  const double u = rng.uniform() * mass;
  double c = 0;
  for (size_t i = 0; i < kept; ++i) {
    c += p_[order_[i]];
    if (u < c) return order_[i];
  }
  return order_[kept - 1];  // u within rounding of the whole mass
}

}  // namespace meshlm
