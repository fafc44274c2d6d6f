// The CUDA ops of cuda/ops_cuda.h against their CPU references in meshlm::ops
// (float): embeddings, layer norm, linear layer, attention, residual and the
// vocabulary-parallel cross-entropy. GELU and dequantize_rows have their own
// tests (test_cuda_gelu.cpp, test_cuda_quant.cpp).
//
// Each test gives both ops the same fresh random inputs (never zeros) and
// compares every output by its relative L2 error, |got - want| / |want|, with
// a tolerance per op (below); an element may be NaN or infinite only where
// the reference holds the same infinity. Outputs that a forward op overwrites
// start as NaN on both sides, so an element the op never writes fails; so do
// the input gradients that matmul and attention overwrite (ops/ops.h), so an
// op that accumulates into them fails. Gradients that accumulate start from
// the same random non-zero values on both sides, so an op that overwrites
// instead of accumulating fails. Shapes include odd sizes
// (C not a multiple of 4 or 32, N = 1, T = 1, T not a power of two), several
// heads and batch rows, and the vocabulary-parallel cases: padding columns,
// a rank holding only padding, tokens and targets on and off the rank. The
// ops whose header promises the same bits every run are run twice. The CUDA
// ops run on a stream of their own. Every test skips, with the reason, where
// no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device_memory.h"
#include "cuda/ops_cuda.h"
#include "cuda_test.h"
#include "ops/kernels.h"
#include "ops/ops.h"

namespace {

namespace ops = meshlm::ops;
namespace cuda = meshlm::cuda;

// ---- tolerances (relative L2 error) -------------------------------------------
// Copies (embedding lookup, target logit, max) and single IEEE additions
// (residual, position_forward, residual_backward) are correctly rounded on
// both sides: the same bits.
constexpr double kExact = 0;
// Everything else: fp32 on both sides, the same formula, but sums taken in a
// different order (warp shuffles, blocks, cuBLAS's GEMM blocking) and exp/log/
// sqrt from different libraries. The rounding error of a sum of K terms grows
// like 2^-24 sqrt(K), and on these inputs (sums of up to a few thousand
// terms) the CPU float ops stay within 1e-6 of a double reference; 1e-5
// leaves a margin and still catches TF32 (about 1e-3) or a missed term.
constexpr double kTol = 1e-5;
// Larger for the sum of exp of xent_local_sums: the CPU adds the terms (all
// positive, up to 50257 of them) one after the other, so its own error grows
// like 2^-24 sqrt(K / 3), 6e-6 against a double reference for the GPT-2
// vocabulary here; the GPU's tree of partial sums is more accurate, which
// leaves the CPU's error. The cases of 512 columns or fewer, where a missed
// column costs 2e-3 or more, still catch a wrong column range.
constexpr double kTolVocabSum = 5e-5;

// Starting gradients: uniform in [-kGradStart, kGradStart]. Small next to
// what the ops add (an RMS of 0.1 to 30 here), so that |want| measures the
// added part and its errors are not hidden under the start, yet 2e-4 or more
// of it, far above the tolerances, so that dropping the start (= in place of
// +=) fails.
constexpr double kGradStart = 0.01;

// ---- host data ------------------------------------------------------------------

// Uniform integers in [lo, hi).
std::vector<int32_t> uniform_ints(size_t n, uint64_t seed, int lo, int hi) {
  meshlm::Rng rng(seed);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = lo + static_cast<int32_t>(rng.below(static_cast<uint64_t>(hi - lo)));
  return v;
}

// Columns [c0, c1) of the rows of length `row` of a.
std::vector<float> columns(const std::vector<float>& a, size_t row, size_t c0, size_t c1) {
  std::vector<float> out;
  for (size_t r = 0; r + row <= a.size(); r += row)
    out.insert(out.end(), a.begin() + r + c0, a.begin() + r + c1);
  return out;
}

// ---- one array given to both ops ----------------------------------------------------
// `cpu` is the reference op's array, the device copy the CUDA op's; both start
// from the same values.
template <typename T>
class Both {
public:
  explicit Both(std::vector<T> start) : cpu(start), start_(std::move(start)), dev_(cpu.size()) {
    dev_.upload(cpu);
  }
  T* c() { return cpu.data(); }
  T* g() { return dev_.get(); }
  std::vector<T> gpu() const { return dev_.download(); }
  const std::vector<T>& start() const { return start_; }
  // Back to the start on the device (to run the CUDA op again).
  void restart_gpu() { dev_.upload(start_); }

  std::vector<T> cpu;

private:
  std::vector<T> start_;
  DeviceArray<T> dev_;
};

// ---- comparisons ------------------------------------------------------------------

// |got - want| <= tol |want| over the finite elements of want; got finite
// where want is, and equal to want where want is infinite (a NaN in want is a
// bug of the test). On failure: the error, the number of non-finite elements
// and the worst element.
testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                               double tol) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  double err2 = 0.0, ref2 = 0.0, worst_err = -1.0;
  size_t bad = 0, first_bad = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w)) return testing::AssertionFailure() << "the reference is NaN at i=" << i;
    if (std::isinf(w) || !std::isfinite(g)) {
      if (g != w && bad++ == 0) first_bad = i;
      continue;
    }
    const double d = g - w;
    err2 += d * d;
    ref2 += w * w;
    if (std::fabs(d) > worst_err) worst_err = std::fabs(d), worst = i;
  }
  const double err = std::sqrt(err2), ref = std::sqrt(ref2);
  if (bad == 0 && err <= tol * ref) return testing::AssertionSuccess();
  testing::AssertionResult r = testing::AssertionFailure();
  if (bad > 0)
    r << bad << " of " << want.size() << " elements non-finite (or not the reference's "
      << "infinity), first at i=" << first_bad << ": got " << got[first_bad] << ", want "
      << want[first_bad] << ". ";
  if (!(err <= tol * ref))
    r << "|got - want| = " << err << ", |want| = " << ref << ": relative " << err / ref
      << ", tolerance " << tol << "; worst at i=" << worst << ": got " << got[worst] << ", want "
      << want[worst];
  return r;
}

// The CUDA op's array against the reference op's.
testing::AssertionResult matches(const Both<float>& a, double tol) {
  return close(a.gpu(), a.cpu, tol);
}

// The same for columns [c0, c1) of rows of length `row` (dq, dk, dv of dqkv;
// the two columns of the cross-entropy sums).
testing::AssertionResult matches_columns(const Both<float>& a, size_t row, size_t c0, size_t c1,
                                         double tol) {
  return close(columns(a.gpu(), row, c0, c1), columns(a.cpu, row, c0, c1), tol);
}

testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) && differ++ == 0) first = i;
  if (differ == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << differ << " of " << a.size() << " elements differ, first at i=" << first << ": "
         << a[first] << " then " << b[first];
}

// ---- the fixture ------------------------------------------------------------------

