// Dequantizing rows of a frozen, quantized weight on the GPU: the CUDA
// version of quant::dequantize_rows (src/quant/qlinear.cpp), which is its
// reference. With it a quantized linear layer dequantizes its weight a tile
// of rows at a time into a small fp32 buffer for the GEMM, so no fp32 copy of
// the whole weight ever exists on the device.
//
// The arithmetic of every element is the MESHLM_HD helpers of
// quant/formats.h and nothing else, in the same order as the CPU reference:
//   int8: q8_dequantize(q, q8_scale(absmax_b))
//   nf4:  nf4_dequantize(code, nf4_absmax_dequantize(absmax_q_b, absmax2_g, offset))
//   f32:  a copy.
// Each is a correctly rounded division, product or fused multiply-add, and
// meshlm_cuda is built without --use_fast_math (which would turn absmax / 127
// into an approximate reciprocal), so the GPU gives the CPU's bits exactly.
//
// One thread per output element; a thread keeps its column and walks rows in
// a grid-stride loop. Why not one thread per pair of nf4 codes (one byte):
// element e of the tensor is row * K + col, and its parity, hence which
// nibble it is, depends on K and on where this rank's columns start, so a
// pair would often straddle two bytes. Two threads reading the two nibbles
// of one byte are neighbours in a warp and share its load, so the byte is
// still fetched once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"
#include "quant/formats.h"
#include "quant/qlinear.h"

namespace meshlm::cuda {

namespace {

using quant::QTensor;
using quant::QuantType;

constexpr int kColumnThreads = 256;  // threads along the columns of a row
// Rows beyond this many are covered by the grid-stride loop: gridDim.y may
// not exceed 65535.
constexpr int64_t kMaxGridRows = 65535;

// Where local index i along one dimension of the matrix lies in the logical
// one: the rule of QSlice::logical_index (quant/qlinear.h),
//   (i / piece) * per_part + first + i % piece,
// with per_part = D / tp_parts, piece = per_part / tp_size and
// first = tp_rank * piece. A dimension that is not split takes the same rule
// with piece = per_part = D and first = 0, which is the identity.
struct SplitMap {
  int64_t per_part = 1, piece = 1, first = 0;
};

// ---------------------------------------------------------------------------
// kernels
// ---------------------------------------------------------------------------

__device__ __forceinline__ int64_t logical_index(const SplitMap& m, int64_t i) {
  return (i / m.piece) * m.per_part + m.first + i % m.piece;
}

// Element e of the logical tensor t, dequantized.
template <QuantType T>
__device__ __forceinline__ float dequantize_element(const QTensor& t, uint64_t e) {
  if constexpr (T == QuantType::f32) {
    return static_cast<const float*>(t.data)[e];
  } else if constexpr (T == QuantType::int8) {
    const float scale = quant::q8_scale(t.absmax[e / quant::kQ8Block]);
    return quant::q8_dequantize(static_cast<const int8_t*>(t.data)[e], scale);
  } else {
    const uint64_t b = e / quant::kNF4Block;
    const float absmax = quant::nf4_absmax_dequantize(
        t.absmax_q[b], t.absmax2[b / quant::kNF4AbsmaxBlock], *t.offset);
    return quant::nf4_dequantize(quant::nf4_code_at(static_cast<const uint8_t*>(t.data), e),
                                 absmax);
  }
}

// out(n, Kl) = local rows [i0, i0 + n) of the logical matrix t (R, K),
// row-major. Thread x of the grid is local column c; blocks along y walk the
// rows.
template <QuantType T>
__global__ void dequantize_rows_kernel(float* out, QTensor t, int64_t K, SplitMap rows,
                                       SplitMap cols, int64_t i0, int64_t n, int64_t Kl) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= Kl) return;
  const int64_t col = logical_index(cols, c);
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t row = logical_index(rows, i0 + i);
    out[i * Kl + c] = dequantize_element<T>(t, static_cast<uint64_t>(row * K + col));
  }
}

// out(N, Kl): row r is local row ids[r] - first of t, or zeros when this
// rank holds no such row. Threads as in dequantize_rows_kernel.
template <QuantType T>
__global__ void dequantize_lookup_kernel(float* out, const int32_t* ids, QTensor t, int64_t K,
                                         SplitMap rows, SplitMap cols, int64_t first,
                                         int64_t local_rows, int N, int64_t Kl) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= Kl) return;
  const int64_t col = logical_index(cols, c);
  for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
    const int64_t i = int64_t(ids[r]) - first;
    out[r * Kl + c] =
        (i >= 0 && i < local_rows)
            ? dequantize_element<T>(t, static_cast<uint64_t>(logical_index(rows, i) * K + col))
            : 0.0f;
  }
}

// ---------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------

