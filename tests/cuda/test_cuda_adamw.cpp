// cuda::adamw_step, sum_of_squares and scale against the CPU optimizer of
// train/adamw.h (AdamW::step, sum_of_squares, clip_to_norm's scaling).
//
// The table mixes matrices (decayed) and vectors (not), with odd sizes and a
// tensor larger than one grid row, so that segments of every kind and the
// grid-stride loop are covered. Parameters, moments and gradients are fresh
// random values; three steps run from the same start on both sides. Every
// test skips, with the reason, where no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/ops_cuda.h"
#include "cuda_test.h"
#include "model/param_table.h"
#include "train/adamw.h"

using namespace meshlm;

namespace {

// Both sides evaluate the same float expression per element; they may differ
// in FMA contraction (nvcc contracts a*b + c, the host compiler may not), a
// few ulp per step.
constexpr double kAdamTol = 1e-6;
// Sums of squares in double over 2^16-element blocks in a fixed order on
// both sides, but a different order inside a block.
constexpr double kNormTol = 1e-12;

std::vector<ParamSpec> make_table() {
  std::vector<ParamSpec> t;
  size_t offset = 0;
  for (Shape s : {Shape{37, 129}, Shape{129}, Shape{300001}, Shape{513, 1027}, Shape{1}, Shape{64, 3}}) {
    ParamSpec p;
    p.name = "t" + std::to_string(t.size());
    p.shape = s;
    p.full_shape = s;
    p.offset = offset;
    offset += p.numel();
    t.push_back(p);
  }
  return t;
}

double rel_diff(const std::vector<float>& got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::isfinite(num) ? std::sqrt(num / den) : INFINITY;
}

class CudaAdamW : public CudaTest {};

}  // namespace

// Three AdamW steps (lr changing, bias corrections of t = 1, 2, 3) give the
// CPU optimizer's parameters and moments; decayed and undecayed segments both.
// Steps 2 and 3 fuse an fp16 unscale and a global-norm clip into the update,
// which leaves the gradients as they were.
TEST_F(CudaAdamW, StepsMatchTheCpuOptimizer) {
  const std::vector<ParamSpec> table = make_table();
  const size_t n = table_numel(table);
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  AdamW cpu(table, cfg);
  std::vector<float> params = uniform_floats(n, 1, -1.0, 1.0);

  std::vector<cuda::AdamWSegment> segs;
  size_t max_count = 0;
  for (const ParamSpec& p : table) {
    segs.push_back({p.offset, p.numel(), p.decay()});
    max_count = std::max(max_count, p.numel());
  }
  DeviceArray<float> d_params(n), d_grads(n), d_m(n), d_v(n);
  DeviceArray<cuda::AdamWSegment> d_segs(segs.size());
  d_params.upload(params);
  d_segs.upload(segs);
  CUDA_CHECK(cudaMemset(d_m.get(), 0, n * sizeof(float)));
  CUDA_CHECK(cudaMemset(d_v.get(), 0, n * sizeof(float)));

  for (int t = 1; t <= 3; ++t) {
    const float lr = 1e-3f * t;
    const std::vector<float> grads = uniform_floats(n, 100 + t, -0.5, 0.5);
    const float unscale = t == 1 ? 1.0f : 1.0f / 4096.0f, clip = t == 3 ? 0.37f : 1.0f;
    cpu.step(params.data(), grads.data(), lr, unscale, clip);
    d_grads.upload(grads);
    const cuda::AdamWStep h{
        .lr = lr,
        .beta1 = float(cfg.beta1),
        .beta2 = float(cfg.beta2),
        .eps = float(cfg.eps),
        .weight_decay = float(cfg.weight_decay),
        .bias_correction1 = 1.0f - float(std::pow(double(float(cfg.beta1)), t)),
        .bias_correction2_sqrt = float(std::sqrt(1.0 - std::pow(double(float(cfg.beta2)), t))),
        .unscale = unscale,
        .clip = clip};
    cuda::adamw_step(d_params.get(), d_grads.get(), d_m.get(), d_v.get(), d_segs.get(),
                     static_cast<int>(segs.size()), max_count, h, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(rel_diff(d_params.download(), params.data(), n), kAdamTol) << "params, step " << t;
    EXPECT_LE(rel_diff(d_m.download(), cpu.m(), n), kAdamTol) << "m, step " << t;
    EXPECT_LE(rel_diff(d_v.download(), cpu.v(), n), kAdamTol) << "v, step " << t;
    EXPECT_EQ(d_grads.download(), grads) << "the step changed the gradients, step " << t;
  }
}

// The gradient norm's sum of squares, for sizes below, at and across the
// 2^16-element blocks, agrees with the CPU's; the same bits twice.
TEST_F(CudaAdamW, SumOfSquaresMatchesTheCpu) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 16, (size_t{1} << 16) + 1, size_t{3000017}}) {
    const std::vector<float> g = uniform_floats(n, n, -2.0, 2.0);
    DeviceArray<float> d_g(n);
    DeviceArray<double> d_out(1), d_scratch(cuda::sum_of_squares_scratch(n));
    d_g.upload(g);
    cuda::sum_of_squares(d_out.get(), d_scratch.get(), d_g.get(), n, nullptr);
    const double got = d_out.download()[0];
    cuda::sum_of_squares(d_out.get(), d_scratch.get(), d_g.get(), n, nullptr);
    const double again = d_out.download()[0];
    const double want = sum_of_squares(g.data(), n);
    EXPECT_LE(std::fabs(got - want), kNormTol * want) << "n = " << n;
    EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0) << "n = " << n;
  }
}

// Scaling multiplies every element once (the clip of a known global norm).
TEST_F(CudaAdamW, ScaleMultipliesEveryElement) {
  const size_t n = 1234567;
  std::vector<float> g = uniform_floats(n, 7, -3.0, 3.0);
  DeviceArray<float> d_g(n);
  d_g.upload(g);
  cuda::scale(d_g.get(), n, 0.37f, nullptr);
  const std::vector<float> got = d_g.download();
  for (float& x : g) x *= 0.37f;
  EXPECT_EQ(got, g);
}