class CudaOps : public CudaTest {
protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The ops' own scratch (cuda/scratch.cuh, the GEMMs' 16-bit copies) is
    // device Buffers, which need the allocator installed.
    cuda::install_device_memory();
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Runs the reference op, then the CUDA op on stream_, and waits for it.
  // The device synchronisation first makes sure that the uploads (cudaMemcpy
  // from pageable memory may return before its DMA ends, and it does not order
  // stream_) have landed before the CUDA op reads them.
  template <typename CpuOp, typename GpuOp>
  void run_both(CpuOp cpu_op, GpuOp gpu_op) {
    cpu_op();
    CUDA_CHECK(cudaDeviceSynchronize());
    gpu_op();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // The CUDA op alone (its second run in the determinism tests).
  template <typename GpuOp>
  void run_gpu(GpuOp gpu_op) {
    CUDA_CHECK(cudaDeviceSynchronize());
    gpu_op();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Arrays for both ops; every call draws from a new seed.
  Both<float> input(size_t n, double lo = -1.0, double hi = 1.0) {
    return Both<float>(uniform_floats(n, next_seed(), lo, hi));
  }
  // Written by the op: NaN before it runs.
  Both<float> output(size_t n) {
    return Both<float>(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  }
  // Accumulated into by the op.
  Both<float> gradient(size_t n) {
    return Both<float>(uniform_floats(n, next_seed(), -kGradStart, kGradStart));
  }

  uint64_t next_seed() { return seed_++; }

  cudaStream_t stream_ = nullptr;
  uint64_t seed_ = 1000;
};

// ---- embeddings -------------------------------------------------------------------

struct EmbeddingCase {
  int N, C, v0, Vl;
  int tok_lo, tok_hi;  // tokens uniform in [tok_lo, tok_hi)
  std::string str() const {
    return "N=" + std::to_string(N) + " C=" + std::to_string(C) + " v0=" + std::to_string(v0) +
           " Vl=" + std::to_string(Vl) + " tokens in [" + std::to_string(tok_lo) + ", " +
           std::to_string(tok_hi) + ")";
  }
};
const EmbeddingCase kEmbeddingCases[] = {
    {1, 7, 0, 5, 0, 5},            // one token, odd C
    {37, 48, 0, 64, 0, 64},        // one rank: every token on it
    {64, 33, 16, 16, 0, 48},       // tokens below, on and above the rank's rows
    {300, 768, 100, 50, 90, 160},  // GPT-2 width, each row hit several times
    {5, 20, 64, 32, 0, 64},        // no token on this rank: zeros, no gradient
    {3000, 40, 0, 50257, 0, 50257},  // thousands of distinct rows, a few hit twice
};

// Lookup: the rank's rows copied exactly, zeros for tokens of other ranks.
TEST_F(CudaOps, EmbeddingForward) {
  for (const EmbeddingCase& k : kEmbeddingCases) {
    SCOPED_TRACE(k.str());
    Both<int32_t> tok(uniform_ints(k.N, next_seed(), k.tok_lo, k.tok_hi));
    Both<float> wte = input(size_t(k.Vl) * k.C);
    Both<float> out = output(size_t(k.N) * k.C);
    run_both(
        [&] { ops::embedding_forward<float>(out.c(), tok.c(), wte.c(), k.N, k.C, k.v0, k.Vl); },
        [&] { cuda::embedding_forward(out.g(), tok.g(), wte.g(), k.N, k.C, k.v0, k.Vl, stream_); });
    EXPECT_TRUE(matches(out, kExact));
  }
}

// dwte: the rows of the rank's tokens gather their dout rows (several each),
// the other rows keep their start. Each row adds its positions' rows in
// increasing position order, as the CPU op does: the same bits.
TEST_F(CudaOps, EmbeddingBackward) {
  for (const EmbeddingCase& k : kEmbeddingCases) {
    SCOPED_TRACE(k.str());
    Both<int32_t> tok(uniform_ints(k.N, next_seed(), k.tok_lo, k.tok_hi));
    Both<float> dout = input(size_t(k.N) * k.C);
    Both<float> dwte = gradient(size_t(k.Vl) * k.C);
    run_both(
        [&] { ops::embedding_backward<float>(dwte.c(), dout.c(), tok.c(), k.N, k.C, k.v0, k.Vl); },
        [&] {
          cuda::embedding_backward(dwte.g(), dout.g(), tok.g(), k.N, k.C, k.v0, k.Vl, stream_);
        });
    EXPECT_TRUE(matches(dwte, kExact));
  }
}

// The header promises the same bits every run: 4096 positions on three
// tokens of the rank (and some off it), run twice from the same start.
TEST_F(CudaOps, EmbeddingBackwardIsDeterministic) {
  const int N = 4096, C = 768, v0 = 10, Vl = 3;
  Both<int32_t> tok(uniform_ints(N, next_seed(), v0 - 1, v0 + Vl + 1));
  Both<float> dout = input(size_t(N) * C);
  Both<float> dwte = gradient(size_t(Vl) * C);
  auto gpu_op = [&] {
    cuda::embedding_backward(dwte.g(), dout.g(), tok.g(), N, C, v0, Vl, stream_);
  };
  run_both([&] { ops::embedding_backward<float>(dwte.c(), dout.c(), tok.c(), N, C, v0, Vl); },
           gpu_op);
  EXPECT_TRUE(matches(dwte, kExact));
  const std::vector<float> first = dwte.gpu();
  dwte.restart_gpu();
  run_gpu(gpu_op);
  EXPECT_TRUE(same_bits(first, dwte.gpu()));
}

struct PositionCase {
  int B, T, C;
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C);
  }
};
const PositionCase kPositionCases[] = {
    {1, 1, 5}, {2, 7, 33}, {4, 1, 17}, {3, 64, 768}, {8, 129, 64},
};
// wpe and dwpe have kExtraPositions rows more than T (the model's block size
// exceeds the sequence): those must be left alone.
constexpr int kExtraPositions = 3;

// out += wpe[t]: one addition per element, the same bits.
TEST_F(CudaOps, PositionForward) {
  for (const PositionCase& k : kPositionCases) {
    SCOPED_TRACE(k.str());
    Both<float> wpe = input(size_t(k.T + kExtraPositions) * k.C);
    Both<float> out = input(size_t(k.B) * k.T * k.C);  // += wpe
    run_both([&] { ops::position_forward<float>(out.c(), wpe.c(), k.B, k.T, k.C); },
             [&] { cuda::position_forward(out.g(), wpe.g(), k.B, k.T, k.C, stream_); });
    EXPECT_TRUE(matches(out, kExact));
  }
}

// dwpe[t] += sum over the batch of dout[b, t]; rows past T untouched.
TEST_F(CudaOps, PositionBackward) {
  for (const PositionCase& k : kPositionCases) {
    SCOPED_TRACE(k.str());
    Both<float> dout = input(size_t(k.B) * k.T * k.C);
    Both<float> dwpe = gradient(size_t(k.T + kExtraPositions) * k.C);
    run_both([&] { ops::position_backward<float>(dwpe.c(), dout.c(), k.B, k.T, k.C); },
             [&] { cuda::position_backward(dwpe.g(), dout.g(), k.B, k.T, k.C, stream_); });
    EXPECT_TRUE(matches(dwpe, kTol));
    const std::vector<float> got = dwpe.gpu();
    const size_t used = size_t(k.T) * k.C;
    EXPECT_TRUE(same_bits(std::vector<float>(got.begin() + used, got.end()),
                          std::vector<float>(dwpe.start().begin() + used, dwpe.start().end())))
        << "rows past T";
  }
}

// ---- layer norm -----------------------------------------------------------------------

struct LayerNormCase {
  int N, C;
  std::string str() const { return "N=" + std::to_string(N) + " C=" + std::to_string(C); }
};
const LayerNormCase kLayerNormCases[] = {
    {1, 3}, {7, 33}, {17, 100}, {64, 768}, {3, 1601}, {256, 64}, {1000, 96},
};

// Rows of uniform values around an offset of their own in [-2, 2], so that the
// mean is not zero and the variance is that of the differences.
std::vector<float> layernorm_input(int N, int C, uint64_t seed) {
  std::vector<float> x = uniform_floats(size_t(N) * C, seed);
  const std::vector<float> offset = uniform_floats(N, seed + 1, -2.0, 2.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) x[size_t(n) * C + c] += offset[n];
  return x;
}

// Inputs of layernorm_backward: x, w, dout and the mean and rstd that the CPU
// forward saved (the same floats on both sides).
struct LayerNormBackwardInputs {
  Both<float> inp, w, dout, mean, rstd;
};

class CudaLayerNorm : public CudaOps {
protected:
  LayerNormBackwardInputs backward_inputs(int N, int C) {
    std::vector<float> x = layernorm_input(N, C, next_seed());
    std::vector<float> wv = uniform_floats(C, next_seed()), bv = uniform_floats(C, next_seed());
    std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
    ops::layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), wv.data(),
                                  bv.data(), N, C);
    return {Both<float>(std::move(x)), Both<float>(std::move(wv)), input(size_t(N) * C),
            Both<float>(std::move(mean)), Both<float>(std::move(rstd))};
  }

  // dinp, and dw and db unless frozen (null on both sides).
  void check_backward(int N, int C, bool frozen) {
    LayerNormBackwardInputs in = backward_inputs(N, C);
    Both<float> dinp = gradient(size_t(N) * C), dw = gradient(C), db = gradient(C);
    float* dw_c = frozen ? nullptr : dw.c();
    float* db_c = frozen ? nullptr : db.c();
    float* dw_g = frozen ? nullptr : dw.g();
    float* db_g = frozen ? nullptr : db.g();
    run_both(
        [&] {
          ops::layernorm_backward<float>(dinp.c(), dw_c, db_c, in.dout.c(), in.inp.c(), in.w.c(),
                                         in.mean.c(), in.rstd.c(), N, C);
        },
        [&] {
          cuda::layernorm_backward(dinp.g(), dw_g, db_g, in.dout.g(), in.inp.g(), in.w.g(),
                                   in.mean.g(), in.rstd.g(), N, C, stream_);
        });
    EXPECT_TRUE(matches(dinp, kTol));
    if (frozen) {
      // Untouched: still the start on both sides.
      EXPECT_TRUE(same_bits(dw.gpu(), dw.start()));
      EXPECT_TRUE(same_bits(db.gpu(), db.start()));
    } else {
      EXPECT_TRUE(matches(dw, kTol));
      EXPECT_TRUE(matches(db, kTol));
    }
  }
};

