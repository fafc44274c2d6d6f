// Every op's backward against central finite differences, in double
// precision, and every op's float version against its double version.
//
// For an op y = f(x) we take the scalar L = sum(R * y) with a fixed random R,
// so dL/dy = R is what backward receives, and compare the input and parameter
// gradients with (L(x + h) - L(x - h)) / 2h for every element. Parameter
// gradients accumulate and start from non-zero values; the input gradients
// of matmul, attention and GELU are overwritten and start as NaN (ops/ops.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/ops.h"

using namespace meshlm;

namespace {

// Central differences in double with this step have truncation error ~h^2
// and rounding error ~1e-16 / h, both far below the tolerance.
constexpr double kStep = 1e-5;
constexpr double kGradTol = 1e-6;   // relative to the largest gradient of the tensor
constexpr double kFloatTol = 2e-5;  // float op vs double op, relative
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

// Checks `analytic` = dL/dx against finite differences of `loss` over x. With
// may_be_zero, x may be a tensor the loss does not read at all (a part holding
// only vocabulary padding): then both sides must be exactly 0.
void expect_matches_fd(std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, const char* what,
                       bool may_be_zero = false) {
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
  if (!may_be_zero)
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
  // dw and db accumulate: start from non-zero values and subtract them after;
  // dx is overwritten: it starts as NaN.
  std::vector<double> dx(N * IC, kNaN);
  auto dw = randn(OC * IC, 6), db = randn(OC, 7);
  const auto dw0 = dw, db0 = db;
  ops::matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
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
  std::vector<double> dx(N * IC, kNaN), dw(OC * IC);
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
  std::vector<double> dqkv(qkv.size(), kNaN), datt(att.size());  // dqkv overwritten
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

// Flash attention keeps each row's log-sum-exp instead of the probabilities.
// T = 70 spans two blocks of 64 query rows (the second of 6), so a block's
// keys, the mask at its diagonal and the rows past its end are all crossed.
TEST(OpsGradcheck, FlashAttention) {
  const int B = 2, T = 70, C = 8, NH = 2, HS = C / NH;
  auto qkv = randn(B * T * 3 * C, 35), R = randn(B * T * C, 36);
  std::vector<double> y(B * T * C), lse(B * NH * T);
  auto loss = [&] {
    ops::flash_attention_forward(y.data(), lse.data(), qkv.data(), B, T, C, NH);
    return dot(y, R);
  };
  loss();
  // The output is the probabilities' (to rounding), and lse is log sum_s
  // exp(q_t . k_s / sqrt(HS)) over s <= t, summed here directly.
  std::vector<double> y_ref(y.size()), att(B * NH * T * T);
  ops::attention_forward(y_ref.data(), att.data(), qkv.data(), B, T, C, NH);
  double max_y = 0, err_y = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_y = std::max(max_y, std::fabs(y_ref[i]));
    err_y = std::max(err_y, std::fabs(y[i] - y_ref[i]));
  }
  EXPECT_LE(err_y, 1e-12 * max_y);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double sum = 0;
        for (int s = 0; s <= t; ++s) {
          double dot_qk = 0;
          for (int d = 0; d < HS; ++d)
            dot_qk += qkv[(b * T + t) * 3 * C + h * HS + d] * qkv[(b * T + s) * 3 * C + C + h * HS + d];
          sum += std::exp(dot_qk / std::sqrt(double(HS)));
        }
        EXPECT_NEAR(lse[(b * NH + h) * T + t], std::log(sum), 1e-12) << b << " " << h << " " << t;
      }
  // The backward overwrites dqkv: it starts as NaN.
  std::vector<double> dqkv(qkv.size(), kNaN), delta(lse.size());
  ops::flash_attention_backward(dqkv.data(), delta.data(), R.data(), y.data(), qkv.data(),
                                lse.data(), B, T, C, NH);
  const std::vector<double> analytic = dqkv;
  expect_matches_fd(qkv, analytic, loss, "flash attention dqkv");
  loss();  // y and lse of the unperturbed qkv again