// The map of dimension `dim` (0 rows, 1 columns) of w, of extent D.
SplitMap split_map(const quant::QSlice& w, int dim, int64_t D) {
  if (w.tp_dim != dim || w.tp_size == 1) return {D, D, 0};
  const int64_t per_part = D / w.tp_parts, piece = per_part / w.tp_size;
  return {per_part, piece, w.tp_rank * piece};
}

dim3 grid_of(int64_t Kl, int64_t n) {
  return dim3(static_cast<unsigned>((Kl + kColumnThreads - 1) / kColumnThreads),
              static_cast<unsigned>(std::min(n, kMaxGridRows)));
}

std::string describe(const quant::QSlice& w) {
  return "a (" + std::to_string(w.R) + ", " + std::to_string(w.K) + ") " +
         std::string(meshlm::name_of(w.t.type)) + " matrix";
}

// The checks both launchers make, then f(QuantType constant) with the
// arrays of w's type checked non-null.
// `what()` names the call in a failed check's message (built only then).
template <class W, class F>
void checked_dispatch(const quant::QSlice& w, const float* out, W&& what, F&& f) {
  MESHLM_CHECK(w.R > 0 && w.K > 0 && w.t.n == static_cast<size_t>(w.R * w.K),
               what() + ": the tensor does not hold R * K elements");
  MESHLM_CHECK(w.tp_size >= 1 && w.tp_rank >= 0 && w.tp_rank < w.tp_size && w.tp_parts >= 1,
               what() + ": bad tensor-parallel rank");
  if (w.tp_dim >= 0) {
    const int64_t D = w.tp_dim == 0 ? w.R : w.K;
    MESHLM_CHECK(D % (int64_t(w.tp_parts) * w.tp_size) == 0,
                 what() + ": dimension " + std::to_string(w.tp_dim) + " does not split into " +
                     std::to_string(w.tp_parts) + " parts over " + std::to_string(w.tp_size) +
                     " ranks");
  }
  MESHLM_CHECK((w.local_cols() + kColumnThreads - 1) / kColumnThreads <= INT32_MAX,
               what() + ": too many columns");
  MESHLM_CHECK(out != nullptr && w.t.data != nullptr, what() + ": null pointer");
  switch (w.t.type) {
    case QuantType::f32:
      f(std::integral_constant<QuantType, QuantType::f32>{});
      break;
    case QuantType::int8:
      MESHLM_CHECK(w.t.absmax != nullptr, what() + ": null absmax");
      f(std::integral_constant<QuantType, QuantType::int8>{});
      break;
    case QuantType::nf4:
      MESHLM_CHECK(w.t.absmax_q != nullptr && w.t.absmax2 != nullptr && w.t.offset != nullptr,
                   what() + ": null absmax, absmax2 or offset");
      f(std::integral_constant<QuantType, QuantType::nf4>{});
      break;
    default:
      MESHLM_CHECK(false, what() + ": unknown quantization type");
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void dequantize_rows(const quant::QSlice& w, int64_t i0, int64_t n, float* out,
                     cudaStream_t stream) {
  // The message is built only when a check fails: this runs once per tile.
  auto what = [&] {
    return "cuda::dequantize_rows of rows [" + std::to_string(i0) + ", " + std::to_string(i0 + n) +
           ") of " + describe(w);
  };
  MESHLM_CHECK(i0 >= 0 && n >= 0 && i0 + n <= w.local_rows(),
               what() + ": rows out of the local matrix");
  if (n == 0) return;
  const int64_t Kl = w.local_cols();
  checked_dispatch(w, out, what, [&](auto type) {
    dequantize_rows_kernel<decltype(type)::value><<<grid_of(Kl, n), kColumnThreads, 0, stream>>>(
        out, w.t, w.K, split_map(w, 0, w.R), split_map(w, 1, w.K), i0, n, Kl);
  });
}

void dequantize_lookup(float* out, const int32_t* ids, int N, const quant::QSlice& w,
                       int64_t first, cudaStream_t stream) {
  auto what = [&] {
    return "cuda::dequantize_lookup of " + std::to_string(N) + " rows of " + describe(w);
  };
  MESHLM_CHECK(N >= 0, what() + ": negative row count");
  if (N == 0) return;
  MESHLM_CHECK(ids != nullptr, what() + ": null ids");
  const int64_t Kl = w.local_cols();
  checked_dispatch(w, out, what, [&](auto type) {
    dequantize_lookup_kernel<decltype(type)::value><<<grid_of(Kl, N), kColumnThreads, 0, stream>>>(
        out, ids, w.t, w.K, split_map(w, 0, w.R), split_map(w, 1, w.K), first, w.local_rows(), N,
        Kl);
  });
}

}  // namespace meshlm::cuda