// out, mean and rstd, all three written.
TEST_F(CudaLayerNorm, Forward) {
  for (const LayerNormCase& k : kLayerNormCases) {
    SCOPED_TRACE(k.str());
    const int N = k.N, C = k.C;
    Both<float> inp(layernorm_input(N, C, next_seed()));
    Both<float> w = input(C), b = input(C);
    Both<float> out = output(size_t(N) * C), mean = output(N), rstd = output(N);
    run_both(
        [&] {
          ops::layernorm_forward<float>(out.c(), mean.c(), rstd.c(), inp.c(), w.c(), b.c(), N, C);
        },
        [&] {
          cuda::layernorm_forward(out.g(), mean.g(), rstd.g(), inp.g(), w.g(), b.g(), N, C,
                                  stream_);
        });
    EXPECT_TRUE(matches(out, kTol));
    EXPECT_TRUE(matches(mean, kTol));
    EXPECT_TRUE(matches(rstd, kTol));
  }
}

// The fused residual add: res is a single IEEE addition (the same bits as the
// CPU's), out, mean and rstd as the plain layer norm; all four written.
TEST_F(CudaLayerNorm, ResidualLayerNormForward) {
  for (const LayerNormCase& k : kLayerNormCases) {
    SCOPED_TRACE(k.str());
    const int N = k.N, C = k.C;
    Both<float> a(layernorm_input(N, C, next_seed())), b = input(size_t(N) * C);
    Both<float> w = input(C), bias = input(C);
    Both<float> res = output(size_t(N) * C), out = output(size_t(N) * C);
    Both<float> mean = output(N), rstd = output(N);
    run_both(
        [&] {
          ops::residual_layernorm_forward<float>(res.c(), out.c(), mean.c(), rstd.c(), a.c(),
                                                 b.c(), w.c(), bias.c(), N, C);
        },
        [&] {
          cuda::residual_layernorm_forward(res.g(), out.g(), mean.g(), rstd.g(), a.g(), b.g(),
                                           w.g(), bias.g(), N, C, stream_);
        });
    EXPECT_TRUE(matches(res, kExact));
    EXPECT_TRUE(matches(out, kTol));
    EXPECT_TRUE(matches(mean, kTol));
    EXPECT_TRUE(matches(rstd, kTol));
  }
}

// dinp, dw and db accumulate.
TEST_F(CudaLayerNorm, Backward) {
  for (const LayerNormCase& k : kLayerNormCases) {
    SCOPED_TRACE(k.str());
    check_backward(k.N, k.C, false);
  }
}

// dw = db = nullptr (frozen gain and bias): dinp alone.
TEST_F(CudaLayerNorm, BackwardWithFrozenGainAndBias) {
  for (const LayerNormCase& k : kLayerNormCases) {
    SCOPED_TRACE(k.str());
    check_backward(k.N, k.C, true);
  }
}

// dw and db are sums over rows in a fixed order: the same bits every run,
// with rows enough for every partial sum of the reduction (9 chunks of rows,
// the last one shorter; cuda/scratch.cuh).
TEST_F(CudaLayerNorm, BackwardGainAndBiasAreDeterministic) {
  const int N = 2125, C = 771;
  LayerNormBackwardInputs in = backward_inputs(N, C);
  Both<float> dinp = gradient(size_t(N) * C), dw = gradient(C), db = gradient(C);
  auto gpu_op = [&] {
    cuda::layernorm_backward(dinp.g(), dw.g(), db.g(), in.dout.g(), in.inp.g(), in.w.g(),
                             in.mean.g(), in.rstd.g(), N, C, stream_);
  };
  run_both(
      [&] {
        ops::layernorm_backward<float>(dinp.c(), dw.c(), db.c(), in.dout.c(), in.inp.c(), in.w.c(),
                                       in.mean.c(), in.rstd.c(), N, C);
      },
      gpu_op);
  EXPECT_TRUE(matches(dw, kTol));
  EXPECT_TRUE(matches(db, kTol));
  const std::vector<float> dw1 = dw.gpu(), db1 = db.gpu();
  dinp.restart_gpu();
  dw.restart_gpu();
  db.restart_gpu();
  run_gpu(gpu_op);
  EXPECT_TRUE(same_bits(dw1, dw.gpu())) << "dw";
  EXPECT_TRUE(same_bits(db1, db.gpu())) << "db";
}

// ---- linear layer -------------------------------------------------------------------

struct MatmulCase {
  int N, IC, OC;
  std::string str() const {
    return "N=" + std::to_string(N) + " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC);
  }
};
const MatmulCase kMatmulCases[] = {
    {1, 3, 5}, {7, 33, 65}, {37, 1, 17}, {5, 1024, 1}, {64, 768, 2304}, {256, 96, 333},
    {1300, 40, 97},  // the bias gradient over 6 chunks of rows (cuda/scratch.cuh)
};

class CudaMatmul : public CudaOps {
protected:
  void check_forward(const MatmulCase& k, bool with_bias) {
    Both<float> inp = input(size_t(k.N) * k.IC), w = input(size_t(k.OC) * k.IC), bias = input(k.OC);
    Both<float> out = output(size_t(k.N) * k.OC);
    const float* bias_c = with_bias ? bias.c() : nullptr;
    const float* bias_g = with_bias ? bias.g() : nullptr;
    run_both(
        [&] { ops::matmul_forward<float>(out.c(), inp.c(), w.c(), bias_c, k.N, k.IC, k.OC); },
        [&] { cuda::matmul_forward(out.g(), inp.g(), w.g(), bias_g, k.N, k.IC, k.OC, stream_); });
    EXPECT_TRUE(matches(out, kTol));
  }

  // dw and dbias accumulate and dinp is overwritten (NaN before); the
  // gradients not asked for (null on both sides) stay as they were.
  void check_backward(const MatmulCase& k, bool want_dinp, bool want_dw, bool want_dbias) {
    SCOPED_TRACE(std::string("dinp ") + (want_dinp ? "on" : "null") + ", dw " +
                 (want_dw ? "on" : "null") + ", dbias " + (want_dbias ? "on" : "null"));
    Both<float> inp = input(size_t(k.N) * k.IC), w = input(size_t(k.OC) * k.IC);
    Both<float> dout = input(size_t(k.N) * k.OC);
    Both<float> dinp = output(size_t(k.N) * k.IC), dw = gradient(size_t(k.OC) * k.IC);
    Both<float> dbias = gradient(k.OC);
    auto pick = [](bool on, float* p) { return on ? p : nullptr; };
    run_both(
        [&] {
          ops::matmul_backward<float>(pick(want_dinp, dinp.c()), pick(want_dw, dw.c()),
                                      pick(want_dbias, dbias.c()), dout.c(), inp.c(), w.c(), k.N,
                                      k.IC, k.OC);
        },
        [&] {
          cuda::matmul_backward(pick(want_dinp, dinp.g()), pick(want_dw, dw.g()),
                                pick(want_dbias, dbias.g()), dout.g(), inp.g(), w.g(), k.N, k.IC,
                                k.OC, stream_);
        });
    const auto check = [](const char* name, const Both<float>& grad, bool on) {
      if (on)
        EXPECT_TRUE(matches(grad, kTol)) << name;
      else
        EXPECT_TRUE(same_bits(grad.gpu(), grad.start())) << name << " (null, untouched)";
    };
    check("dinp", dinp, want_dinp);
    check("dw", dw, want_dw);
    check("dbias", dbias, want_dbias);
  }
};

// out = inp w^T + bias, fp32 GEMM (TF32 would miss by about 1e-3).
TEST_F(CudaMatmul, Forward) {
  for (const MatmulCase& k : kMatmulCases) {
    SCOPED_TRACE(k.str());
    check_forward(k, true);
  }
}