  // float against double, forward and backward.
  auto qkv_f = cast<float>(qkv), R_f = cast<float>(R);
  std::vector<float> y_f(y.size()), lse_f(lse.size()), dqkv_f(qkv.size(), kNaN),
      delta_f(lse.size());
  ops::flash_attention_forward(y_f.data(), lse_f.data(), qkv_f.data(), B, T, C, NH);
  expect_close(y_f, y, "flash attention float out");
  expect_close(lse_f, lse, "flash attention float lse");
  ops::flash_attention_backward(dqkv_f.data(), delta_f.data(), R_f.data(), y_f.data(),
                                qkv_f.data(), lse_f.data(), B, T, C, NH);
  expect_close(dqkv_f, analytic, "flash attention float dqkv");
}

TEST(OpsGradcheck, Gelu) {
  const size_t n = 50;
  auto x = randn(n, 41, 2.0), R = randn(n, 42);
  auto loss = [&] {
    std::vector<double> y(n);
    ops::gelu_forward(y.data(), x.data(), n);
    return dot(y, R);
  };
  std::vector<double> dx(n, kNaN);  // overwritten
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

// The fused residual add and layer norm is the two ops one after the other,
// bit for bit, in float (what the model's forward relies on) and in double.
template <typename T>
void expect_fused_residual_layernorm_is_the_two_ops(int N, int C) {
  const size_t n = size_t(N) * C;
  const auto a = cast<T>(randn(n, 61, 3.0)), b = cast<T>(randn(n, 62));
  const auto w = cast<T>(randn(C, 63)), bias = cast<T>(randn(C, 64));
  std::vector<T> res1(n), out1(n), mean1(N), rstd1(N);
  ops::residual_forward(res1.data(), a.data(), b.data(), n);
  ops::layernorm_forward(out1.data(), mean1.data(), rstd1.data(), res1.data(), w.data(),
                         bias.data(), N, C);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> res2(n, nan), out2(n, nan), mean2(N, nan), rstd2(N, nan);
  ops::residual_layernorm_forward(res2.data(), out2.data(), mean2.data(), rstd2.data(), a.data(),
                                  b.data(), w.data(), bias.data(), N, C);
  auto same = [](const std::vector<T>& x, const std::vector<T>& y) {
    return std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
  };
  EXPECT_TRUE(same(res1, res2)) << "res";
  EXPECT_TRUE(same(out1, out2)) << "out";
  EXPECT_TRUE(same(mean1, mean2)) << "mean";
  EXPECT_TRUE(same(rstd1, rstd2)) << "rstd";
}

TEST(OpsGradcheck, ResidualLayerNormIsTheTwoOps) {
  for (const auto& [N, C] : {std::pair{1, 3}, std::pair{7, 33}, std::pair{5, 768}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    expect_fused_residual_layernorm_is_the_two_ops<float>(N, C);
    expect_fused_residual_layernorm_is_the_two_ops<double>(N, C);
  }
}

// The same for Llama's residual add and RMSNorm, and with res written over
// a (the decoder's in-place use).
template <typename T>
void expect_fused_residual_rmsnorm_is_the_two_ops(int N, int C) {
  const size_t n = size_t(N) * C;
  const auto a = cast<T>(randn(n, 71, 3.0)), b = cast<T>(randn(n, 72));
  const auto w = cast<T>(randn(C, 73));
  const double eps = 1e-5;
  std::vector<T> res1(n), out1(n), rstd1(N);
  ops::residual_forward(res1.data(), a.data(), b.data(), n);
  ops::rmsnorm_forward(out1.data(), rstd1.data(), res1.data(), w.data(), N, C, eps);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> res2(n, nan), out2(n, nan), rstd2(N, nan);
  ops::residual_rmsnorm_forward(res2.data(), out2.data(), rstd2.data(), a.data(), b.data(),
                                w.data(), N, C, eps);
  auto same = [](const std::vector<T>& x, const std::vector<T>& y) {
    return std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
  };
  EXPECT_TRUE(same(res1, res2)) << "res";
  EXPECT_TRUE(same(out1, out2)) << "out";
  EXPECT_TRUE(same(rstd1, rstd2)) << "rstd";
  std::vector<T> in_place = a, out3(n, nan), rstd3(N, nan);
  ops::residual_rmsnorm_forward(in_place.data(), out3.data(), rstd3.data(), in_place.data(),
                                b.data(), w.data(), N, C, eps);
  EXPECT_TRUE(same(res1, in_place)) << "res in place";
  EXPECT_TRUE(same(out1, out3)) << "out in place";
}

TEST(OpsGradcheck, ResidualRmsNormIsTheTwoOps) {
  for (const auto& [N, C] : {std::pair{1, 3}, std::pair{7, 33}, std::pair{5, 2048}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    expect_fused_residual_rmsnorm_is_the_two_ops<float>(N, C);
    expect_fused_residual_rmsnorm_is_the_two_ops<double>(N, C);
  }
}

// Vocabulary-parallel embedding with tensor parallelism emulated by hand: the
// Vp rows of wte are split into P equal parts, the parts' lookups are summed
// (the all-reduce of the model), then the position embedding is added once.
TEST(OpsGradcheck, EmbeddingVocabParallel) {
  const int B = 2, T = 4, C = 3, V = 7, Vp = 8, maxT = 6, N = B * T;
  // Repeated ids on purpose, ids in every part, the last real id V - 1.
  const std::vector<int32_t> tokens = {1, 6, 1, 0, 4, 4, 2, 5};
  for (int P : {1, 2, 4}) {
    SCOPED_TRACE("P=" + std::to_string(P));
    const int Vl = Vp / P;
    std::vector<std::vector<double>> wte(P);
    for (int p = 0; p < P; ++p) wte[p] = randn(static_cast<size_t>(Vl) * C, 61 + p);
    auto wpe = randn(maxT * C, 65), R = randn(N * C, 66);
    auto forward = [&] {
      std::vector<double> y(N * C, 0.0), part(N * C);
      for (int p = 0; p < P; ++p) {
        ops::embedding_forward(part.data(), tokens.data(), wte[p].data(), N, C, p * Vl, Vl);
        for (int i = 0; i < N * C; ++i) y[i] += part[i];
      }
      ops::position_forward(y.data(), wpe.data(), B, T, C);
      return y;
    };
    auto loss = [&] { return dot(forward(), R); };

    // The sum over parts is exactly wte[token] + wpe[t].
    const auto y = forward();
    for (int n = 0; n < N; ++n) {
      const int tok = tokens[n], t = n % T;
      for (int c = 0; c < C; ++c)
        EXPECT_EQ(y[n * C + c], wte[tok / Vl][(tok % Vl) * C + c] + wpe[t * C + c]) << "n=" << n;
    }

    // Gradients accumulate: start from non-zero values and subtract them after.
    std::vector<std::vector<double>> dwte(P), dwte0(P);
    for (int p = 0; p < P; ++p) {
      dwte[p] = dwte0[p] = randn(wte[p].size(), 71 + p);
      ops::embedding_backward(dwte[p].data(), R.data(), tokens.data(), N, C, p * Vl, Vl);
      for (size_t i = 0; i < dwte[p].size(); ++i) dwte[p][i] -= dwte0[p][i];
    }
    auto dwpe = randn(wpe.size(), 75);
    const auto dwpe0 = dwpe;
    ops::position_backward(dwpe.data(), R.data(), B, T, C);
    for (size_t i = 0; i < dwpe.size(); ++i) dwpe[i] -= dwpe0[i];

    for (int p = 0; p < P; ++p)
      expect_matches_fd(wte[p], dwte[p], loss, ("embedding dwte part " + std::to_string(p)).c_str());
    expect_matches_fd(wpe, dwpe, loss, "position dwpe");
    // The padded row (id V, never a token) is never written.
    for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[P - 1][((Vp - 1) % Vl) * C + c], 0.0);
  }
}

namespace {

// The loss exactly as the model assembles it over P tensor-parallel parts of
// the logits: MAX over the parts of xent_local_max, SUM over the parts of
// xent_local_sums, then xent_losses.
template <typename T>
struct XentResult {
  std::vector<T> rowmax, sums, losses;
};

template <typename T>
XentResult<T> xent_assemble(const std::vector<std::vector<T>>& parts,
                            const std::vector<int32_t>& targets, int Vl, int V) {
  const int N = static_cast<int>(targets.size()), P = static_cast<int>(parts.size());
  XentResult<T> r{std::vector<T>(N, -std::numeric_limits<T>::infinity()), std::vector<T>(2 * N, 0),
                  std::vector<T>(N)};
  std::vector<T> mx(N), s(2 * N);
  for (int p = 0; p < P; ++p) {
    ops::xent_local_max(mx.data(), parts[p].data(), N, Vl, p * Vl, V);
    for (int n = 0; n < N; ++n) r.rowmax[n] = std::max(r.rowmax[n], mx[n]);
  }
  for (int p = 0; p < P; ++p) {
    ops::xent_local_sums(s.data(), parts[p].data(), r.rowmax.data(), targets.data(), N, Vl, p * Vl,
                         V);
    for (int i = 0; i < 2 * N; ++i) r.sums[i] += s[i];
  }
  ops::xent_losses(r.losses.data(), r.rowmax.data(), r.sums.data(), N);
  return r;
}

// dlogits of every part, from the assembled reductions.
template <typename T>
std::vector<std::vector<T>> xent_dlogits(const std::vector<std::vector<T>>& parts,
                                         const XentResult<T>& r, const std::vector<T>& dlosses,
                                         const std::vector<int32_t>& targets, int Vl, int V) {
  const int N = static_cast<int>(targets.size());
  auto d = parts;
  for (size_t p = 0; p < parts.size(); ++p)
    ops::xent_local_backward(d[p].data(), r.rowmax.data(), r.sums.data(), dlosses.data(),
                             targets.data(), N, Vl, static_cast<int>(p) * Vl, V);
  return d;
}

// logits(N,Vp) with V real columns, split by columns into P parts of Vl = Vp/P.
void check_vocab_parallel_xent(int V, int Vp, int P, const std::vector<int32_t>& targets,
                               uint64_t seed) {
  SCOPED_TRACE("V=" + std::to_string(V) + " Vp=" + std::to_string(Vp) + " P=" + std::to_string(P));
  const int N = static_cast<int>(targets.size()), Vl = Vp / P;
  auto logits = randn(static_cast<size_t>(N) * Vp, seed, 3.0), dl = randn(N, seed + 1);
  // Padded logits larger than every real one: they must still never win.
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) logits[n * Vp + v] = 100.0;
  std::vector<std::vector<double>> parts(P, std::vector<double>(static_cast<size_t>(N) * Vl));
  for (int p = 0; p < P; ++p)
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < Vl; ++v) parts[p][n * Vl + v] = logits[n * Vp + p * Vl + v];

  // Losses against a direct log-softmax over the V real columns.
  const auto r = xent_assemble(parts, targets, Vl, V);
  for (int n = 0; n < N; ++n) {
    const double* row = &logits[n * Vp];
    double mx = row[0], z = 0;
    for (int v = 0; v < V; ++v) {
      mx = std::max(mx, row[v]);
      z += std::exp(row[v]);
    }
    EXPECT_EQ(r.rowmax[n], mx) << "n=" << n;
    EXPECT_NEAR(r.losses[n], -(row[targets[n]] - std::log(z)), 1e-12) << "n=" << n;
  }
  // A part holding only padding contributes -inf to the max and 0 to the sums.
  for (int p = 0; p < P; ++p) {
    if (p * Vl < V) continue;
    std::vector<double> mx(N), s(2 * N);
    ops::xent_local_max(mx.data(), parts[p].data(), N, Vl, p * Vl, V);
    ops::xent_local_sums(s.data(), parts[p].data(), r.rowmax.data(), targets.data(), N, Vl, p * Vl,
                         V);
    for (int n = 0; n < N; ++n) {
      EXPECT_EQ(mx[n], -std::numeric_limits<double>::infinity());
      EXPECT_EQ(s[2 * n], 0.0);
      EXPECT_EQ(s[2 * n + 1], 0.0);
    }
  }

  // dlogits of every part over ALL its columns: the padded ones do not enter
  // the loss, so their finite differences are 0, and backward writes exactly 0.
  const auto d = xent_dlogits(parts, r, dl, targets, Vl, V);
  for (int n = 0; n < N; ++n) {
    double rowsum = 0;  // sum_v (p_v - onehot_v) dl = 0
    for (int p = 0; p < P; ++p)
      for (int v = 0; v < Vl; ++v) {
        if (p * Vl + v >= V)
          EXPECT_EQ(d[p][n * Vl + v], 0.0) << "padded column " << p * Vl + v << " got a gradient";
        rowsum += d[p][n * Vl + v];
      }
    EXPECT_NEAR(rowsum, 0.0, 1e-12) << "n=" << n;
  }
  auto loss = [&] { return dot(xent_assemble(parts, targets, Vl, V).losses, dl); };
  for (int p = 0; p < P; ++p)
    expect_matches_fd(parts[p], d[p], loss, ("xent dlogits part " + std::to_string(p)).c_str(),
                      /*may_be_zero=*/p * Vl >= V);

  // The float ops against the double ones, assembled the same way.
  std::vector<std::vector<float>> fparts;
  for (const auto& part : parts) fparts.push_back(cast<float>(part));
  const auto dlf = cast<float>(dl);
  const auto rf = xent_assemble(fparts, targets, Vl, V);
  expect_close(rf.losses, r.losses, "xent losses float vs double");
  const auto df = xent_dlogits(fparts, rf, dlf, targets, Vl, V);
  for (int p = 0; p < P; ++p) expect_close(df[p], d[p], "xent dlogits float vs double");
}

}  // namespace

