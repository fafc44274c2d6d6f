// A linear layer whose weight is frozen and quantized (the base of a LoRA
// fine-tune), as one tensor-parallel rank holds it: Y = X W^T + b with W
// dequantized a tile of rows at a time, so no fp32 copy of W ever exists.
//
// QSlice is the quantized LOGICAL matrix W (R, K), row-major, as stored,
// plus which part of it this rank uses; the part is exactly the one
// shard_from_full (model/gpt.h) cuts for a ParamSpec with the same tp_dim,
// tp_parts, tp_rank and tp_size:
//   tp_dim 0 (column-parallel layer, rows split): R is made of tp_parts equal
//     parts (q, k, v of c_attn: 3), each split over tp; with
//     piece = R / (tp_parts * tp_size), local row i is logical row
//       (i / piece) * (R / tp_parts) + tp_rank * piece + i % piece.
//   tp_dim 1 (row-parallel layer, columns split): the same rule on columns;
//     with one part, local columns are [tp_rank K / tp, (tp_rank + 1) K / tp).
//   tp_dim -1 (or tp_size 1): the whole matrix.
//
// Example: c_attn of GPT-2 small, W (2304, 768), tp_parts 3, tp_size 2: rank 1
// holds rows [384, 768) of q, [1152, 1536) of k and [1920, 2304) of v, as its
// (1152, 768) local matrix.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/quantize.h"

namespace meshlm::ops {
class Kernels;  // ops/kernels.h
}

namespace meshlm::quant {

class Dequantizer;  // quant/dequantizer.h

struct QSlice {
  QTensor t;               // the logical matrix (R, K), row-major: t.n == R * K
  int64_t R = 0, K = 0;
  int tp_dim = -1;         // -1: not split; 0: rows; 1: columns
  int tp_parts = 1;        // the split dimension is made of this many equal parts
  int tp_rank = 0, tp_size = 1;

  int64_t local_rows() const { return tp_dim == 0 ? R / tp_size : R; }
  int64_t local_cols() const { return tp_dim == 1 ? K / tp_size : K; }
  // Index along the split dimension of local index i (identity when not split).
  int64_t logical_index(int64_t i) const;
};

// Checks that the split is even (every part divides over tp_size) and that
// t holds R * K elements; throws RankError otherwise.
QSlice make_qslice(const QTensor& t, int64_t R, int64_t K, int tp_dim, int tp_parts, int tp_rank,
                   int tp_size);

// out(n, local_cols) = local rows [i0, i0 + n) of W, dequantized, row-major.
// OpenMP over rows.
void dequantize_rows(const QSlice& w, int64_t i0, int64_t n, float* out);

// Rows of W dequantized per GEMM on the CPU: a tile is kQLinearTileRows *
// local_cols floats (64 * 768 * 4 B = 192 KiB for GPT-2 small), small enough
// for L2. A GPU takes larger tiles (ops/gpu_workspace.h): each tile is one
// GEMM launch, and a GEMM of 64 columns leaves most of a GPU idle.
constexpr int kQLinearTileRows = 64;
// Floats of the scratch `ws` that qlinear_forward / qlinear_backward_input
// need with tiles of `tile_rows` rows.
size_t qlinear_workspace_floats(const QSlice& w, int tile_rows = kQLinearTileRows);

// A LoRA adapter merged into the tiles of a quantized layer: each tile of
// rows [r0, r0 + tr) becomes W_local[r0:r0+tr] + s B[r0:r0+tr] A, so the
// layer's one GEMM per tile gives x (W + s B A)^T, the base's output and the
// adapter's together, and its backward dout (W + s B A), the input gradient
// through both. A (r, ICl) and B (OCl, r) are this rank's factors as
// model/lora.h lays them out: a column-parallel layer holds B's rows of its
// outputs and all of A, a row-parallel one A's columns of its inputs and all
// of B; either way W_local + s B A is this rank's part of W + s B A.
struct QAdapter {
  const float* A = nullptr;  // (r, ICl)
  const float* B = nullptr;  // (OCl, r)
  float scale = 0.0f;        // s
  int rank = 0;              // r
};

// The two layers run on one backend: `dq` dequantizes each tile into ws and
// `k` multiplies (k.gemm, which rounds both inputs, the dequantized tile
// included, to k.precision()). Every pointer, w's arrays included, is in
// that backend's memory. With `lora`, its adapter is merged into each tile
// (k.gemm, accumulating onto the dequantized fp32 tile) before the tile is
// used.
//
// out(N, OCl) = inp(N, ICl) W_local(OCl, ICl)^T + bias(OCl), with
// OCl = local_rows(), ICl = local_cols(); bias may be null. out is overwritten.
// When one tile holds every local row, this is k.matmul_forward on the tile
// (the bias in the GEMM's epilogue where the backend has one).
void qlinear_forward(const ops::Kernels& k, const Dequantizer& dq, float* out, const float* inp,
                     const QSlice& w, const float* bias, int N, float* ws,
                     int tile_rows = kQLinearTileRows, const QAdapter* lora = nullptr);
// dinp(N, ICl) = dout(N, OCl) W_local(OCl, ICl), overwritten as
// ops::matmul_backward's. No weight gradient: the base weight is frozen (a
// LoRA adapter beside it takes its own).
void qlinear_backward_input(const ops::Kernels& k, const Dequantizer& dq, float* dinp,
                            const float* dout, const QSlice& w, int N, float* ws,
                            int tile_rows = kQLinearTileRows, const QAdapter* lora = nullptr);

}  // namespace meshlm::quant