// bias = nullptr: the GEMM alone, every element of out written.
TEST_F(CudaMatmul, ForwardWithoutBias) {
  for (const MatmulCase& k : kMatmulCases) {
    SCOPED_TRACE(k.str());
    check_forward(k, false);
  }
}

// dinp, dw and dbias together.
TEST_F(CudaMatmul, Backward) {
  for (const MatmulCase& k : kMatmulCases) {
    SCOPED_TRACE(k.str());
    check_backward(k, true, true, true);
  }
}

// Each of dinp, dw, dbias null in turn: the other two still right.
TEST_F(CudaMatmul, BackwardWithANullGradient) {
  for (const MatmulCase& k : kMatmulCases) {
    SCOPED_TRACE(k.str());
    check_backward(k, false, true, true);
    check_backward(k, true, false, true);
    check_backward(k, true, true, false);
  }
}

// At bf16 and fp16 the forward rounds inp and w as the CPU emulates it and
// adds the bias in cuBLASLt's epilogue (cuda/blas.cu), and the backward
// rounds dout, w and inp once: only the order of the fp32 sums differs from
// the CPU's. Each case once with arrays that start 4 bytes past an aligned
// address (the copies' one-at-a-time path, cuBLASLt's alignment), and the
// forward with and without the bias. Without rounding, the results would
// differ by far more than kRoundedTol (checked by the last assertion).
constexpr double kRoundedTol = 1e-5;

TEST_F(CudaMatmul, Bf16AndFp16RoundAsTheCpu) {
  for (ops::Precision p : {ops::Precision::bf16, ops::Precision::fp16}) {
    for (const MatmulCase& k : kMatmulCases) {
      for (size_t skew : {size_t(0), size_t(1)}) {
        SCOPED_TRACE(k.str() + " at " + std::string(meshlm::name_of(p)) + (skew ? ", skewed" : ""));
        const size_t nin = size_t(k.N) * k.IC, nw = size_t(k.OC) * k.IC, nout = size_t(k.N) * k.OC;
        Both<float> inp = input(nin + skew, -2.0, 2.0), w = input(nw + skew), bias = input(k.OC + skew);
        Both<float> out = output(nout + skew), out_nobias = output(nout + skew);
        run_both(
            [&] {
              ops::matmul_forward<float>(out.c() + skew, inp.c() + skew, w.c() + skew,
                                         bias.c() + skew, k.N, k.IC, k.OC, p);
              ops::matmul_forward<float>(out_nobias.c() + skew, inp.c() + skew, w.c() + skew,
                                         nullptr, k.N, k.IC, k.OC, p);
            },
            [&] {
              cuda::matmul_forward(out.g() + skew, inp.g() + skew, w.g() + skew, bias.g() + skew,
                                   k.N, k.IC, k.OC, stream_, p);
              cuda::matmul_forward(out_nobias.g() + skew, inp.g() + skew, w.g() + skew, nullptr,
                                   k.N, k.IC, k.OC, stream_, p);
            });
        const std::vector<float> got = out.gpu(), got_nobias = out_nobias.gpu();
        EXPECT_TRUE(close({got.begin() + skew, got.end()}, {out.cpu.begin() + skew, out.cpu.end()},
                          kRoundedTol))
            << "with the bias";
        EXPECT_TRUE(close({got_nobias.begin() + skew, got_nobias.end()},
                          {out_nobias.cpu.begin() + skew, out_nobias.cpu.end()}, kRoundedTol))
            << "without the bias";

        Both<float> dout = input(nout + skew), dinp = output(nin + skew), dw = gradient(nw + skew);
        Both<float> dbias = gradient(k.OC + skew);
        run_both(
            [&] {
              ops::matmul_backward<float>(dinp.c() + skew, dw.c() + skew, dbias.c() + skew,
                                          dout.c() + skew, inp.c() + skew, w.c() + skew, k.N, k.IC,
                                          k.OC, p);
            },
            [&] {
              cuda::matmul_backward(dinp.g() + skew, dw.g() + skew, dbias.g() + skew,
                                    dout.g() + skew, inp.g() + skew, w.g() + skew, k.N, k.IC, k.OC,
                                    stream_, p);
            });
        // dinp is overwritten from NaN: compared past the skew, which stays NaN.
        const std::vector<float> got_dinp = dinp.gpu();
        EXPECT_TRUE(close({got_dinp.begin() + skew, got_dinp.end()},
                          {dinp.cpu.begin() + skew, dinp.cpu.end()}, kRoundedTol))
            << "dinp";
        EXPECT_TRUE(matches(dw, kRoundedTol)) << "dw";
        EXPECT_TRUE(matches(dbias, kTol)) << "dbias";
      }
    }
    // The rounding is there to see: fp32 products of the same inputs differ.
    const MatmulCase k{64, 768, 2304};
    Both<float> inp = input(size_t(k.N) * k.IC), w = input(size_t(k.OC) * k.IC), bias = input(k.OC);
    Both<float> out = output(size_t(k.N) * k.OC);
    run_both([&] { ops::matmul_forward<float>(out.c(), inp.c(), w.c(), bias.c(), k.N, k.IC, k.OC); },
             [&] { cuda::matmul_forward(out.g(), inp.g(), w.g(), bias.g(), k.N, k.IC, k.OC, stream_, p); });
    EXPECT_FALSE(matches(out, kRoundedTol)) << meshlm::name_of(p) << ": no rounding seen";
  }
}

// ---- attention ------------------------------------------------------------------------

struct AttentionCase {
  int B, T, C, NH;
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH);
  }
};
const AttentionCase kAttentionCases[] = {
    {1, 1, 4, 1},       // one position, one head
    {3, 1, 8, 2},       // T = 1, several rows and heads
    {2, 7, 12, 3},      // HS = 4, T not a power of two
    {3, 5, 15, 5},      // HS = 3
    {2, 64, 64, 4},     // HS = 16
    {1, 129, 96, 2},    // HS = 48, T one past a power of two
    {2, 128, 768, 12},  // GPT-2 heads (HS = 64)
};
// q, k, v uniform in [-kQkvRange, kQkvRange]: scores q.k / sqrt(HS) of about
// +-1 for HS = 64, so that the softmax is neither flat nor one-hot.
constexpr double kQkvRange = 2.0;

// Elements above the diagonal of the (T,T) matrices of att that are not
// exactly 0.
testing::AssertionResult future_masked(const std::vector<float>& att, int T) {
  size_t bad = 0;
  for (size_t m = 0; m < att.size(); m += size_t(T) * T)
    for (int t = 0; t < T; ++t)
      for (int s = t + 1; s < T; ++s) bad += att[m + size_t(t) * T + s] != 0.0f;
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << bad << " probabilities above the diagonal are not 0";
}

// out and the probabilities att, which are exactly 0 above the diagonal.
TEST_F(CudaOps, AttentionForward) {
  for (const AttentionCase& k : kAttentionCases) {
    SCOPED_TRACE(k.str());
    const int B = k.B, T = k.T, C = k.C, NH = k.NH;
    Both<float> qkv = input(size_t(B) * T * 3 * C, -kQkvRange, kQkvRange);
    Both<float> out = output(size_t(B) * T * C), att = output(size_t(B) * NH * T * T);
    run_both([&] { ops::attention_forward<float>(out.c(), att.c(), qkv.c(), B, T, C, NH); },
             [&] { cuda::attention_forward(out.g(), att.g(), qkv.g(), B, T, C, NH, stream_); });
    EXPECT_TRUE(matches(out, kTol));
    EXPECT_TRUE(matches(att, kTol));
    EXPECT_TRUE(future_masked(att.gpu(), T));
  }
}

