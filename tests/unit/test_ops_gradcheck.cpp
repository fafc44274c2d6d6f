// Every op's backward against central finite differences, in double
// precision, and every op's float version against its double version.
//
// For an op y = f(x) we take the scalar L = sum(R * y) with a fixed random R,
// so dL/dy = R is what backward receives, and compare the accumulated input
// and parameter gradients with (L(x + h) - L(x - h)) / 2h for every element.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"

using namespace meshlm;

namespace {

// Central differences in double with this step have truncation error ~h^2
// and rounding error ~1e-16 / h, both far below the tolerance.
constexpr double kStep = 1e-5;
constexpr double kGradTol = 1e-6;   // relative to the largest gradient of the tensor
constexpr double kFloatTol = 2e-5;  // float op vs double op, relative

std::vector<double> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * r.normal();
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks `analytic` = dL/dx against finite differences of `loss` over x.
void expect_matches_fd(std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, const char* what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + kStep;
    const double lp = loss();
    x[i] = keep - kStep;
    const double lm = loss();
    x[i] = keep;
    const double fd = (lp - lm) / (2 * kStep);
    max_ref = std::max(max_ref, std::fabs(fd));
    max_err = std::max(max_err, std::fabs(fd - analytic[i]));
  }
  EXPECT_GT(max_ref, 0.0) << what << ": gradient is identically zero, the check proves nothing";
  EXPECT_LE(max_err, kGradTol * max_ref) << what << ": max |fd - analytic| = " << max_err
                                         << ", max |fd| = " << max_ref;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

void expect_close(const std::vector<float>& f, const std::vector<double>& d, const char* what) {
  ASSERT_EQ(f.size(), d.size());
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(d[i]));
    max_err = std::max(max_err, std::fabs(f[i] - d[i]));
  }
  EXPECT_LE(max_err, kFloatTol * std::max(max_ref, 1e-30)) << what;
}

}  // namespace

TEST(OpsGradcheck, Matmul) {
  const int N = 5, IC = 7, OC = 6;
  auto x = randn(N * IC, 1), w = randn(OC * IC, 2), b = randn(OC, 3), R = randn(N * OC, 4);
  auto loss = [&] {
    std::vector<double> y(N * OC);
    ops::matmul_forward(y.data(), x.data(), w.data(), b.data(), N, IC, OC);
    return dot(y, R);
  };
  // Gradients accumulate: start from non-zero values and subtract them after.
  auto dx = randn(N * IC, 5), dw = randn(OC * IC, 6), db = randn(OC, 7);
  const auto dx0 = dx, dw0 = dw, db0 = db;
  ops::matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
  for (size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
  expect_matches_fd(x, dx, loss, "matmul dinp");
  expect_matches_fd(w, dw, loss, "matmul dw");
  expect_matches_fd(b, db, loss, "matmul dbias");

  std::vector<float> yf(N * OC);
  std::vector<double> yd(N * OC);
  auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b);
  ops::matmul_forward(yf.data(), xf.data(), wf.data(), bf.data(), N, IC, OC);
  ops::matmul_forward(yd.data(), x.data(), w.data(), b.data(), N, IC, OC);
  expect_close(yf, yd, "matmul float vs double");
}

TEST(OpsGradcheck, MatmulWithoutBias) {
  const int N = 4, IC = 3, OC = 5;
  auto x = randn(N * IC, 11), w = randn(OC * IC, 12), R = randn(N * OC, 13);
  auto loss = [&] {
    std::vector<double> y(N * OC);
    ops::matmul_forward<double>(y.data(), x.data(), w.data(), nullptr, N, IC, OC);
    return dot(y, R);
  };
  std::vector<double> dx(N * IC), dw(OC * IC);
  ops::matmul_backward<double>(dx.data(), dw.data(), nullptr, R.data(), x.data(), w.data(), N, IC, OC);
  expect_matches_fd(x, dx, loss, "matmul (no bias) dinp");
  expect_matches_fd(w, dw, loss, "matmul (no bias) dw");
}

TEST(OpsGradcheck, LayerNorm) {
  const int N = 6, C = 10;
  auto x = randn(N * C, 21, 2.0), w = randn(C, 22), b = randn(C, 23), R = randn(N * C, 24);
  for (int i = 0; i < N * C; ++i) x[i] += 0.5 * (i % C);  // non-zero means
  std::vector<double> y(N * C), mean(N), rstd(N);
  auto loss = [&] {
    ops::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(y, R);
  };
  loss();
  std::vector<double> dx(N * C), dw(C), db(C);
  ops::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  expect_matches_fd(x, dx, loss, "layernorm dinp");
  expect_matches_fd(w, dw, loss, "layernorm dw");
  expect_matches_fd(b, db, loss, "layernorm db");
}

