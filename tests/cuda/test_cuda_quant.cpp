// cuda::dequantize_rows against the CPU reference quant::dequantize_rows.
//
// Random data is quantized on the host with quantize_ref (f32, int8, nf4),
// the tensor's bytes are uploaded as they are, and the rows the GPU
// dequantizes are compared bit for bit with those of the CPU. Shapes cover
// a last block shorter than 64 elements, an odd number of elements (nf4:
// the last byte half used), row lengths that are not multiples of 64 (so
// blocks straddle rows and nf4 rows start on odd nibbles), more than one
// group of 256 blocks of the nf4 double quantization, all-zero blocks, the
// tensor-parallel splits of quant/qlinear.h (tp_dim 0 with 3 parts over
// tp 2, tp_dim 1 over tp 2, tp_dim 1 with 3 parts), runs of rows that start
// inside a part, and more rows than one grid holds. Every test skips, with
// the reason, where no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"
#include "cuda_test.h"
#include "quant/dequantizer.h"
#include "quant/formats.h"
#include "quant/qlinear.h"
#include "quant/quantize.h"

namespace {

using meshlm::quant::QLayout;
using meshlm::quant::QSlice;
using meshlm::quant::QTensor;
using meshlm::quant::QuantType;

// Tolerance in units in the last place: none. Both sides build every element
// from the same helpers of quant/formats.h, each step a correctly rounded
// IEEE operation (int8: one division absmax / 127, one product; nf4: one
// division absmax2 / 127, one fmaf for the block's absmax, one product by
// the level; f32: a copy), and meshlm_cuda is compiled without
// --use_fast_math, so the GPU must give exactly the CPU's bits. Any
// difference is a bug (a wrong block, nibble or split), not rounding.
constexpr int64_t kTolUlps = 0;

constexpr QuantType kAllTypes[] = {QuantType::f32, QuantType::int8, QuantType::nf4};

// Normal values whose scale changes from block to block (so the absmax, and
// for nf4 the double-quantized absmax codes, differ), with every 7th block of
// 64 all zero (absmax 0: int8 codes 0, nf4 code kNF4ZeroCode).
std::vector<float> test_values(size_t n, uint64_t seed) {
  meshlm::Rng rng(seed);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / 64;
    const double scale = b % 7 == 3 ? 0.0 : std::exp2(double(b % 11) - 5.0);
    x[i] = static_cast<float>(scale * rng.normal());
  }
  return x;
}

// A quantized tensor on the host and the same bytes on the device.
class QuantizedPair {
public:
  QuantizedPair(QuantType type, const std::vector<float>& x)
      : layout_(meshlm::quant::qlayout(type, x.size())), host_(layout_.total_bytes, 0xCD) {
    host_t_ = meshlm::quant::qtensor_at(layout_, host_.data());
    meshlm::quant::quantize_ref(x.data(), host_t_);
    CUDA_CHECK(cudaMalloc(&dev_, layout_.total_bytes));
    CUDA_CHECK(cudaMemcpy(dev_, host_.data(), layout_.total_bytes, cudaMemcpyHostToDevice));
    // The same layout from the device base: the device pointers of each array.
    dev_t_ = meshlm::quant::qtensor_at(layout_, static_cast<uint8_t*>(dev_));
  }
  ~QuantizedPair() { cudaFree(dev_); }
  QuantizedPair(const QuantizedPair&) = delete;
  QuantizedPair& operator=(const QuantizedPair&) = delete;

  const QTensor& host() const { return host_t_; }
  const QTensor& device() const { return dev_t_; }

private:
  QLayout layout_;
  std::vector<uint8_t> host_;
  QTensor host_t_;
  void* dev_ = nullptr;
  QTensor dev_t_;
};