// dq, dk and dv (compared one by one: dv is larger than dq and dk, and would
// hide their errors in one norm) from the probabilities of the CPU forward;
// datt is scratch, NaN before.
TEST_F(CudaOps, AttentionBackward) {
  for (const AttentionCase& k : kAttentionCases) {
    SCOPED_TRACE(k.str());
    const int B = k.B, T = k.T, C = k.C, NH = k.NH;
    std::vector<float> qkv_v = uniform_floats(size_t(B) * T * 3 * C, next_seed(), -kQkvRange, kQkvRange);
    std::vector<float> out_v(size_t(B) * T * C), att_v(size_t(B) * NH * T * T);
    ops::attention_forward<float>(out_v.data(), att_v.data(), qkv_v.data(), B, T, C, NH);
    Both<float> qkv(std::move(qkv_v)), att(std::move(att_v));
    Both<float> dout = input(size_t(B) * T * C);
    Both<float> dqkv = output(size_t(B) * T * 3 * C), datt = output(size_t(B) * NH * T * T);
    run_both(
        [&] {
          ops::attention_backward<float>(dqkv.c(), datt.c(), dout.c(), qkv.c(), att.c(), B, T, C,
                                         NH);
        },
        [&] {
          cuda::attention_backward(dqkv.g(), datt.g(), dout.g(), qkv.g(), att.g(), B, T, C, NH,
                                   stream_);
        });
    const size_t C3 = 3 * size_t(C);
    EXPECT_TRUE(matches_columns(dqkv, C3, 0, C, kTol)) << "dq";
    EXPECT_TRUE(matches_columns(dqkv, C3, C, 2 * size_t(C), kTol)) << "dk";
    EXPECT_TRUE(matches_columns(dqkv, C3, 2 * size_t(C), C3, kTol)) << "dv";
  }
}

// ---- flash attention -------------------------------------------------------------------
// cuda::flash_attention_* against ops::flash_attention_* at the same 16-bit
// precision (both round the same GEMM inputs; the GPU rounds each block's
// unnormalised probabilities, the CPU the normalised ones, and they sum in
// other orders), and against the GPU's probabilities version.

struct FlashCase {
  int B, T, C, NH;
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH);
  }
};
const FlashCase kFlashCases[] = {
    {1, 1, 16, 1},      // one position, HS = 16
    {3, 5, 64, 2},      // HS = 32, T within one block
    {2, 64, 128, 8},    // HS = 16, T exactly one block
    {2, 65, 192, 3},    // HS = 64, one row into the second block
    {1, 200, 256, 2},   // HS = 128, four blocks, the last of 8 rows
    {2, 129, 768, 12},  // GPT-2 heads
};
// Relative L2 tolerances of the output and of each gradient: bf16 keeps 8
// bits (2^-9 = 2e-3 relative rounding), fp16 11 (2^-12 = 2.4e-4). The two
// sides round the same inputs except P (before or after normalising), so
// the outputs differ by about one rounding of P: the kernel's arithmetic
// emulated in double with PyTorch's roundings (tests/torch/flash_rounding.py)
// differs from the CPU's on these cases by 1.4e-3 to 1.9e-3 (bf16) and
// 1.7e-4 to 2.3e-4 (fp16). The backward is the same
// arithmetic on both sides in another order, where a sum that lands on the
// other side of a 16-bit rounding boundary moves dS or P by one 16-bit ulp;
// dS = P (dP - D) cancels, and the CPU's flash and probabilities versions
// differ by 2.4e-3 (bf16) and 2.7e-4 (fp16) there (test_precision).
constexpr double kFlashOutTol[] = {0, 5e-3, 1e-3};   // by ops::Precision: -, bf16, fp16
constexpr double kFlashGradTol[] = {0, 2e-2, 4e-3};
// lse comes from fp32 scores of the same rounded q and k on both sides.
constexpr double kFlashLseTol = 1e-5;

class CudaFlash : public CudaOps, public testing::WithParamInterface<ops::Precision> {};

TEST_P(CudaFlash, ForwardMatchesTheCpu) {
  const ops::Precision p = GetParam();
  const ops::Kernels& cpu = ops::Kernels::cpu(p);
  for (const FlashCase& k : kFlashCases) {
    SCOPED_TRACE(k.str());
    const int B = k.B, T = k.T, C = k.C, NH = k.NH;
    Both<float> qkv = input(size_t(B) * T * 3 * C, -kQkvRange, kQkvRange);
    Both<float> out = output(size_t(B) * T * C), lse = output(size_t(B) * NH * T);
    run_both([&] { cpu.flash_attention_forward(out.c(), lse.c(), qkv.c(), B, T, C, NH); },
             [&] { cuda::flash_attention_forward(out.g(), lse.g(), qkv.g(), B, T, C, NH, stream_, p); });
    EXPECT_TRUE(matches(out, kFlashOutTol[int(p)]));
    EXPECT_TRUE(matches(lse, kFlashLseTol));
    // The GPU's probabilities version at the same precision.
    DeviceArray<float> ref(out.cpu.size()), att(size_t(B) * NH * T * T);
    cuda::attention_forward(ref.get(), att.get(), qkv.g(), B, T, C, NH, stream_, p);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    EXPECT_TRUE(close(out.gpu(), ref.download(), kFlashOutTol[int(p)])) << "against cuda::attention_forward";
  }
}

