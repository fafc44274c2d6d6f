// The quantized block formats of meshlm, defined once for host and device
// code: block sizes, block structs with their byte sizes asserted, effective
// bits per weight, and the scalar helpers (one element in, one element out)
// that every implementation, CPU or CUDA, is built from. Whole-tensor
// routines live in quant/quantize.h; this header holds no containers and
// includes nothing but <stdint.h> and <math.h>, so nvcc can take it as is.
//
// A tensor of n elements is cut into blocks of 64 consecutive elements (the
// last block may be shorter); each block is scaled by its own absmax.
//
// ---- int8: blockwise absmax ---------------------------------------------------
//   absmax_b = max |x| over block b                 (fp32, one per block)
//   q        = round((x / absmax_b) * 127)          (round half away from zero,
//                                                     clamped to [-127, 127];
//                                                     absmax_b = 0 gives q = 0)
//   x'       = q * (absmax_b / 127)                 (the scale is formed first, so
//                                                     absmax near FLT_MAX cannot overflow)
//   Storage: n int8 codes + one fp32 per block = 8 + 32/64 = 8.5 bits/weight.
//   Error: |x - x'| <= absmax_b / 254 (half a step), plus fp32 rounding.
//
// ---- nf4: 4-bit NormalFloat (QLoRA, Dettmers et al. 2023; bitsandbytes) ---------
//   absmax_b = max |x| over block b                 (exact fp32)
//   code     = index of the level of kNF4Levels nearest to x / absmax_b
//              (distances |x / absmax_b - level| in fp32; a tie goes to the
//              lower index; absmax_b = 0 gives code kNF4ZeroCode)
//   x'       = kNF4Levels[code] * absmax'_b         (absmax'_b: see below)
//   Packing as bitsandbytes: element 2j in the HIGH nibble of byte j of the
//   tensor's data, element 2j+1 in the LOW nibble; an odd n leaves the low
//   nibble of the last byte 0. A block of 64 is 32 bytes, block b starts at
//   byte 32 b.
//
//   Double quantization of the absmax constants (QLoRA section 3): the fp32
//   absmax of every block is itself stored in 8 bits.
//     offset    = mean of absmax_b over all blocks of the tensor  (one fp32)
//     absmax2_g = max |absmax_b - offset| over group g of 256 blocks  (fp32)
//     absmax_q  = round(127 * ((absmax_b - offset) / absmax2_g))      (int8,
//                 round half away from zero, clamped; 0 when absmax2_g = 0)
//     absmax'_b = absmax_q * (absmax2_g / 127) + offset  (one fused multiply-add)
//   The nf4 codes are computed with the exact absmax_b, as bitsandbytes does;
//   only dequantization uses absmax'_b.
//   Storage: 4 + 8/64 + 32/(64*256) = 4.127 bits/weight (+ 32 bits per tensor).
//   Error: |x - x'| <= absmax_b * (largest gap between adjacent levels) / 2
//                      + |absmax_b - absmax'_b|, and
//          |absmax_b - absmax'_b| <= absmax2_g / 254, plus fp32 rounding.
#pragma once

#include <math.h>
#include <stdint.h>

#ifndef MESHLM_HD
#ifdef __CUDACC__
#define MESHLM_HD __host__ __device__
#else
#define MESHLM_HD
#endif
#endif

