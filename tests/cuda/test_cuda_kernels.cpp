// The CUDA backend behind ops::Kernels (cuda::make_kernels) against
// ops::Kernels::cpu(): the row-major GEMM in every transpose with alpha and
// beta, zero, add, add_bias, and LoRA's forward and backward, which the
// model runs through the interface. Every test skips, with the reason,
// where no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/device_memory.h"
#include "cuda/kernels_cuda.h"
#include "cuda_test.h"
#include "model/lora.h"
#include "ops/kernels.h"

using namespace meshlm;

namespace {

// fp32 on both sides (no TF32), different summation orders.
constexpr double kTol = 1e-5;

testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                               double tol) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return testing::AssertionFailure() << "element " << i << " is " << got[i];
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1));
  if (rel <= tol) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "relative difference " << rel << " > " << tol;
}

class CudaKernels : public CudaTest {
protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cuda::install_device_memory();  // for the kernels' own device Buffers
    gpu_ = cuda::make_kernels(stream_);
  }
  void TearDown() override {
    gpu_.reset();  // it waits for its stream when destroyed: before the stream goes
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void sync() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<ops::Kernels> gpu_;
  const ops::Kernels& cpu_ = ops::Kernels::cpu();
};

}  // namespace

TEST_F(CudaKernels, ReportTheirDevice) {
  EXPECT_EQ(gpu_->device(), Device::cuda);
  EXPECT_EQ(cpu_.device(), Device::cpu);
}

// C = alpha op(A) op(B) + beta C for the four transpose pairs, on
// sub-matrices (leading dimensions larger than the rows).
TEST_F(CudaKernels, GemmInEveryTransposeMatchesTheCpu) {
  const int M = 37, N = 53, K = 29, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const std::vector<float> A = uniform_floats(size_t(ta ? K : M) * lda, 1);
      const std::vector<float> B = uniform_floats(size_t(tb ? N : K) * ldb, 2);
      std::vector<float> C = uniform_floats(size_t(M) * ldc, 3);
      DeviceArray<float> dA(A.size()), dB(B.size()), dC(C.size());
      dA.upload(A);
      dB.upload(B);
      dC.upload(C);
      gpu_->gemm(ta, tb, M, N, K, 0.75f, dA.get(), lda, dB.get(), ldb, 0.5f, dC.get(), ldc);
      cpu_.gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, C.data(), ldc);
      sync();
      EXPECT_TRUE(close(dC.download(), C, kTol)) << "ta " << ta << " tb " << tb;
    }
}

// At bf16 and fp16 cuBLAS rounds A and B as the CPU emulation does (to
// nearest, ties to even): the same inputs give the same rounded products, so
// only the summation order differs. A K large enough for the rounding to
// show: the fp32 result is far outside this tolerance (checked).
TEST_F(CudaKernels, GemmAtBf16AndFp16RoundsAsTheCpu) {
  const int M = 64, N = 96, K = 256;
  const std::vector<float> A = uniform_floats(size_t(M) * K, 21), B = uniform_floats(size_t(K) * N, 22);
  const std::vector<float> C0 = uniform_floats(size_t(M) * N, 23);
  DeviceArray<float> dA(A.size()), dB(B.size()), dC(C0.size());
  dA.upload(A);
  dB.upload(B);
  for (ops::Precision p : {ops::Precision::bf16, ops::Precision::fp16}) {
    const std::unique_ptr<ops::Kernels> gpu = cuda::make_kernels(stream_, p);
    ASSERT_EQ(gpu->precision(), p);
    for (bool tb : {false, true}) {
      std::vector<float> C = C0, C32 = C0;
      dC.upload(C0);
      gpu->gemm(false, tb, M, N, K, 1.0f, dA.get(), K, dB.get(), tb ? K : N, 0.5f, dC.get(), N);
      ops::Kernels::cpu(p).gemm(false, tb, M, N, K, 1.0f, A.data(), K, B.data(), tb ? K : N, 0.5f,
                                C.data(), N);
      cpu_.gemm(false, tb, M, N, K, 1.0f, A.data(), K, B.data(), tb ? K : N, 0.5f, C32.data(), N);
      sync();
      const std::vector<float> got = dC.download();
      EXPECT_TRUE(close(got, C, 1e-5)) << name_of(p) << " tb " << tb;
      EXPECT_FALSE(close(got, C32, 1e-4)) << name_of(p) << " tb " << tb << ": no rounding seen";
    }
  }
}

