// Linear layers on a quantized, tensor-parallel weight: dequantize a tile of
// rows, one GEMM per tile.
#include "quant/qlinear.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "ops/kernels.h"
#include "quant/dequantizer.h"

namespace meshlm::quant {

int64_t QSlice::logical_index(int64_t i) const {
  if (tp_dim < 0 || tp_size == 1) return i;
  const int64_t D = tp_dim == 0 ? R : K;
  const int64_t per_part = D / tp_parts, piece = per_part / tp_size;
  return (i / piece) * per_part + tp_rank * piece + i % piece;
}

QSlice make_qslice(const QTensor& t, int64_t R, int64_t K, int tp_dim, int tp_parts, int tp_rank,
                   int tp_size) {
  MESHLM_CHECK(R > 0 && K > 0, "a quantized matrix has rows and columns");
  MESHLM_CHECK(t.n == static_cast<size_t>(R * K),
               "quantized tensor of " + std::to_string(t.n) + " elements is not " +
                   std::to_string(R) + " x " + std::to_string(K));
  MESHLM_CHECK(tp_dim >= -1 && tp_dim <= 1, "tp_dim must be -1, 0 or 1");
  MESHLM_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "bad tensor-parallel rank");
  MESHLM_CHECK(tp_parts >= 1, "tp_parts must be >= 1");
  if (tp_dim >= 0) {
    const int64_t D = tp_dim == 0 ? R : K;
    MESHLM_CHECK(D % (static_cast<int64_t>(tp_parts) * tp_size) == 0,
                 "dimension " + std::to_string(tp_dim) + " (" + std::to_string(D) +
                     ") does not split into " + std::to_string(tp_parts) + " parts over " +
                     std::to_string(tp_size) + " ranks");
  }
  QSlice s;
  s.t = t;
  s.R = R;
  s.K = K;
  s.tp_dim = tp_dim;
  s.tp_parts = tp_parts;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  return s;
}

void dequantize_rows(const QSlice& w, int64_t i0, int64_t n, float* out) {
  MESHLM_CHECK(i0 >= 0 && n >= 0 && i0 + n <= w.local_rows(), "rows out of the local matrix");
  const int64_t Kl = w.local_cols();
  const bool split_cols = w.tp_dim == 1 && w.tp_size > 1;
  // Columns: the local row is one run of Kl elements, or (split columns) one
  // run of `piece` per part.
  const int64_t parts = split_cols ? w.tp_parts : 1, piece = Kl / parts;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = w.tp_dim == 0 ? w.logical_index(i0 + i) : i0 + i;
    float* o = out + i * Kl;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t col = split_cols ? w.logical_index(p * piece) : 0;
      dequantize_ref(w.t, static_cast<size_t>(row * w.K + col), static_cast<size_t>(piece),
                     o + p * piece);
    }
  }
}

size_t qlinear_workspace_floats(const QSlice& w, int tile_rows) {
  return static_cast<size_t>(tile_rows) * static_cast<size_t>(w.local_cols());
}

namespace {

// ws(tr, IC) = rows [r0, r0 + tr) of W, plus those of s B A with `lora`.
void make_tile(const ops::Kernels& k, const Dequantizer& dq, const QSlice& w, int r0, int tr,
               float* ws, const QAdapter* lora) {
  dq.rows(w, r0, tr, ws);
  if (lora == nullptr) return;
  const int IC = static_cast<int>(w.local_cols()), r = lora->rank;
  // ws(tr, IC) += s B[r0:r0+tr](tr, r) A(r, IC)
  k.gemm(false, false, tr, IC, r, lora->scale, lora->B + static_cast<size_t>(r0) * r, r, lora->A,
         IC, 1.0f, ws, IC);
}

void check_adapter(const QAdapter* lora, const char* where) {
  if (lora == nullptr) return;
  MESHLM_CHECK(lora->A && lora->B && lora->rank > 0,
               std::string(where) + ": an adapter without factors or rank");
}

}  // namespace

void qlinear_forward(const ops::Kernels& k, const Dequantizer& dq, float* out, const float* inp,
                     const QSlice& w, const float* bias, int N, float* ws, int tile_rows,
                     const QAdapter* lora) {
  MESHLM_CHECK(tile_rows > 0, "qlinear_forward: tiles of no rows");
  MESHLM_CHECK(k.device() == dq.device(), "qlinear_forward: kernels and dequantizer of two backends");
  check_adapter(lora, "qlinear_forward");
  const int OC = static_cast<int>(w.local_rows()), IC = static_cast<int>(w.local_cols());
  if (tile_rows >= OC) {
    make_tile(k, dq, w, 0, OC, ws, lora);
    k.matmul_forward(out, inp, ws, bias, N, IC, OC);
    return;
  }
  float beta = 0.0f;
  if (bias) {
    // Start from the bias and let every tile's GEMM accumulate onto it.
    k.zero(out, static_cast<size_t>(N) * OC);
    k.add_bias(out, bias, N, OC);
    beta = 1.0f;
  }
  for (int r0 = 0; r0 < OC; r0 += tile_rows) {
    const int tr = std::min(tile_rows, OC - r0);
    make_tile(k, dq, w, r0, tr, ws, lora);
    // out[:, r0:r0+tr] (N, tr) = inp (N, IC) tile(tr, IC)^T (+ out)
    k.gemm(false, true, N, tr, IC, 1.0f, inp, IC, ws, IC, beta, out + r0, OC);
  }
}

void qlinear_backward_input(const ops::Kernels& k, const Dequantizer& dq, float* dinp,
                            const float* dout, const QSlice& w, int N, float* ws, int tile_rows,
                            const QAdapter* lora) {
  MESHLM_CHECK(tile_rows > 0, "qlinear_backward_input: tiles of no rows");
  MESHLM_CHECK(k.device() == dq.device(),
               "qlinear_backward_input: kernels and dequantizer of two backends");
  check_adapter(lora, "qlinear_backward_input");
  const int OC = static_cast<int>(w.local_rows()), IC = static_cast<int>(w.local_cols());
  for (int r0 = 0; r0 < OC; r0 += tile_rows) {
    const int tr = std::min(tile_rows, OC - r0);
    make_tile(k, dq, w, r0, tr, ws, lora);
    // dinp (N, IC) = (the tiles so far +) dout[:, r0:r0+tr] (N, tr) tile (tr, IC)
    k.gemm(false, false, N, IC, tr, 1.0f, dout + r0, OC, ws, IC, r0 == 0 ? 0.0f : 1.0f, dinp, IC);
  }
}

}  // namespace meshlm::quant