TEST_P(CudaFlash, BackwardMatchesTheCpuAndIsDeterministic) {
  const ops::Precision p = GetParam();
  const ops::Kernels& cpu = ops::Kernels::cpu(p);
  for (const FlashCase& k : kFlashCases) {
    SCOPED_TRACE(k.str());
    const int B = k.B, T = k.T, C = k.C, NH = k.NH;
    // Both sides from the CPU's forward.
    std::vector<float> qkv_v = uniform_floats(size_t(B) * T * 3 * C, next_seed(), -kQkvRange, kQkvRange);
    std::vector<float> out_v(size_t(B) * T * C), lse_v(size_t(B) * NH * T);
    cpu.flash_attention_forward(out_v.data(), lse_v.data(), qkv_v.data(), B, T, C, NH);
    Both<float> qkv(std::move(qkv_v)), out(std::move(out_v)), lse(std::move(lse_v));
    Both<float> dout = input(size_t(B) * T * C);
    Both<float> dqkv = output(size_t(B) * T * 3 * C), delta = output(size_t(B) * NH * T);
    auto gpu_op = [&] {
      cuda::flash_attention_backward(dqkv.g(), delta.g(), dout.g(), out.g(), qkv.g(), lse.g(), B,
                                     T, C, NH, stream_, p);
    };
    run_both(
        [&] {
          cpu.flash_attention_backward(dqkv.c(), delta.c(), dout.c(), out.c(), qkv.c(), lse.c(), B,
                                       T, C, NH);
        },
        gpu_op);
    const size_t C3 = 3 * size_t(C);
    const double tol = kFlashGradTol[int(p)];
    EXPECT_TRUE(matches_columns(dqkv, C3, 0, C, tol)) << "dq";
    EXPECT_TRUE(matches_columns(dqkv, C3, C, 2 * size_t(C), tol)) << "dk";
    EXPECT_TRUE(matches_columns(dqkv, C3, 2 * size_t(C), C3, tol)) << "dv";
    EXPECT_TRUE(matches(delta, kTol)) << "D = dout . out";
    const std::vector<float> first = dqkv.gpu();
    dqkv.restart_gpu();
    run_gpu(gpu_op);
    EXPECT_TRUE(same_bits(dqkv.gpu(), first)) << "a second run";
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaFlash,
                         testing::Values(ops::Precision::bf16, ops::Precision::fp16),
                         [](const testing::TestParamInfo<ops::Precision>& i) {
                           return std::string(meshlm::name_of(i.param));
                         });

// fp32, and head sizes the kernel has no tiles for, are refused by name.
TEST_F(CudaOps, FlashAttentionRefusesWhatItDoesNotCover) {
  DeviceArray<float> qkv(3 * 64 * 4), out(64 * 4), lse(4);
  for (const auto& [C, p] : {std::pair{64, ops::Precision::fp32}, std::pair{48, ops::Precision::bf16}}) {
    try {
      cuda::flash_attention_forward(out.get(), lse.get(), qkv.get(), 1, 4, C, 1, stream_, p);
      ADD_FAILURE() << "C = " << C << " at " << meshlm::name_of(p) << " was not refused";
    } catch (const meshlm::RankError& e) {
      EXPECT_NE(std::string(e.what()).find("flash_attention_forward"), std::string::npos) << e.what();
    }
  }
}

// ---- residual ---------------------------------------------------------------------------

const size_t kResidualSizes[] = {1, 5, 4097, (size_t(1) << 20) + 3};

// out = a + b: one addition per element, the same bits.
TEST_F(CudaOps, ResidualForward) {
  for (size_t n : kResidualSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    Both<float> a = input(n), b = input(n), out = output(n);
    run_both([&] { ops::residual_forward<float>(out.c(), a.c(), b.c(), n); },
             [&] { cuda::residual_forward(out.g(), a.g(), b.g(), n, stream_); });
    EXPECT_TRUE(matches(out, kExact));
  }
}

// da += dout and db += dout, exactly.
TEST_F(CudaOps, ResidualBackward) {
  for (size_t n : kResidualSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    Both<float> dout = input(n), da = gradient(n), db = gradient(n);
    run_both([&] { ops::residual_backward<float>(da.c(), db.c(), dout.c(), n); },
             [&] { cuda::residual_backward(da.g(), db.g(), dout.g(), n, stream_); });
    EXPECT_TRUE(matches(da, kExact));
    EXPECT_TRUE(matches(db, kExact));
  }
}

// ---- vocabulary-parallel cross-entropy --------------------------------------------------

struct XentCase {
  int N, V, Vl, v0;
  // This rank's real (unpadded) columns: [0, nreal).
  int nreal() const { return std::clamp(V - v0, 0, Vl); }
  std::string str() const {
    return "N=" + std::to_string(N) + " V=" + std::to_string(V) + " Vl=" + std::to_string(Vl) +
           " v0=" + std::to_string(v0);
  }
};
const XentCase kXentCases[] = {
    {3, 50257, 50304, 0},  // GPT-2 on one rank: 47 padding columns
    {1, 7, 64, 0},         // one row, mostly padding
    {37, 1000, 512, 0},    // first of two ranks: no padding
    {37, 1000, 512, 512},  // second of two: 24 padding columns
    {9, 100, 64, 64},      // 36 real columns, 28 padding
    {9, 100, 64, 128},     // padding only (v0 >= V)
    {6, 30, 33, 0},        // Vl odd: rows not 16-byte aligned
};

// Logits of this rank: real columns uniform in [-4, 4], padding columns near
// 1000, which would win the max and overflow exp if they took part.
std::vector<float> xent_logits(const XentCase& k, uint64_t seed) {
  std::vector<float> l = uniform_floats(size_t(k.N) * k.Vl, seed, -4.0, 4.0);
  for (int n = 0; n < k.N; ++n)
    for (int v = k.nreal(); v < k.Vl; ++v) l[size_t(n) * k.Vl + v] += 1000.0f;
  return l;
}

// Targets in [0, V): every other row on this rank's real columns (where it
// has any), the others anywhere in [0, V).
std::vector<int32_t> xent_targets(const XentCase& k, uint64_t seed) {
  std::vector<int32_t> t = uniform_ints(k.N, seed, 0, k.V);
  const std::vector<int32_t> on =
      k.nreal() > 0 ? uniform_ints(k.N, seed + 1, k.v0, k.v0 + k.nreal()) : std::vector<int32_t>();
  for (int n = 0; n < k.N && !on.empty(); n += 2) t[n] = on[n];
  return t;
}

// The row maxima after the MAX over the group: the local one, or another
// rank's larger one (finite also where this rank holds only padding).
std::vector<float> group_max(const XentCase& k, const std::vector<float>& logits, uint64_t seed) {
  std::vector<float> mx(k.N);
  ops::xent_local_max<float>(mx.data(), logits.data(), k.N, k.Vl, k.v0, k.V);
  const std::vector<float> other = uniform_floats(k.N, seed, -1.0, 5.0);
  for (int n = 0; n < k.N; ++n) mx[n] = std::max(mx[n], other[n]);
  return mx;
}

// The max of the real columns only, exactly; -inf on a rank of padding only.
TEST_F(CudaOps, XentLocalMax) {
  for (const XentCase& k : kXentCases) {
    SCOPED_TRACE(k.str());
    Both<float> logits(xent_logits(k, next_seed())), rowmax = output(k.N);
    run_both([&] { ops::xent_local_max<float>(rowmax.c(), logits.c(), k.N, k.Vl, k.v0, k.V); },
             [&] { cuda::xent_local_max(rowmax.g(), logits.g(), k.N, k.Vl, k.v0, k.V, stream_); });
    EXPECT_TRUE(matches(rowmax, kExact));
  }
}

// sums(N,2): the sum of exp over the real columns (a reduction), and the
// target's logit where the rank holds it, else 0 (a copy, exact).
TEST_F(CudaOps, XentLocalSums) {
  for (const XentCase& k : kXentCases) {
    SCOPED_TRACE(k.str());
    std::vector<float> l = xent_logits(k, next_seed());
    Both<float> rowmax(group_max(k, l, next_seed()));
    Both<float> logits(std::move(l)), sums = output(2 * size_t(k.N));
    Both<int32_t> targets(xent_targets(k, next_seed()));
    run_both(
        [&] {
          ops::xent_local_sums<float>(sums.c(), logits.c(), rowmax.c(), targets.c(), k.N, k.Vl,
                                      k.v0, k.V);
        },
        [&] {
          cuda::xent_local_sums(sums.g(), logits.g(), rowmax.g(), targets.g(), k.N, k.Vl, k.v0, k.V,
                                stream_);
        });
    EXPECT_TRUE(matches_columns(sums, 2, 0, 1, kTolVocabSum)) << "sum of exp";
    EXPECT_TRUE(matches_columns(sums, 2, 1, 2, kExact)) << "target logit";
  }
}

// losses = log(sum) + max - target logit, from reduced sums and maxima.
TEST_F(CudaOps, XentLosses) {
  for (int N : {1, 37, 4099}) {
    SCOPED_TRACE("N=" + std::to_string(N));
    const std::vector<float> s = uniform_floats(N, next_seed(), 1.0, 1e4),
                             t = uniform_floats(N, next_seed(), -4.0, 4.0);
    std::vector<float> sums_v(2 * size_t(N));
    for (int n = 0; n < N; ++n) sums_v[2 * n] = s[n], sums_v[2 * n + 1] = t[n];
    Both<float> rowmax = input(N, -1.0, 5.0), sums(std::move(sums_v)), losses = output(N);
    run_both([&] { ops::xent_losses<float>(losses.c(), rowmax.c(), sums.c(), N); },
             [&] { cuda::xent_losses(losses.g(), rowmax.g(), sums.g(), N, stream_); });
    EXPECT_TRUE(matches(losses, kTol));
  }
}

// Padding columns of dlogits that are not exactly 0.
testing::AssertionResult padding_zero(const std::vector<float>& d, const XentCase& k) {
  size_t bad = 0;
  for (int n = 0; n < k.N; ++n)
    for (int v = k.nreal(); v < k.Vl; ++v) bad += d[size_t(n) * k.Vl + v] != 0.0f;
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << bad << " padding columns of dlogits are not exactly 0";
}

// In place: logits become (softmax - onehot(target)) * dloss on the real
// columns, exactly 0 on the padding ones.
TEST_F(CudaOps, XentLocalBackward) {
  for (const XentCase& k : kXentCases) {
    SCOPED_TRACE(k.str());
    std::vector<float> l = xent_logits(k, next_seed());
    const std::vector<int32_t> t = xent_targets(k, next_seed());
    // The group's max and sums: this rank's part plus the other ranks' (a
    // positive sum of exp of their own).
    const std::vector<float> mx = group_max(k, l, next_seed());
    std::vector<float> sums_v(2 * size_t(k.N));
    ops::xent_local_sums<float>(sums_v.data(), l.data(), mx.data(), t.data(), k.N, k.Vl, k.v0, k.V);
    const std::vector<float> others = uniform_floats(k.N, next_seed(), 0.5, 20.0);
    for (int n = 0; n < k.N; ++n) sums_v[2 * n] += others[n];
    Both<float> rowmax(mx), sums(std::move(sums_v)), dlosses = input(k.N);
    Both<int32_t> targets(t);
    Both<float> dlogits(std::move(l));  // logits in, dlogits out
    run_both(
        [&] {
          ops::xent_local_backward<float>(dlogits.c(), rowmax.c(), sums.c(), dlosses.c(),
                                          targets.c(), k.N, k.Vl, k.v0, k.V);
        },
        [&] {
          cuda::xent_local_backward(dlogits.g(), rowmax.g(), sums.g(), dlosses.g(), targets.g(),
                                    k.N, k.Vl, k.v0, k.V, stream_);
        });
    EXPECT_TRUE(matches(dlogits, kTol));
    EXPECT_TRUE(padding_zero(dlogits.gpu(), k));
  }
}

// xent_rows: rows holding the whole vocabulary (v0 = 0), the max and the
// sum of exp in one read and the gradient in place, against the three ops
// it stands for. Rows rising from start to end make the online sum rescale
// at every element; without dlosses the logits stay as they were.
TEST_F(CudaOps, XentRowsIsMaxSumsAndBackwardInOne) {
  const XentCase cases[] = {
      {3, 50257, 50304, 0},  // GPT-2: 47 padding columns, 16-byte rows
      {1, 7, 64, 0},         // mostly padding
      {37, 512, 512, 0},     // no padding
      {6, 30, 33, 0},        // Vl odd: rows not 16-byte aligned
      {5, 1031, 1032, 0},    // a tail of real columns after the last float4
  };
  for (const XentCase& k : cases) {
    for (bool rising : {false, true}) {
      for (bool with_grad : {false, true}) {
        SCOPED_TRACE(k.str() + (rising ? " rising" : "") + (with_grad ? " with dlosses" : ""));
        std::vector<float> l = xent_logits(k, next_seed());
        if (rising)
          for (int n = 0; n < k.N; ++n)
            for (int v = 0; v < k.nreal(); ++v)
              l[size_t(n) * k.Vl + v] = -20.0f + 40.0f * float(v) / float(k.nreal());
        Both<float> logits(l), rowmax = output(k.N), sums = output(2 * size_t(k.N));
        Both<float> dlosses = input(k.N);
        Both<int32_t> targets(xent_targets(k, next_seed()));
        const float* dl_c = with_grad ? dlosses.c() : nullptr;
        const float* dl_g = with_grad ? dlosses.g() : nullptr;
        run_both(
            [&] {
              ops::xent_local_max<float>(rowmax.c(), logits.c(), k.N, k.Vl, 0, k.V);
              ops::xent_local_sums<float>(sums.c(), logits.c(), rowmax.c(), targets.c(), k.N,
                                          k.Vl, 0, k.V);
              if (with_grad)
                ops::xent_local_backward<float>(logits.c(), rowmax.c(), sums.c(), dl_c,
                                                targets.c(), k.N, k.Vl, 0, k.V);
            },
            [&] {
              cuda::xent_rows(logits.g(), rowmax.g(), sums.g(), dl_g, targets.g(), k.N, k.Vl,
                              k.V, stream_);
            });
        EXPECT_TRUE(matches(rowmax, kExact)) << "max";
        EXPECT_TRUE(matches_columns(sums, 2, 0, 1, kTolVocabSum)) << "sum of exp";
        EXPECT_TRUE(matches_columns(sums, 2, 1, 2, kExact)) << "target logit";
        if (with_grad) {
          EXPECT_TRUE(matches(logits, kTol)) << "dlogits";
          EXPECT_TRUE(padding_zero(logits.gpu(), k));
        } else {
          EXPECT_TRUE(same_bits(logits.gpu(), l)) << "logits changed without dlosses";
        }
        // The same bits on a second run.
        const std::vector<float> first = logits.gpu(), first_sums = sums.gpu();
        Both<float> again(l);
        run_gpu([&] {
          cuda::xent_rows(again.g(), rowmax.g(), sums.g(), dl_g, targets.g(), k.N, k.Vl, k.V,
                          stream_);
        });
        EXPECT_TRUE(same_bits(again.gpu(), first));
        EXPECT_TRUE(same_bits(sums.gpu(), first_sums));
      }
    }
  }
}

}  // namespace