namespace {
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

// hold_rounded: matmul's GEMMs on a held weight (all of it, or rows of it at
// an offset, as the classifier's wte blocks) give the bits of rounding the
// weight themselves, forward with and without a bias, backward with and
// without dw, and a gemm on a block of columns of dout; with dout and inp
// held as well (nested) the same, the bias gradient included (summed apart
// from dout's copy when dout is held, with it otherwise); a weight only partly inside the held span, and any weight
// after release_rounded(), is rounded afresh (the held copy is stale).
TEST_F(CudaKernels, AHeldRoundedWeightGivesTheBitsOfRoundingIt) {
  const int N = 48, IC = 64, OC = 40, rows = 3 * OC;  // held: rows x IC, w = rows [OC, 2 OC)
  const std::vector<float> all = uniform_floats(size_t(rows) * IC, 31);
  const std::vector<float> inp = uniform_floats(size_t(N) * IC, 32),
                           bias = uniform_floats(OC, 33), dout = uniform_floats(size_t(N) * OC, 34),
                           dw0 = uniform_floats(size_t(OC) * IC, 35);
  DeviceArray<float> d_all(all.size()), d_inp(inp.size()), d_bias(OC), d_dout(dout.size());
  DeviceArray<float> d_out(size_t(N) * OC), d_dinp(inp.size()), d_dw(dw0.size()), d_dbias(OC);
  d_all.upload(all);
  d_inp.upload(inp);
  d_bias.upload(bias);
  d_dout.upload(dout);
  for (ops::Precision p : {ops::Precision::bf16, ops::Precision::fp16}) {
    SCOPED_TRACE(name_of(p));
    const std::unique_ptr<ops::Kernels> gpu = cuda::make_kernels(stream_, p);
    const float* w = d_all.get() + size_t(OC) * IC;
    // The results of one pass: out with the bias, out without; dinp, dw and
    // dbias from dout; dinp alone; a tile's product. The stream is not the
    // legacy one: wait for it before each copy.
    auto get = [&](const DeviceArray<float>& a) {
      gpu->synchronize();
      return a.download();
    };
    auto pass = [&] {
      std::vector<std::vector<float>> r;
      gpu->matmul_forward(d_out.get(), d_inp.get(), w, d_bias.get(), N, IC, OC);
      r.push_back(get(d_out));
      gpu->matmul_forward(d_out.get(), d_inp.get(), w, nullptr, N, IC, OC);
      r.push_back(get(d_out));
      d_dw.upload(dw0);
      d_dbias.upload(bias);
      // With the bias gradient: fused with dout's copy unless dout is held.
      gpu->matmul_backward(d_dinp.get(), d_dw.get(), d_dbias.get(), d_dout.get(), d_inp.get(), w,
                           N, IC, OC);
      r.push_back(get(d_dinp));
      r.push_back(get(d_dw));
      r.push_back(get(d_dbias));
      gpu->matmul_backward(d_dinp.get(), nullptr, nullptr, d_dout.get(), nullptr, w, N, IC, OC);
      r.push_back(get(d_dinp));
      // A tile's product as quant::qlinear_backward_input forms it: columns
      // [8, OC) of dout (leading dimension OC) times rows [8, OC) of w.
      gpu->gemm(false, false, N, IC, OC - 8, 1.0f, d_dout.get() + 8, OC, w + 8 * IC, IC, 0.0f,
                d_dinp.get(), IC);
      r.push_back(get(d_dinp));
      return r;
    };
    const auto plain = pass();
    std::vector<std::vector<float>> held, partly, nested;
    {
      const ops::HeldRounded h(*gpu, d_all.get(), all.size());
      held = pass();
      // Nested: dout and inp held too (a LoRA layer's backward).
      const ops::HeldRounded hi(*gpu, d_inp.get(), inp.size());
      const ops::HeldRounded hd(*gpu, d_dout.get(), dout.size());
      nested = pass();
    }
    {
      const ops::HeldRounded h(*gpu, d_all.get(), size_t(OC + OC / 2) * IC);  // half of w inside
      partly = pass();
    }
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(same_bits(held[i], plain[i])) << "result " << i << " on the held weight";
      EXPECT_TRUE(same_bits(partly[i], plain[i])) << "result " << i << " on a weight half held";
      EXPECT_TRUE(same_bits(nested[i], plain[i])) << "result " << i << " with three holds";
    }
    // Held, then w changes and is released: the next GEMMs see the new w.
    {
      const ops::HeldRounded h(*gpu, d_all.get(), all.size());
      gpu->matmul_forward(d_out.get(), d_inp.get(), w, nullptr, N, IC, OC);
      gpu->synchronize();
    }
    std::vector<float> changed = all;
    for (float& x : changed) x = -x;
    d_all.upload(changed);
    const auto after = pass();
    d_all.upload(all);
    std::vector<float> want = plain[1];
    for (float& x : want) x = -x;  // rounding is odd: the bits of -out
    EXPECT_TRUE(same_bits(after[1], want)) << "a stale held copy was used after release";
  }
}

