// train.precision: the number format of every GEMM's inputs.
//
//   fp32  the GEMMs read fp32 (on the GPU without TF32): the exact reference.
//   bf16  each GEMM reads its two inputs (weights, activations, gradients of
//         activations, attention probabilities) rounded to bfloat16, round
//         to nearest even, and accumulates in fp32; its output is fp32.
//   fp16  the same with IEEE half, whose range ends at 65504: a larger
//         value becomes infinite, which is why fp16 training scales its loss
//         (train/loss_scaler.h).
//
// Everything else stays fp32: master weights, AdamW moments, the stored
// activations, LayerNorm, softmax, GELU, the loss. The CPU backend emulates
// the rounding (rounded copies of the inputs, then the fp32 GEMM), so the
// GPU's mixed precision has an exact reference on the CPU: each input is
// rounded as on the GPU; the fp32 sums are added in another order than
// cuBLAS's, as any two GEMMs add them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/alloc.h"
#include "core/enum_names.h"

namespace meshlm::ops {

enum class Precision { fp32, bf16, fp16 };
inline constexpr EnumName<Precision> kPrecisionNames[] = {
    {Precision::fp32, "fp32"},
    {Precision::bf16, "bf16"},
    {Precision::fp16, "fp16"},
};
constexpr std::span<const EnumName<Precision>> enum_names(Precision) { return kPrecisionNames; }

// x rounded to bfloat16 (8 bits of mantissa), to nearest, ties to even; NaN
// stays NaN, and a value beyond bf16's largest rounds to infinity.
inline float round_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}
// x rounded to IEEE half (11 bits of mantissa, subnormals below 2^-14), to
// nearest, ties to even; |x| >= 65520 becomes infinite.
float round_to_fp16(float x);

inline float round_to(Precision p, float x) {
  switch (p) {
    case Precision::bf16: return round_to_bf16(x);
    case Precision::fp16: return round_to_fp16(x);
    case Precision::fp32: break;
  }
  return x;
}
// dst(rows, cols) = round_to(p, src) with src's rows ld apart; dst is dense.
void round_matrix(Precision p, float* dst, const float* src, size_t rows, size_t cols, size_t ld);

// The CPU's GEMM at bf16 and fp16 (ops::gemm(Precision, ...), ops/blas.h)
// rounds its inputs a tile at a time, never a whole operand: for each stretch
// of at most kRoundMaxK of the sum (K), blocks of rows of op(A) and of
// columns of op(B) are rounded into the calling thread's scratch, as many
// as kRoundingScratchFloats holds, and each pair's product is added to C in
// fp32 (the first stretch with the caller's beta). Its memory beyond the
// operands is therefore the scratch, 16 MiB per thread, whatever the shapes,
// where whole copies of the operands took up to the classifier's weight and
// a chunk of its logits' gradient (docs/PERFORMANCE.md, "bf16 and fp16 on
// the CPU"). The tiles are a function of the shape alone (round_tiles): the
// sums do not depend on whose scratch holds them.
constexpr size_t kRoundingScratchFloats = size_t(1) << 22;
constexpr int kRoundMaxK = 1024;
constexpr size_t rounding_scratch_bytes(int threads) {
  return threads > 0 ? size_t(threads) * kRoundingScratchFloats * sizeof(float) : 0;
}

// The tiles of a rounded GEMM of C(M,N) = op(A)(M,K) op(B)(K,N): kb of K
// at a time, mb rows of op(A) and nb columns of op(B) with (mb + nb) kb <=
// kRoundingScratchFloats (all of either when it fits); rows_outer: A's
// blocks outside, each rounded once per stretch and B's once per block of
// A's, or the other way round, whichever rounds fewer elements.
struct RoundTiles {
  int mb = 0, nb = 0, kb = 0;
  bool rows_outer = true;
};
RoundTiles round_tiles(int M, int N, int K);
// The rounded GEMM on the tiles `t`, its blocks in `scratch` ((t.mb + t.nb)
// t.kb floats): what gemm(Precision, ...) runs with round_tiles(M, N, K);
// callable with other tiles so that tests reach every path on small shapes.
void gemm_tiles(Precision p, const RoundTiles& t, float* scratch, bool ta, bool tb, int M, int N,
                int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                float* C, int ldc);

// The rounded GEMMs' scratch of `threads` OpenMP threads, one tracked
// Buffer (workspace, "rounded GEMM tiles"), which every GEMM at bf16/fp16
// uses while it lives: outside a parallel region the first thread's part,
// inside one the part of omp_get_thread_num(). Made and destroyed on the
// rank's main thread, outside parallel regions; one at a time. Without one
// (tests, tools), or from a thread past `threads`, a GEMM rounds into a
// heap block of its tiles' size that it frees before returning, so that no
// memory outlives the call.
class RoundingScratch {
public:
  explicit RoundingScratch(int threads);
  ~RoundingScratch();
  RoundingScratch(const RoundingScratch&) = delete;
  RoundingScratch& operator=(const RoundingScratch&) = delete;

private:
  int threads_;
  Buffer buf_;
};

}  // namespace meshlm::ops
