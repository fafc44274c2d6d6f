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
// the rounding (a rounded copy of each input, then the fp32 GEMM), so the
// GPU's mixed precision has an exact reference on the CPU.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace meshlm::ops