// ---- Llama's ops: RMSNorm, rope, SwiGLU, grouped-query packing ----------------------

// out and rstd written; dinp and dw accumulate (dw null: frozen), dw the same
// bits every run.
TEST_F(CudaOps, RmsNorm) {
  for (const LayerNormCase& k : kLayerNormCases) {
    SCOPED_TRACE(k.str());
    const int N = k.N, C = k.C;
    Both<float> inp(layernorm_input(N, C, next_seed())), w = input(C);
    Both<float> out = output(size_t(N) * C), rstd = output(N);
    run_both([&] { ops::rmsnorm_forward<float>(out.c(), rstd.c(), inp.c(), w.c(), N, C, 1e-5); },
             [&] { cuda::rmsnorm_forward(out.g(), rstd.g(), inp.g(), w.g(), N, C, 1e-5, stream_); });
    EXPECT_TRUE(matches(out, kTol));
    EXPECT_TRUE(matches(rstd, kTol));
    Both<float> kept(rstd.cpu), dout = input(size_t(N) * C);
    for (const bool frozen : {false, true}) {
      Both<float> dinp = gradient(size_t(N) * C), dw = gradient(C);
      run_both(
          [&] {
            ops::rmsnorm_backward<float>(dinp.c(), frozen ? nullptr : dw.c(), dout.c(), inp.c(),
                                         w.c(), kept.c(), N, C);
          },
          [&] {
            cuda::rmsnorm_backward(dinp.g(), frozen ? nullptr : dw.g(), dout.g(), inp.g(), w.g(),
                                   kept.g(), N, C, stream_);
          });
      EXPECT_TRUE(matches(dinp, kTol));
      if (frozen) {
        EXPECT_TRUE(same_bits(dw.gpu(), dw.start()));
        continue;
      }
      EXPECT_TRUE(matches(dw, kTol));
      const std::vector<float> first = dw.gpu();
      dw.restart_gpu();
      dinp.restart_gpu();
      run_gpu([&] {
        cuda::rmsnorm_backward(dinp.g(), dw.g(), dout.g(), inp.g(), w.g(), kept.g(), N, C, stream_);
      });
      EXPECT_TRUE(same_bits(dw.gpu(), first));
    }
  }
}

// The fused residual add: res a single IEEE addition (the CPU's bits), out
// and rstd as the plain RMSNorm; all three written.
TEST_F(CudaOps, ResidualRmsNorm) {
  for (const LayerNormCase& k : kLayerNormCases) {
    SCOPED_TRACE(k.str());
    const int N = k.N, C = k.C;
    Both<float> a(layernorm_input(N, C, next_seed())), b = input(size_t(N) * C), w = input(C);
    Both<float> res = output(size_t(N) * C), out = output(size_t(N) * C), rstd = output(N);
    run_both(
        [&] {
          ops::residual_rmsnorm_forward<float>(res.c(), out.c(), rstd.c(), a.c(), b.c(), w.c(), N,
                                               C, 1e-5);
        },
        [&] {
          cuda::residual_rmsnorm_forward(res.g(), out.g(), rstd.g(), a.g(), b.g(), w.g(), N, C,
                                         1e-5, stream_);
        });
    EXPECT_TRUE(matches(res, kExact));
    EXPECT_TRUE(matches(out, kTol));
    EXPECT_TRUE(matches(rstd, kTol));
  }
}

// q's heads inside packed rows (ld larger than the heads), the rest of each
// row untouched; forward then backward on the same tables.
TEST_F(CudaOps, Rope) {
  struct Case {
    int B, T, heads, HS;
    size_t ld;
  };
  for (const Case& k : {Case{1, 1, 1, 2, 2}, Case{2, 7, 3, 8, 44}, Case{3, 33, 12, 64, 2304},
                        Case{1, 128, 8, 128, 3072}}) {
    SCOPED_TRACE("B " + std::to_string(k.B) + " T " + std::to_string(k.T) + " heads " +
                 std::to_string(k.heads) + " HS " + std::to_string(k.HS));
    std::vector<float> inv(k.HS / 2);
    ops::rope_inv_freq(inv.data(), k.HS, 500000.0,
                       {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                        .original_max_positions = 64});
    std::vector<float> c(size_t(k.T) * k.HS / 2), s(c.size());
    ops::rope_tables(c.data(), s.data(), inv.data(), k.T, k.HS);
    Both<float> cos(c), sin(s);
    Both<float> x = input(size_t(k.B) * k.T * k.ld);
    run_both([&] { ops::rope_forward<float>(x.c(), cos.c(), sin.c(), k.B, k.T, k.heads, k.HS, k.ld); },
             [&] { cuda::rope_forward(x.g(), cos.g(), sin.g(), k.B, k.T, k.heads, k.HS, k.ld, stream_); });
    EXPECT_TRUE(matches(x, kTol));
    EXPECT_TRUE(same_bits(columns(x.gpu(), k.ld, k.heads * k.HS, k.ld),
                          columns(x.start(), k.ld, k.heads * k.HS, k.ld)));
    Both<float> dx = input(size_t(k.B) * k.T * k.ld);
    run_both([&] { ops::rope_backward<float>(dx.c(), cos.c(), sin.c(), k.B, k.T, k.heads, k.HS, k.ld); },
             [&] { cuda::rope_backward(dx.g(), cos.g(), sin.g(), k.B, k.T, k.heads, k.HS, k.ld, stream_); });
    EXPECT_TRUE(matches(dx, kTol));
  }
}