namespace meshlm::quant {

enum class QuantType : uint8_t { f32 = 0, int8 = 1, nf4 = 2 };

// ---- int8 ---------------------------------------------------------------------
constexpr int kQ8Block = 64;
struct Q8Block {
  int8_t q[kQ8Block];
};
static_assert(sizeof(Q8Block) == 64, "int8 block: 64 one-byte codes");
// The block's codes plus its fp32 absmax (kept in a separate array).
constexpr double kQ8BitsPerWeight = (8.0 * sizeof(Q8Block) + 8.0 * sizeof(float)) / kQ8Block;
static_assert(kQ8BitsPerWeight == 8.5, "int8: 8 + 32/64 bits per weight");

// ---- nf4 ----------------------------------------------------------------------
constexpr int kNF4Block = 64;
struct NF4Block {
  uint8_t packed[kNF4Block / 2];  // two codes per byte, the even element high
};
static_assert(sizeof(NF4Block) == 32, "nf4 block: 64 four-bit codes");
constexpr int kNF4AbsmaxBlock = 256;  // blocks per group of the double quantization
// Codes + one int8 absmax code per block + one fp32 absmax2 per group of 256
// blocks (the tensor's single fp32 offset is left out).
constexpr double kNF4BitsPerWeight = 8.0 * sizeof(NF4Block) / kNF4Block +
                                     8.0 * sizeof(int8_t) / kNF4Block +
                                     8.0 * sizeof(float) / (double(kNF4Block) * kNF4AbsmaxBlock);
constexpr double kNF4BitsPerWeightFormula = 4.0 + 8.0 / 64 + 32.0 / (64.0 * 256);
static_assert(kNF4BitsPerWeight - kNF4BitsPerWeightFormula < 1e-9 &&
                  kNF4BitsPerWeightFormula - kNF4BitsPerWeight < 1e-9,
              "nf4: 4 + 8/64 + 32/(64*256) bits per weight");

// The 16 NF4 levels in code order, as published with QLoRA (bitsandbytes'
// create_normal_map(offset=0.9677083, use_extra_value=True)): quantiles of
// N(0, 1), 8 positive and 7 negative, plus an exact 0, divided by the largest.
// tests/torch/check_nf4.py recomputes them from the normal quantiles.
// (A macro so that the device helper below can hold its own copy: CUDA device
// code may not index a host constexpr array at run time.)
#define MESHLM_NF4_LEVELS                                                              \
  -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,             \
      -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,        \
      0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,                 \
      0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,                  \
      0.7229568362236023f, 1.0f
inline constexpr float kNF4Levels[16] = {MESHLM_NF4_LEVELS};
constexpr uint8_t kNF4ZeroCode = 7;  // kNF4Levels[7] == 0: the code of a zero block
static_assert(kNF4Levels[kNF4ZeroCode] == 0.0f, "nf4 holds an exact zero");

// ---- scalar helpers (host and device) ------------------------------------------

// int8: the step of block b, absmax / 127.
MESHLM_HD inline float q8_scale(float absmax) { return absmax / 127.0f; }

// int8: code of x in a block of this absmax.
MESHLM_HD inline int8_t q8_quantize(float x, float absmax) {
  if (!(absmax > 0.0f)) return 0;
  float y = roundf((x / absmax) * 127.0f);  // roundf: half away from zero
  y = y > 127.0f ? 127.0f : (y < -127.0f ? -127.0f : y);
  return static_cast<int8_t>(y);
}

MESHLM_HD inline float q8_dequantize(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

#if defined(__CUDACC__)
// The same 16 floats in constant memory: a table declared inside a device
// function is rebuilt in local memory on every call.
static __constant__ float kNF4LevelsDevice[16] = {MESHLM_NF4_LEVELS};
#endif

MESHLM_HD inline float nf4_level(uint8_t code) {
#if defined(__CUDA_ARCH__)
  return kNF4LevelsDevice[code & 15];
#else
  return kNF4Levels[code & 15];
#endif
}

// nf4: index of the level nearest to v (normally in [-1, 1]); ties go to the
// lower index. A plain scan in fp32, so that any independent implementation
// that takes argmin |v - level| in fp32 finds the same code.
MESHLM_HD inline uint8_t nf4_nearest(float v) {
  constexpr float levels[16] = {MESHLM_NF4_LEVELS};
  uint8_t best = 0;
  float best_d = fabsf(v - levels[0]);
  for (uint8_t c = 1; c < 16; ++c) {
    const float d = fabsf(v - levels[c]);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

// nf4: code of x in a block whose exact absmax is `absmax`.
MESHLM_HD inline uint8_t nf4_quantize(float x, float absmax) {
  return absmax > 0.0f ? nf4_nearest(x / absmax) : kNF4ZeroCode;
}

// nf4: code of element i of a packed array (element 2j high nibble of byte j).
MESHLM_HD inline uint8_t nf4_code_at(const uint8_t* packed, uint64_t i) {
  const uint8_t byte = packed[i >> 1];
  return (i & 1) ? (byte & 0x0F) : (byte >> 4);
}

MESHLM_HD inline float nf4_dequantize(uint8_t code, float absmax) {
  return nf4_level(code) * absmax;
}

// nf4 double quantization: the int8 code of one block's absmax.
MESHLM_HD inline int8_t nf4_absmax_quantize(float absmax, float absmax2, float offset) {
  if (!(absmax2 > 0.0f)) return 0;
  // The ratio first: |ratio| <= 1, so 127 * ratio cannot overflow.
  float y = roundf(127.0f * ((absmax - offset) / absmax2));
  y = y > 127.0f ? 127.0f : (y < -127.0f ? -127.0f : y);
  return static_cast<int8_t>(y);
}

// nf4 double quantization: a block's absmax back from its code. fmaf pins the
// rounding (one, of the exact q * step + offset), so host and device agree
// whatever the compiler contracts.
MESHLM_HD inline float nf4_absmax_dequantize(int8_t absmax_q, float absmax2, float offset) {
  return fmaf(static_cast<float>(absmax_q), absmax2 / 127.0f, offset);
}

}  // namespace meshlm::quant