TEST(OpsGradcheck, Attention) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 31), R = randn(B * T * C, 32);
  std::vector<double> y(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    ops::attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(y, R);
  };
  loss();
  std::vector<double> dqkv(qkv.size()), datt(att.size());
  ops::attention_backward(dqkv.data(), datt.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_matches_fd(qkv, dqkv, loss, "attention dqkv");

  // Causality: the output at t must not depend on inputs after t.
  std::vector<double> y0 = y;
  auto qkv2 = qkv;
  for (int c = 0; c < 3 * C; ++c) qkv2[(0 * T + T - 1) * 3 * C + c] += 1.0;  // last position of b=0
  ops::attention_forward(y.data(), att.data(), qkv2.data(), B, T, C, NH);
  for (int t = 0; t < T - 1; ++t)
    for (int c = 0; c < C; ++c) EXPECT_EQ(y[t * C + c], y0[t * C + c]) << "t=" << t;
}

TEST(OpsGradcheck, Gelu) {
  const size_t n = 50;
  auto x = randn(n, 41, 2.0), R = randn(n, 42);
  auto loss = [&] {
    std::vector<double> y(n);
    ops::gelu_forward(y.data(), x.data(), n);
    return dot(y, R);
  };
  std::vector<double> dx(n);
  ops::gelu_backward(dx.data(), x.data(), R.data(), n);
  expect_matches_fd(x, dx, loss, "gelu dinp");
  // Independent values: GELU_tanh(1) and GELU_tanh(-2) from the formula.
  double in[2] = {1.0, -2.0}, out[2];
  ops::gelu_forward(out, in, 2);
  EXPECT_NEAR(out[0], 0.8411919906082768, 1e-12);
  EXPECT_NEAR(out[1], -0.04540230591222, 1e-12);
}

TEST(OpsGradcheck, Residual) {
  const size_t n = 12;
  auto a = randn(n, 51), b = randn(n, 52), R = randn(n, 53);
  auto loss = [&] {
    std::vector<double> y(n);
    ops::residual_forward(y.data(), a.data(), b.data(), n);
    return dot(y, R);
  };
  std::vector<double> da(n), db(n);
  ops::residual_backward(da.data(), db.data(), R.data(), n);
  expect_matches_fd(a, da, loss, "residual da");
  expect_matches_fd(b, db, loss, "residual db");
}

TEST(OpsGradcheck, Encoder) {
  const int B = 2, T = 4, C = 3, V = 5, maxT = 6;
  const std::vector<int32_t> tokens = {1, 3, 1, 0, 4, 4, 2, 1};  // repeated ids on purpose
  auto wte = randn(V * C, 61), wpe = randn(maxT * C, 62), R = randn(B * T * C, 63);
  auto loss = [&] {
    std::vector<double> y(B * T * C);
    ops::encoder_forward(y.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(y, R);
  };
  std::vector<double> dwte(V * C), dwpe(maxT * C);
  ops::encoder_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, T, C);
  expect_matches_fd(wte, dwte, loss, "encoder dwte");
  expect_matches_fd(wpe, dwpe, loss, "encoder dwpe");
}

TEST(OpsGradcheck, SoftmaxCrossEntropyPaddedVocab) {
  const int N = 4, V = 11, Vp = 16;
  const std::vector<int32_t> targets = {0, 10, 5, 5};
  auto logits = randn(N * Vp, 71, 3.0), dl = randn(N, 72);
  // Padded logits larger than every real one: they must still never win.
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) logits[n * Vp + v] = 100.0;
  auto loss = [&] {
    std::vector<double> buf = logits, losses(N);
    ops::softmax_crossentropy_forward(losses.data(), buf.data(), targets.data(), N, V, Vp);
    return dot(losses, dl);
  };
  std::vector<double> buf = logits, losses(N);
  ops::softmax_crossentropy_forward(losses.data(), buf.data(), targets.data(), N, V, Vp);
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int v = 0; v < V; ++v) s += buf[n * Vp + v];
    EXPECT_NEAR(s, 1.0, 1e-12);
    for (int v = V; v < Vp; ++v) EXPECT_EQ(buf[n * Vp + v], 0.0);
  }
  ops::softmax_crossentropy_backward(buf.data(), dl.data(), targets.data(), N, V, Vp);
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) EXPECT_EQ(buf[n * Vp + v], 0.0) << "padded column got a gradient";
  // Over all Vp columns: the padded ones do not enter the loss, so their
  // finite differences are 0 too.
  expect_matches_fd(logits, buf, loss, "cross-entropy dlogits");
}