// gate and up separate (ld = F) and packed side by side (ld = 2F); the input
// gradients overwritten.
TEST_F(CudaOps, SwiGlu) {
  for (const auto [N, F] : {std::pair{1, 1}, std::pair{7, 33}, std::pair{256, 1376}}) {
    for (const bool packed : {false, true}) {
      SCOPED_TRACE("N " + std::to_string(N) + " F " + std::to_string(F) + (packed ? " packed" : ""));
      const size_t ld = packed ? 2 * size_t(F) : size_t(F);
      Both<float> gu = input(size_t(N) * ld * (packed ? 1 : 2), -6.0, 6.0);
      float* gate_c = gu.c();
      float* up_c = gu.c() + (packed ? F : size_t(N) * F);
      float* gate_g = gu.g();
      float* up_g = gu.g() + (packed ? F : size_t(N) * F);
      Both<float> out = output(size_t(N) * F);
      run_both([&] { ops::swiglu_forward<float>(out.c(), gate_c, up_c, N, F, ld); },
               [&] { cuda::swiglu_forward(out.g(), gate_g, up_g, N, F, ld, stream_); });
      EXPECT_TRUE(matches(out, kTol));
      Both<float> dout = input(size_t(N) * F), dgu = output(gu.cpu.size());
      float* dgate_c = dgu.c();
      float* dup_c = dgu.c() + (packed ? F : size_t(N) * F);
      float* dgate_g = dgu.g();
      float* dup_g = dgu.g() + (packed ? F : size_t(N) * F);
      run_both([&] { ops::swiglu_backward<float>(dgate_c, dup_c, dout.c(), gate_c, up_c, N, F, ld); },
               [&] { cuda::swiglu_backward(dgate_g, dup_g, dout.g(), gate_g, up_g, N, F, ld, stream_); });
      EXPECT_TRUE(matches(dgu, kTol));
    }
  }
}

// The packing copies exactly; the key/value gradients are sums over each
// group in order, as the CPU's. Also a tensor-parallel rank's map: its query
// heads from q_head0 on, reading replicated key/value heads.
TEST_F(CudaOps, GroupedQueryPacking) {
  struct Case {
    int N, NH, NKV, HS;
    ops::GqaMap map;
  };
  for (const Case& k : {Case{1, 1, 1, 2, {}}, Case{5, 6, 2, 8, {}}, Case{64, 32, 8, 64, {}},
                        Case{3, 4, 4, 16, {}}, Case{5, 4, 4, 8, {4, 3}}, Case{7, 2, 2, 8, {2, 3}}}) {
    SCOPED_TRACE("N " + std::to_string(k.N) + " NH " + std::to_string(k.NH) + " NKV " +
                 std::to_string(k.NKV) + " q_head0 " + std::to_string(k.map.q_head0));
    const size_t C = size_t(k.NH) * k.HS, Ckv = size_t(k.NKV) * k.HS;
    Both<float> q = input(k.N * C), kk = input(k.N * Ckv), v = input(k.N * Ckv);
    Both<float> qkv = output(k.N * 3 * C);
    run_both([&] { ops::gqa_pack_forward<float>(qkv.c(), q.c(), kk.c(), v.c(), k.N, k.NH, k.NKV, k.HS, k.map); },
             [&] { cuda::gqa_pack_forward(qkv.g(), q.g(), kk.g(), v.g(), k.N, k.NH, k.NKV, k.HS, k.map, stream_); });
    EXPECT_TRUE(same_bits(qkv.gpu(), qkv.cpu));
    Both<float> dqkv = input(k.N * 3 * C);
    Both<float> dq = output(k.N * C), dk = output(k.N * Ckv), dv = output(k.N * Ckv);
    run_both([&] { ops::gqa_pack_backward<float>(dq.c(), dk.c(), dv.c(), dqkv.c(), k.N, k.NH, k.NKV, k.HS, k.map); },
             [&] { cuda::gqa_pack_backward(dq.g(), dk.g(), dv.g(), dqkv.g(), k.N, k.NH, k.NKV, k.HS, k.map, stream_); });
    EXPECT_TRUE(same_bits(dq.gpu(), dq.cpu));
    EXPECT_TRUE(same_bits(dk.gpu(), dk.cpu));
    EXPECT_TRUE(same_bits(dv.gpu(), dv.cpu));
  }
}

// ---- attention against a key/value cache (meshlm generate) ---------------------------

// The new rows appended exactly (the cache's other rows untouched), the
// attention of every row and head within kTol, the same bits on a second
// run. Cases: one decoding step at position 0 and deep into the cache,
// prefill chunks that continue a cache, grouped and multi-query heads, a
// head size that does not divide the block (80) and one larger than it (300).
TEST_F(CudaOps, CachedAttention) {
  struct Case {
    int n, p0, NH, NKV, HS;
  };
  for (const Case& k : {Case{1, 0, 1, 1, 2}, Case{1, 37, 12, 12, 64}, Case{7, 20, 4, 2, 16},
                        Case{128, 0, 32, 8, 64}, Case{64, 900, 12, 12, 64}, Case{3, 5, 2, 1, 80},
                        Case{2, 9, 2, 2, 300}}) {
    SCOPED_TRACE("n " + std::to_string(k.n) + " p0 " + std::to_string(k.p0) + " NH " +
                 std::to_string(k.NH) + " NKV " + std::to_string(k.NKV) + " HS " +
                 std::to_string(k.HS));
    const size_t C = size_t(k.NH) * k.HS, Ckv = size_t(k.NKV) * k.HS;
    const int keys = k.p0 + k.n, context = keys + 3;  // rows past the new ones stay as they are
    const size_t ldq = 3 * C, ldkv = Ckv + 5;         // rows inside wider buffers
    Both<float> kc = input(size_t(context) * Ckv, -2.0, 2.0), vc = input(size_t(context) * Ckv);
    Both<float> q = input(size_t(k.n) * ldq, -2.0, 2.0), kk = input(size_t(k.n) * ldkv, -2.0, 2.0),
                v = input(size_t(k.n) * ldkv);
    Both<float> out = output(size_t(k.n) * C);
    std::vector<float> cpu_scratch(ops::cached_attention_scratch(k.n, keys, 1));
    const size_t gpu_floats = cuda::cached_attention_scratch(k.n, keys, k.NH);
    DeviceArray<float> gpu_scratch(gpu_floats);
    auto gpu_op = [&] {
      cuda::cached_attention_forward(out.g(), kc.g(), vc.g(), q.g(), ldq, kk.g(), v.g(), ldkv, k.n,
                                     k.p0, k.NH, k.NKV, k.HS, gpu_scratch.get(), gpu_floats,
                                     stream_);
    };
    run_both(
        [&] {
          ops::cached_attention_forward(out.c(), kc.c(), vc.c(), q.c(), ldq, kk.c(), v.c(), ldkv,
                                        k.n, k.p0, k.NH, k.NKV, k.HS, cpu_scratch.data(),
                                        cpu_scratch.size());
        },
        gpu_op);
    EXPECT_TRUE(same_bits(kc.gpu(), kc.cpu));
    EXPECT_TRUE(same_bits(vc.gpu(), vc.cpu));
    EXPECT_TRUE(matches(out, kTol));
    const std::vector<float> first = out.gpu();
    out.restart_gpu();
    run_gpu(gpu_op);
    EXPECT_TRUE(same_bits(out.gpu(), first));
  }
}

// ---- a micro-batch's mean loss ----------------------------------------------------------

// ops::mean against cuda::mean: n = 1, fewer rows than the block's threads,
// GPT-2's 16 x 1024 rows; within kTol (both sum in double), the same bits
// twice.
TEST_F(CudaOps, Mean) {
  for (const size_t n : {size_t(1), size_t(37), size_t(16384), size_t(100003)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    Both<float> x = input(n, 0.0, 11.0), out = output(1);
    run_both([&] { ops::mean(out.c(), x.c(), n); }, [&] { cuda::mean(out.g(), x.g(), n, stream_); });
    EXPECT_TRUE(matches(out, kTol));
    const std::vector<float> first = out.gpu();
    out.restart_gpu();
    run_gpu([&] { cuda::mean(out.g(), x.g(), n, stream_); });
    EXPECT_TRUE(same_bits(out.gpu(), first));
  }
}