// sums_of_squares gives each span what sum_of_squares gives it alone, bit for
// bit, with one wait for all: empty spans, spans shorter than, equal to and
// longer than a block of kSumOfSquaresBlock, and spans that overlap.
TEST_F(CudaKernels, SumsOfSquaresAreTheSingleSums) {
  const size_t n = 3 * ops::kSumOfSquaresBlock + 1234;
  const std::vector<float> x = uniform_floats(n, 31);
  DeviceArray<float> dx(n);
  dx.upload(x);
  const float* d = dx.get();
  const std::vector<ops::Kernels::Span> spans = {
      {d, 0}, {d + 5, 1}, {d, ops::kSumOfSquaresBlock}, {d + 7, 2 * ops::kSumOfSquaresBlock + 3},
      {d, n}, {d + 100, 999}};
  std::vector<double> got(spans.size(), -1.0);
  gpu_->sums_of_squares(spans, got.data());
  for (size_t i = 0; i < spans.size(); ++i) {
    const double alone = gpu_->sum_of_squares(spans[i].first, spans[i].second);
    EXPECT_EQ(std::memcmp(&got[i], &alone, sizeof(double)), 0) << "span " << i;
    const double cpu = cpu_.sum_of_squares(x.data() + (spans[i].first - d), spans[i].second);
    EXPECT_NEAR(got[i], cpu, 1e-12 * cpu) << "span " << i;
  }
}

TEST_F(CudaKernels, ZeroAddAndAddBias) {
  const int N = 129, C = 77;
  const size_t n = size_t(N) * C;
  std::vector<float> y = uniform_floats(n, 4);
  const std::vector<float> x = uniform_floats(n, 5), bias = uniform_floats(C, 6);
  DeviceArray<float> dy(n), dx(n), dbias(C);
  dy.upload(y);
  dx.upload(x);
  dbias.upload(bias);
  gpu_->add(dy.get(), dx.get(), n);
  gpu_->add_bias(dy.get(), dbias.get(), N, C);
  cpu_.add(y.data(), x.data(), n);
  cpu_.add_bias(y.data(), bias.data(), N, C);
  sync();
  EXPECT_EQ(dy.download(), y);  // one addition per element: the same float
  gpu_->zero(dy.get(), n - 1);
  sync();
  const std::vector<float> zeroed = dy.download();
  for (size_t i = 0; i + 1 < n; ++i) ASSERT_EQ(zeroed[i], 0.0f) << i;
  EXPECT_EQ(zeroed[n - 1], y[n - 1]);  // past the count: untouched
}

// LoRA's forward and backward (model/lora.h) through each backend.
TEST_F(CudaKernels, LoraForwardAndBackwardMatchTheCpu) {
  const int N = 45, IC = 64, OC = 96, r = 8;
  const float s = 2.0f;
  const std::vector<float> inp = uniform_floats(size_t(N) * IC, 7), A = uniform_floats(size_t(r) * IC, 8),
                           B = uniform_floats(size_t(OC) * r, 9), dout = uniform_floats(size_t(N) * OC, 10);
  std::vector<float> out = uniform_floats(size_t(N) * OC, 11), dinp = uniform_floats(size_t(N) * IC, 12),
                     dA = uniform_floats(A.size(), 13), dB = uniform_floats(B.size(), 14);
  std::vector<float> u(size_t(N) * r), du(size_t(N) * r);
  DeviceArray<float> d_inp(inp.size()), d_A(A.size()), d_B(B.size()), d_dout(dout.size()),
      d_out(out.size()), d_dinp(dinp.size()), d_dA(dA.size()), d_dB(dB.size()), d_u(u.size()),
      d_du(du.size());
  d_inp.upload(inp);
  d_A.upload(A);
  d_B.upload(B);
  d_dout.upload(dout);
  d_out.upload(out);
  d_dinp.upload(dinp);
  d_dA.upload(dA);
  d_dB.upload(dB);
  lora_forward(*gpu_, d_out.get(), d_inp.get(), d_A.get(), d_B.get(), s, N, IC, OC, r, d_u.get());
  lora_backward(*gpu_, d_dinp.get(), d_dA.get(), d_dB.get(), d_dout.get(), d_inp.get(), d_A.get(),
                d_B.get(), s, N, IC, OC, r, d_u.get(), d_du.get());
  lora_forward(cpu_, out.data(), inp.data(), A.data(), B.data(), s, N, IC, OC, r, u.data());
  lora_backward(cpu_, dinp.data(), dA.data(), dB.data(), dout.data(), inp.data(), A.data(),
                B.data(), s, N, IC, OC, r, u.data(), du.data());
  sync();
  EXPECT_TRUE(close(d_out.download(), out, kTol)) << "out";
  EXPECT_TRUE(close(d_dinp.download(), dinp, kTol)) << "dinp";
  EXPECT_TRUE(close(d_dA.download(), dA, kTol)) << "dA";
  EXPECT_TRUE(close(d_dB.download(), dB, kTol)) << "dB";
}
