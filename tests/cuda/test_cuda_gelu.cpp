// cuda::gelu_forward / gelu_backward against the CPU reference ops::gelu_*<float>.
//
// Sizes cover the float4 body and the one-at-a-time tail of the kernels (n
// not a multiple of 4, n smaller than 4), a grid larger than one block, and
// pointers that are not 16-byte aligned. Every test skips, with the reason,
// where no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"
#include "cuda_test.h"
#include "ops/ops.h"

namespace {

// Both sides compute 0.5 x (1 + tanh u) in float with a tanh good to a few
// ulp, but not the same tanh nor the same FMA contractions. For x << 0 the sum
// 1 + tanh u cancels, so an error of a few ulp of 1 in tanh becomes an error
// proportional to |x|, not to the result: the bound is relative to the size
// of the terms, |out| + |x| forward. Backward, the term x sech^2(u) du/dx
// carries the tanh error times about |x|^3 / 10, so the scale there is
// |dinp before| + |dout| (1 + x^2). The worst case expected is about 3e-7 of
// these scales.
constexpr double kTol = 1e-6;

// Inputs uniform in [-kRange, kRange]: both tails of GELU, including the
// region where tanh saturates to +-1 in float (|u| > 9).
constexpr double kRange = 10.0;

// Checks |got[i] - want[i]| <= kTol * scale(i) for all i; on failure names the
// number of bad elements and the worst one (not one line per element).
template <typename Scale>
testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want,
                                   const std::vector<float>& x, Scale scale) {
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    double err = std::fabs(double(got[i]) - double(want[i]));
    double bound = kTol * scale(i);
    if (!(err <= bound)) {  // also catches NaN
      ++bad;
      double ratio = err / bound;
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << bad << " of " << want.size() << " elements beyond tolerance; worst at i=" << worst
         << " x=" << x[worst] << ": got " << got[worst] << ", want " << want[worst] << " (error "
         << worst_ratio << " times the tolerance " << kTol * scale(worst) << ")";
}

// Forward scale: |out| + |x| (see kTol).
testing::AssertionResult forward_close(const std::vector<float>& got,
                                       const std::vector<float>& want,
                                       const std::vector<float>& x) {
  return all_close(got, want, x,
                   [&](size_t i) { return std::fabs(double(want[i])) + std::fabs(double(x[i])); });
}

class CudaGelu : public CudaTest {
protected:
  // Forward and backward of n elements, every device array shifted by
  // `offset` floats, compared with the CPU op.
  void check(size_t n, size_t offset, uint64_t seed) {
    SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(offset));
    std::vector<float> x = uniform_floats(n, seed, -kRange, kRange);
    std::vector<float> dout = uniform_floats(n, seed + 1, -1.0, 1.0);
    // The backward overwrites dinp: NaN before, so an element it adds to or
    // never writes fails.
    const std::vector<float> dinp0(n, std::numeric_limits<float>::quiet_NaN());

    std::vector<float> out_ref(n);
    meshlm::ops::gelu_forward<float>(out_ref.data(), x.data(), n);
    std::vector<float> dinp_ref = dinp0;
    meshlm::ops::gelu_backward<float>(dinp_ref.data(), x.data(), dout.data(), n);

    DeviceArray<float> d_x(n, offset), d_out(n, offset), d_dout(n, offset), d_dinp(n, offset);
    d_x.upload(x);
    d_dout.upload(dout);
    d_dinp.upload(dinp0);
    meshlm::cuda::gelu_forward(d_out.get(), d_x.get(), n, nullptr);
    meshlm::cuda::gelu_backward(d_dinp.get(), d_x.get(), d_dout.get(), n, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> out = d_out.download(n);
    std::vector<float> dinp = d_dinp.download(n);

    EXPECT_TRUE(forward_close(out, out_ref, x)) << "forward";
    EXPECT_TRUE(all_close(dinp, dinp_ref, x, [&](size_t i) {
      double xi = x[i];
      return std::fabs(double(dout[i])) * (1.0 + xi * xi);
    })) << "backward";
  }
};

TEST_F(CudaGelu, MatchesCpuForSizesAroundTheVectorWidth) {
  for (size_t n : {1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257, 1000, 1000003})
    check(n, 0, 1234 + n);
}

// 2^25 + 1 float4s, more than the 2^16 blocks x 256 threads of the largest
// grid (cuda/gelu.cu): the grid-stride loop goes round more than once.
TEST_F(CudaGelu, MatchesCpuOnLargeArray) { check((size_t(1) << 27) + 5, 0, 99); }

// Pointers one float past a 256-byte boundary: the scalar path for everything.
TEST_F(CudaGelu, MatchesCpuOnMisalignedPointers) {
  for (size_t n : {1, 7, 1000, 100003}) check(n, 1, 4321 + n);
}

TEST_F(CudaGelu, ForwardInPlace) {
  const size_t n = 1003;
  std::vector<float> x = uniform_floats(n, 7, -kRange, kRange);
  std::vector<float> out_ref(n);
  meshlm::ops::gelu_forward<float>(out_ref.data(), x.data(), n);

  DeviceArray<float> d(n);
  d.upload(x);
  meshlm::cuda::gelu_forward(d.get(), d.get(), n, nullptr);
  std::vector<float> out = d.download(n);  // cudaMemcpy waits for the legacy default stream

  EXPECT_TRUE(forward_close(out, out_ref, x));
}

TEST_F(CudaGelu, EmptyLaunchesNothing) {
  meshlm::cuda::gelu_forward(nullptr, nullptr, 0, nullptr);
  meshlm::cuda::gelu_backward(nullptr, nullptr, nullptr, 0, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_F(CudaGelu, NullPointerThrowsRankError) {
  EXPECT_THROW(meshlm::cuda::gelu_forward(nullptr, nullptr, 16, nullptr), meshlm::RankError);
}

// A non-default stream: the launch goes where it is told.
TEST_F(CudaGelu, RunsOnGivenStream) {
  const size_t n = 4099;
  std::vector<float> x = uniform_floats(n, 11, -kRange, kRange);
  std::vector<float> out_ref(n);
  meshlm::ops::gelu_forward<float>(out_ref.data(), x.data(), n);

  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceArray<float> d_x(n), d_out(n);
  d_x.upload(x);
  meshlm::cuda::gelu_forward(d_out.get(), d_x.get(), n, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::vector<float> out = d_out.download(n);

  EXPECT_TRUE(forward_close(out, out_ref, x));
}

}  // namespace
