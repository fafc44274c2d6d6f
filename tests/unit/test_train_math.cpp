// AdamW, gradient clipping and the learning-rate schedule against closed
// forms written independently of train/ (the PyTorch comparison of several
// AdamW steps is tests/torch/check_adamw.py).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/gpt.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

using namespace meshlm;

TEST(AdamW, FirstStepClosedForm) {
  // From zero moments the bias-corrected first step is
  //   p1 = p0 (1 - lr wd [matrix]) - lr g / (|g| + eps).
  std::vector<ParamSpec> table = {{"w", {2, 3}, 0, -1, -1}, {"b", {3}, 6, -1, -1}};
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f, -0.25f, 1.0f, -2.0f, 0.125f};
  std::vector<float> g = {0.1f, -0.2f, 1e-3f, 5.0f, -7.0f, 0.0f, 0.3f, -0.4f, 2.0f};
  const AdamWConfig hp{0.9f, 0.95f, 1e-8f, 0.1f};
  const float lr = 0.01f;
  const auto p0 = p;
  AdamW opt(table, hp);
  opt.step(p.data(), g.data(), lr);
  for (size_t i = 0; i < p.size(); ++i) {
    const double decay = i < 6 ? 1.0 - lr * hp.weight_decay : 1.0;
    const double expect = p0[i] * decay - lr * g[i] / (std::fabs(g[i]) + hp.eps);
    EXPECT_NEAR(p[i], expect, 1e-6) << "element " << i;
  }
  EXPECT_EQ(opt.steps_taken(), 1);
}

TEST(AdamW, DecayOnlyOnMatrices) {
  // With zero gradients only decoupled weight decay moves the parameters.
  std::vector<ParamSpec> table = {{"m", {2, 2}, 0, -1, -1}, {"v", {4}, 4, -1, -1}};
  std::vector<float> p(8, 1.0f), g(8, 0.0f);
  AdamW opt(table, {0.9f, 0.999f, 1e-8f, 0.5f});
  opt.step(p.data(), g.data(), 0.1f);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(p[i], 0.95f);
  for (int i = 4; i < 8; ++i) EXPECT_FLOAT_EQ(p[i], 1.0f);
}

TEST(AdamW, FusedUnscaleAndClipAreTheInPlacePasses) {
  // step(..., unscale, clip) reads (g unscale) clip inside the update: the
  // same bits as scaling the gradients in place by each factor first, and
  // the gradients themselves are left as they were.
  std::vector<ParamSpec> table = {{"w", {3, 5}, 0, -1, -1}, {"b", {7}, 15, -1, -1}};
  const size_t n = 22;
  std::vector<float> pa(n), pb(n);
  for (size_t i = 0; i < n; ++i) pa[i] = pb[i] = std::sin(0.37 * double(i) + 0.1);
  const AdamWConfig hp{0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW fused(table, hp), passes(table, hp);
  const float unscale = 1.0f / 3072.0f;
  for (int t = 0; t < 4; ++t) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = 1000.0f * float(std::cos(1.3 * double(i) * (t + 1)));
    const double norm = grad_norm(g.data(), n) * unscale;
    const float clip = clip_coefficient(norm, 0.05);
    ASSERT_LT(clip, 1.0f);
    const auto g0 = g;
    fused.step(pa.data(), g.data(), 0.01f, unscale, clip);
    EXPECT_EQ(g, g0) << "the fused step changed the gradients";
    for (float& x : g) x *= unscale;
    for (float& x : g) x *= clip;
    passes.step(pb.data(), g.data(), 0.01f);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(pa[i], pb[i]) << "step " << t << " element " << i;
  }
}

TEST(GradClip, CoefficientIsTorchs) {
  EXPECT_EQ(clip_coefficient(13.0, 1.3), float(1.3 / (13.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);   // below the limit
  EXPECT_EQ(clip_coefficient(50.0, 0.0), 1.0f);  // clipping off
}

TEST(GradClip, ScalesToMaxNorm) {
  std::vector<float> g = {3.0f, 4.0f, 0.0f, 12.0f};  // norm 13
  const double norm = clip_grad_norm(g.data(), g.size(), 1.3);
  EXPECT_NEAR(norm, 13.0, 1e-12);
  const double coef = 1.3 / (13.0 + 1e-6);
  EXPECT_NEAR(g[0], 3.0 * coef, 1e-6);
  EXPECT_NEAR(g[3], 12.0 * coef, 1e-6);
  // Below the limit nothing changes; 0 turns clipping off.
  std::vector<float> h = {0.3f, 0.4f};
  EXPECT_NEAR(clip_grad_norm(h.data(), 2, 1.0), 0.5, 1e-7);
  EXPECT_EQ(h[0], 0.3f);
  std::vector<float> k = {30.0f, 40.0f};
  EXPECT_NEAR(clip_grad_norm(k.data(), 2, 0.0), 50.0, 1e-12);
  EXPECT_EQ(k[1], 40.0f);
}

TEST(GradClip, NormIndependentOfLength) {
  // Long enough to span several of grad_norm's blocks.
  std::vector<float> g(300001, 0.5f);
  EXPECT_NEAR(grad_norm(g.data(), g.size()), 0.5 * std::sqrt(300001.0), 1e-9);
}

TEST(LRSchedule, WarmupThenCosine) {
  const LRSchedule s{1.0, 0.1, 10, 110};
  // Warmup: linear from lr/W at step 0 to lr at step W-1.
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  // Cosine from lr at step W to lr_min at the end; halfway is the midpoint.
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  for (int step = 10; step < 110; ++step) {
    const double progress = (step - 10) / 100.0;
    const double expect = 0.1 + 0.45 * (1 + std::cos(M_PI * progress));
    EXPECT_NEAR(s.at(step), expect, 1e-12) << "step " << step;
    EXPECT_LE(s.at(step + 1), s.at(step));
  }
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
}

TEST(LRSchedule, NoWarmup) {
  const LRSchedule s{3e-4, 0.0, 0, 4};
  EXPECT_DOUBLE_EQ(s.at(0), 3e-4);
  EXPECT_NEAR(s.at(2), 1.5e-4, 1e-15);
}