TEST(OpsGradcheck, CrossEntropyVocabParallelPaddedVocab) {
  // Vp = 16: with P = 2 the second part holds real columns 8..10 and padding
  // 11..15; with P = 4 the last part is all padding. Targets in every part
  // that holds real columns.
  const std::vector<int32_t> targets = {0, 10, 5, 8, 7, 9, 5};
  for (int P : {1, 2, 4}) check_vocab_parallel_xent(11, 16, P, targets, 81);
}

TEST(OpsGradcheck, CrossEntropyVocabParallelPaddingOnlyPart) {
  // V = 7, Vp = 16, P = 2: the second part holds only padding columns.
  check_vocab_parallel_xent(7, 16, 2, {0, 6, 3, 3}, 91);
}

TEST(OpsGradcheck, RmsNorm) {
  const int N = 6, C = 10;
  auto x = randn(N * C, 31, 2.0), w = randn(C, 32), R = randn(N * C, 33);
  for (int i = 0; i < N * C; ++i) x[i] += 0.5 * (i % C);
  const double eps = 1e-5;
  std::vector<double> y(N * C), rstd(N);
  auto loss = [&] {
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(y, R);
  };
  loss();
  // Both gradients accumulate: start from non-zero values.
  auto dx = randn(N * C, 34), dw = randn(C, 35);
  const auto dx0 = dx, dw0 = dw;
  ops::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
  expect_matches_fd(x, dx, loss, "rmsnorm dinp");
  expect_matches_fd(w, dw, loss, "rmsnorm dw");
  // A frozen gain: dw null, the same dinp.
  std::vector<double> dx2(N * C, 0.0);
  ops::rmsnorm_backward(dx2.data(), static_cast<double*>(nullptr), R.data(), x.data(), w.data(),
                        rstd.data(), N, C);
  for (size_t i = 0; i < dx2.size(); ++i) EXPECT_NEAR(dx2[i], dx[i], 1e-12);
  // The definition, longhand, and float against double.
  loss();
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    const double s = 1 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(y[n * C + c], w[c] * x[n * C + c] * s, 1e-12);
  }
  std::vector<float> yf(N * C), rf(N);
  auto xf = cast<float>(x), wf = cast<float>(w);
  ops::rmsnorm_forward(yf.data(), rf.data(), xf.data(), wf.data(), N, C, eps);
  expect_close(yf, y, "rmsnorm float vs double");
}

