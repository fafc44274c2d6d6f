// AdamW (decoupled weight decay, bias-corrected moments) over the flat
// parameter buffer, and global gradient-norm clipping.
//
// Per element, at step t = 1, 2, ... (as torch.optim.AdamW):
//   p -= lr * wd * p                 (matrices only: ParamSpec::decay())
//   m  = b1 m + (1 - b1) g
//   v  = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/alloc.h"
#include "model/param_table.h"
#include "ops/kernels.h"

namespace meshlm {

// As the parameter file gives them ([train] beta1, beta2, eps,
// weight_decay); the update runs in float.
struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // CollectiveError naming the key when out of range.
  void validate() const;
};

class AdamW {
public:
  // Moments (category: optimizer) for the elements [begin, end) of the flat
  // buffer laid out by `table`: the whole table by default, this rank's
  // shard under ZeRO (which may reach into the padding past the table). They
  // live where `kernels` computes (which must outlive the optimizer), and so
  // must the buffers given to step().
  AdamW(const std::vector<ParamSpec>& table, const AdamWConfig& cfg, size_t begin = 0,
        size_t end = SIZE_MAX, const ops::Kernels& kernels = ops::Kernels::cpu());
  // One step of the elements [begin, end): `params` is the whole flat buffer,
  // `grads` the gradients of those elements (grads[0] belongs to element begin),
  // read as (grads unscale) clip (ops::AdamWHyper) and left as they are: the
  // same bits as scaling them in place by each factor first.
  void step(float* params, const float* grads, float lr, float unscale = 1.0f,
            float clip = 1.0f);
  // The tensors' parts inside [begin, end), relative to begin, in table order.
  const std::vector<ops::AdamWSegment>& segments() const { return segments_; }
  int64_t steps_taken() const { return t_; }
  // A resumed run continues the bias correction from a checkpoint's count.
  void set_steps_taken(int64_t t) { t_ = t; }
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  const float* m() const { return m_.as<float>(); }
  const float* v() const { return v_.as<float>(); }
  float* m() { return m_.as<float>(); }  // where the optimizer computes (checkpoints)
  float* v() { return v_.as<float>(); }

private:
  std::vector<ParamSpec> table_;
  AdamWConfig cfg_;
  size_t begin_ = 0, end_ = 0;
  const ops::Kernels& k_;
  std::vector<ops::AdamWSegment> segments_;
  int64_t t_ = 0;
  Buffer m_, v_;
};

// sum g^2 over n elements, accumulated in double in a fixed order (the
// result does not depend on the number of threads).
double sum_of_squares(const float* grads, size_t n);
// sqrt(sum_of_squares(grads, n)).
inline double grad_norm(const float* grads, size_t n) { return std::sqrt(sum_of_squares(grads, n)); }
// Scales grads so that their norm is at most max_norm, as
// torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6)).
// Returns the norm before clipping. max_norm <= 0 disables clipping.
double clip_grad_norm(float* grads, size_t n, double max_norm);
// The factor clip_grad_norm scales by: min(1, max_norm / (norm + 1e-6)) in
// float, 1 when max_norm <= 0.
float clip_coefficient(double norm, double max_norm);
// The scaling step of clip_grad_norm, for gradients whose (global) norm is
// already known: the shards of a distributed step (on the backend of `k`).
void clip_to_norm(float* grads, size_t n, double norm, double max_norm,
                  const ops::Kernels& k = ops::Kernels::cpu());

}  // namespace meshlm