// Device array of n floats, freed on scope exit.
class DeviceFloats {
public:
  explicit DeviceFloats(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(&p_, (n > 0 ? n : 1) * sizeof(float)));
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* get() { return p_; }
  // Fills with a NaN pattern, so an element the kernel does not write shows;
  // waits for the fill, which a kernel on a non-blocking stream would not.
  void poison() {
    CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(float)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> download() {
    std::vector<float> h(n_);
    CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }

private:
  float* p_ = nullptr;
  size_t n_;
};

// Floats on one line by their bits: consecutive floats of one sign are
// consecutive integers, and -0 and +0 are one apart, so the distance is 0
// only for identical bits.
int64_t ordered_bits(float x) {
  const int64_t b = std::bit_cast<uint32_t>(x);
  return b & 0x80000000 ? -(b & 0x7FFFFFFF) - 1 : b;
}

// Checks every element is within kTolUlps of the reference (NaN never is);
// on failure names the number of bad elements and the first, by row and
// column of the output.
testing::AssertionResult same_within_ulps(const std::vector<float>& got,
                                          const std::vector<float>& want, int64_t cols) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool ok = !std::isnan(got[i]) && !std::isnan(want[i]) &&
                    std::abs(ordered_bits(got[i]) - ordered_bits(want[i])) <= kTolUlps;
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << bad << " of " << want.size() << " elements differ by more than " << kTolUlps
         << " ulp; first at row " << first / cols << " column " << first % cols << ": got "
         << got[first] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(got[first])
         << "), want " << want[first] << " (bits 0x" << std::bit_cast<uint32_t>(want[first])
         << ")" << std::dec;
}

// A matrix (R, K) and how TP splits it (the arguments of make_qslice).
struct Case {
  int64_t R, K;
  int tp_dim, tp_parts, tp_size;
};

class CudaQuant : public CudaTest {
protected:
  // Local rows [i0, i0 + n) of w on the GPU and on the CPU, compared.
  static void check_rows(const QSlice& w_host, const QSlice& w_dev, int64_t i0, int64_t n,
                         cudaStream_t stream = nullptr) {
    SCOPED_TRACE("rows [" + std::to_string(i0) + ", " + std::to_string(i0 + n) + ")");
    const size_t count = static_cast<size_t>(n * w_host.local_cols());
    std::vector<float> want(count);
    meshlm::quant::dequantize_rows(w_host, i0, n, want.data());
    DeviceFloats out(count);
    out.poison();
    meshlm::cuda::dequantize_rows(w_dev, i0, n, out.get(), stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(same_within_ulps(out.download(), want, w_host.local_cols()));
  }

  // Every type, every TP rank of the case: all local rows, then a run that
  // starts and ends inside the local matrix.
  static void check_case(const Case& c, uint64_t seed) {
    const std::vector<float> x = test_values(static_cast<size_t>(c.R * c.K), seed);
    for (QuantType type : kAllTypes) {
      QuantizedPair q(type, x);
      for (int rank = 0; rank < c.tp_size; ++rank) {
        SCOPED_TRACE(std::string(meshlm::name_of(type)) + " (" +
                     std::to_string(c.R) + ", " + std::to_string(c.K) + ") tp_dim " +
                     std::to_string(c.tp_dim) + " parts " + std::to_string(c.tp_parts) +
                     " rank " + std::to_string(rank) + "/" + std::to_string(c.tp_size));
        const QSlice wh =
            meshlm::quant::make_qslice(q.host(), c.R, c.K, c.tp_dim, c.tp_parts, rank, c.tp_size);
        const QSlice wd = meshlm::quant::make_qslice(q.device(), c.R, c.K, c.tp_dim, c.tp_parts,
                                                     rank, c.tp_size);
        const int64_t rows = wh.local_rows();
        check_rows(wh, wd, 0, rows);
        check_rows(wh, wd, rows / 3 + 1, rows / 2);
      }
    }
  }
};

// (37, 101): 3737 elements, a last block of 25 and an odd count; rows of an
// odd length, so blocks straddle rows and half the rows start on a low nibble.
TEST_F(CudaQuant, WholeMatrixWithShortLastBlock) { check_case({37, 101, -1, 1, 1}, 1); }

// c_attn-like: rows made of 3 parts (q, k, v), each split over tp 2, so a
// local row range jumps between parts. (138, 130): 17940 elements, 281
// blocks (two groups of the nf4 double quantization), a last block of 20.
TEST_F(CudaQuant, RowsSplitInThreePartsOverTwoRanks) { check_case({138, 130, 0, 3, 2}, 2); }

// c_proj-like: columns split over tp 2, local rows of 99 (odd) columns that
// begin mid-block in the tensor. (70, 198): 13860 elements, a last block of 36.
TEST_F(CudaQuant, ColumnsSplitOverTwoRanks) { check_case({70, 198, 1, 1, 2}, 3); }

// Columns made of 3 parts over tp 2: each local row is 3 runs of 17.
TEST_F(CudaQuant, ColumnsSplitInThreePartsOverTwoRanks) { check_case({45, 102, 1, 3, 2}, 4); }

// More local rows than the 65535 of one grid's y dimension: the grid-stride
// loop over rows goes round more than once.
TEST_F(CudaQuant, MoreRowsThanOneGrid) { check_case({70001, 3, -1, 1, 1}, 5); }

TEST_F(CudaQuant, RunsOnGivenStream) {
  const Case c{96, 130, 0, 3, 2};
  const std::vector<float> x = test_values(static_cast<size_t>(c.R * c.K), 6);
  QuantizedPair q(QuantType::nf4, x);
  const QSlice wh = meshlm::quant::make_qslice(q.host(), c.R, c.K, c.tp_dim, c.tp_parts, 1, 2);
  const QSlice wd = meshlm::quant::make_qslice(q.device(), c.R, c.K, c.tp_dim, c.tp_parts, 1, 2);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  check_rows(wh, wd, 5, 40, stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// The quantized embedding lookup (cuda::dequantize_lookup) against the CPU's
// (quant::Dequantizer::cpu().lookup): a vocabulary of 96 rows split over tp
// 2 (rank 1 holds rows [48, 96)), ids inside, before and after its part and
// repeated, and more ids than one grid's rows.
TEST_F(CudaQuant, LookupMatchesTheCpuBitForBit) {
  const int64_t R = 96, K = 130;
  const std::vector<float> x = test_values(static_cast<size_t>(R * K), 9);
  meshlm::Rng rng(10);
  std::vector<int32_t> ids(70000);
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(R));
  ids[0] = 48; ids[1] = 47; ids[2] = 95; ids[3] = 0; ids[4] = 48;
  int32_t* d_ids = nullptr;
  CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * sizeof(int32_t)));
  CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(meshlm::name_of(type));
    QuantizedPair q(type, x);
    const QSlice wh = meshlm::quant::make_qslice(q.host(), R, K, 0, 1, 1, 2);
    const QSlice wd = meshlm::quant::make_qslice(q.device(), R, K, 0, 1, 1, 2);
    const int N = static_cast<int>(ids.size());
    std::vector<float> want(static_cast<size_t>(N) * K);
    meshlm::quant::Dequantizer::cpu().lookup(want.data(), ids.data(), N, wh, 48);
    DeviceFloats out(want.size());
    out.poison();
    meshlm::cuda::dequantize_lookup(out.get(), d_ids, N, wd, 48, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_within_ulps(out.download(), want, K));
  }
  cudaFree(d_ids);
}