TEST(OpsGradcheck, Rope) {
  // q's 3 heads inside rows of a packed buffer of 2.5 heads more (ld), as q
  // and k sit in a fused projection's output; the rest must pass untouched.
  const int B = 2, T = 5, heads = 3, HS = 8, ld = 44;
  std::vector<float> inv(HS / 2);
  ops::RopeScaling scaling;
  ops::rope_inv_freq(inv.data(), HS, 10000.0, scaling);
  std::vector<double> cos(T * HS / 2), sin(T * HS / 2);
  ops::rope_tables(cos.data(), sin.data(), inv.data(), T, HS);
  auto x = randn(size_t(B) * T * ld, 41), R = randn(x.size(), 42);
  std::vector<double> y;
  auto loss = [&] {
    y = x;
    ops::rope_forward(y.data(), cos.data(), sin.data(), B, T, heads, HS, ld);
    return dot(y, R);
  };
  loss();
  auto dx = R;
  ops::rope_backward(dx.data(), cos.data(), sin.data(), B, T, heads, HS, ld);
  expect_matches_fd(x, dx, loss, "rope dx");
  // Rotate-half, longhand; channels beyond the heads unchanged.
  loss();
  for (int r = 0; r < B * T; ++r) {
    const int t = r % T;
    for (int c = 0; c < ld; ++c) {
      const double v = x[size_t(r) * ld + c];
      double want = v;
      if (c < heads * HS) {
        const int h = c / HS, i = c % HS, k = i % (HS / 2);
        const double other = x[size_t(r) * ld + h * HS + (i < HS / 2 ? i + HS / 2 : i - HS / 2)];
        const double a = double(float(t) * inv[k]);
        want = i < HS / 2 ? v * std::cos(a) - other * std::sin(a)
                          : v * std::cos(a) + other * std::sin(a);
      }
      EXPECT_NEAR(y[size_t(r) * ld + c], want, 1e-12) << "row " << r << " channel " << c;
    }
  }
  // theta^(-2i/HS), and position 0 turns nothing.
  for (int i = 0; i < HS / 2; ++i)
    EXPECT_NEAR(inv[i], std::pow(10000.0, -2.0 * i / HS), 1e-6 * std::pow(10000.0, -2.0 * i / HS));
  for (int i = 0; i < HS / 2; ++i) {
    EXPECT_EQ(cos[i], 1.0);
    EXPECT_EQ(sin[i], 0.0);
  }
}