TEST_F(CudaQuant, NoRowsLaunchesNothing) {
  const std::vector<float> x = test_values(64 * 10, 7);
  QuantizedPair q(QuantType::int8, x);
  const QSlice wd = meshlm::quant::make_qslice(q.device(), 64, 10, -1, 1, 0, 1);
  meshlm::cuda::dequantize_rows(wd, 64, 0, nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_F(CudaQuant, BadArgumentsThrowRankError) {
  const std::vector<float> x = test_values(64 * 10, 8);
  QuantizedPair q(QuantType::nf4, x);
  DeviceFloats out(64 * 10);
  QSlice wd = meshlm::quant::make_qslice(q.device(), 64, 10, 0, 1, 1, 2);  // 32 local rows
  EXPECT_THROW(meshlm::cuda::dequantize_rows(wd, 30, 3, out.get(), nullptr), meshlm::RankError);
  EXPECT_THROW(meshlm::cuda::dequantize_rows(wd, -1, 3, out.get(), nullptr), meshlm::RankError);
  EXPECT_THROW(meshlm::cuda::dequantize_rows(wd, 0, 3, nullptr, nullptr), meshlm::RankError);
  QSlice uneven = wd;
  uneven.tp_parts = 3;  // 64 rows do not split into 3 parts over 2 ranks
  EXPECT_THROW(meshlm::cuda::dequantize_rows(uneven, 0, 3, out.get(), nullptr),
               meshlm::RankError);
  QSlice no_absmax = wd;
  no_absmax.t.absmax2 = nullptr;
  EXPECT_THROW(meshlm::cuda::dequantize_rows(no_absmax, 0, 3, out.get(), nullptr),
               meshlm::RankError);
}

}  // namespace