TEST(OpsGradcheck, RopeLlama3Scaling) {
  // Llama 3.1's settings on a head of 128: the high frequencies (wavelength
  // under 8192 / 4) unchanged, the low ones (over 8192 / 1) divided by 8,
  // those between blended; each band met by some i.
  const int HS = 128;
  ops::RopeScaling s{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                     .original_max_positions = 8192};
  std::vector<float> plain(HS / 2), scaled(HS / 2);
  ops::rope_inv_freq(plain.data(), HS, 500000.0, {});
  ops::rope_inv_freq(scaled.data(), HS, 500000.0, s);
  int kept = 0, slowed = 0, blended = 0;
  for (int i = 0; i < HS / 2; ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 8) << i;
      ++slowed;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(scaled[i], (1 - smooth) * plain[i] / 8 + smooth * plain[i], 1e-6 * plain[i]) << i;
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(slowed, 0);
  EXPECT_GT(blended, 0);
}

TEST(OpsGradcheck, SwiGlu) {
  // gate and up side by side in one (N, 2F) buffer.
  const int N = 4, F = 7;
  auto gu = randn(size_t(N) * 2 * F, 51, 2.0), R = randn(size_t(N) * F, 52);
  gu[0] = -40;  // far into silu's flat tail: no overflow, no NaN
  auto loss = [&] {
    std::vector<double> y(size_t(N) * F);
    ops::swiglu_forward(y.data(), gu.data(), gu.data() + F, N, F, 2 * F);
    return dot(y, R);
  };
  std::vector<double> dgu(gu.size(), kNaN);
  ops::swiglu_backward(dgu.data(), dgu.data() + F, R.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  expect_matches_fd(gu, dgu, loss, "swiglu dgate, dup");
  std::vector<float> yf(size_t(N) * F);
  std::vector<double> yd(yf.size());
  auto guf = cast<float>(gu);
  ops::swiglu_forward(yf.data(), guf.data(), guf.data() + F, N, F, 2 * F);
  ops::swiglu_forward(yd.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  expect_close(yf, yd, "swiglu float vs double");
  for (float v : yf) EXPECT_TRUE(std::isfinite(v));
}

TEST(OpsGradcheck, GroupedQueryPacking) {
  // 6 query heads over 2 key/value heads (groups of 3), NKV = NH, one
  // key/value head; and tensor-parallel ranks' maps: 2 of the model's 6
  // query heads from head 2 on (groups of 3: heads 2 and 3 read 0 and 1 of
  // 2 replicated key/value heads), 3 from head 3 on (groups of 2, 4 held).
  struct Case {
    int NH, NKV;
    ops::GqaMap map;
  };
  for (const Case c : {Case{6, 2, {}}, Case{4, 4, {}}, Case{4, 1, {}}, Case{2, 2, {2, 3}},
                       Case{3, 4, {3, 2}}}) {
    const int NH = c.NH, NKV = c.NKV, group = c.map.group > 0 ? c.map.group : NH / NKV;
    SCOPED_TRACE("NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + " q_head0 " +
                 std::to_string(c.map.q_head0));
    const int N = 3, HS = 4, C = NH * HS, Ckv = NKV * HS;
    auto q = randn(size_t(N) * C, 61), k = randn(size_t(N) * Ckv, 62), v = randn(size_t(N) * Ckv, 63);
    auto R = randn(size_t(N) * 3 * C, 64);
    std::vector<double> qkv(R.size());
    auto loss = [&] {
      ops::gqa_pack_forward(qkv.data(), q.data(), k.data(), v.data(), N, NH, NKV, HS, c.map);
      return dot(qkv, R);
    };
    loss();
    // Longhand: query head h reads key/value head (q_head0 + h) / group.
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < NH; ++h)
        for (int d = 0; d < HS; ++d) {
          const size_t row = size_t(n) * 3 * C,
                       kv = size_t(n) * Ckv + ((c.map.q_head0 + h) / group) * HS + d;
          EXPECT_EQ(qkv[row + h * HS + d], q[size_t(n) * C + h * HS + d]);
          EXPECT_EQ(qkv[row + C + h * HS + d], k[kv]);
          EXPECT_EQ(qkv[row + 2 * C + h * HS + d], v[kv]);
        }
    std::vector<double> dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN);
    ops::gqa_pack_backward(dq.data(), dk.data(), dv.data(), R.data(), N, NH, NKV, HS, c.map);
    expect_matches_fd(q, dq, loss, "gqa dq");
    expect_matches_fd(k, dk, loss, "gqa dk");  // zero for a head no query reads
    expect_matches_fd(v, dv, loss, "gqa dv");
  }
  // A map that reads past the held heads is refused.
  std::vector<float> x(64);
  const ops::GqaMap past{4, 2};  // heads 4 and 5 would read held head 2 of 2
  EXPECT_THROW(ops::gqa_pack_forward(x.data(), x.data(), x.data(), x.data(), 1, 2, 2, 2, past),
               RankError);
}
