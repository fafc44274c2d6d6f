// The CPU reference of the block formats: layout, quantize, dequantize.
#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace meshlm::quant {

namespace {

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
size_t align_up(size_t a) { return ceil_div(a, kQAlign) * kQAlign; }

// Elements [b * block, min((b + 1) * block, n)) of block b.
size_t block_end(size_t b, size_t block, size_t n) { return std::min((b + 1) * block, n); }

float block_absmax(const float* x, size_t i0, size_t i1) {
  float m = 0.0f;
  for (size_t i = i0; i < i1; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// ---- int8 ---------------------------------------------------------------------

void quantize_q8(const float* x, const QTensor& t, size_t first, size_t count) {
  const size_t end = first + count, b0 = first / kQ8Block, b1 = ceil_div(end, kQ8Block);
  int8_t* q = static_cast<int8_t*>(t.data);
#pragma omp parallel for schedule(static)
  for (size_t b = b0; b < b1; ++b) {
    const size_t i0 = b * kQ8Block, i1 = block_end(b, kQ8Block, end);
    const float a = block_absmax(x - first, i0, i1);
    t.absmax[b] = a;
    for (size_t i = i0; i < i1; ++i) q[i] = q8_quantize(x[i - first], a);
  }
}

void dequantize_q8(const QTensor& t, size_t first, size_t count, float* out) {
  const int8_t* q = static_cast<const int8_t*>(t.data);
  size_t i = first;
  const size_t end = first + count;
  while (i < end) {
    const size_t b = i / kQ8Block, b0 = b * kQ8Block;
    const float s = q8_scale(t.absmax[b]);
    if (i == b0 && b0 + kQ8Block <= end) {
      // A whole block: one scale, a fixed-length loop the compiler vectorises.
      const int8_t* qb = q + b0;
      for (int k = 0; k < kQ8Block; ++k) out[k] = q8_dequantize(qb[k], s);
      out += kQ8Block;
      i += kQ8Block;
      continue;
    }
    const size_t stop = std::min(b0 + kQ8Block, end);
    for (; i < stop; ++i) *out++ = q8_dequantize(q[i], s);
  }
}

// ---- nf4 ----------------------------------------------------------------------

void quantize_nf4(const float* x, const QTensor& t, size_t first, size_t count, float* absmax) {
  const size_t end = first + count, b0 = first / kNF4Block, b1 = ceil_div(end, kNF4Block);
  uint8_t* packed = static_cast<uint8_t*>(t.data);
#pragma omp parallel for schedule(static)
  for (size_t b = b0; b < b1; ++b) {
    const size_t i0 = b * kNF4Block, i1 = block_end(b, kNF4Block, end);
    const float a = block_absmax(x - first, i0, i1);
    absmax[b] = a;
    // i0 is even: pairs (i, i + 1) never straddle two blocks.
    for (size_t i = i0; i < i1; i += 2) {
      const uint8_t hi = nf4_quantize(x[i - first], a);
      const uint8_t lo = i + 1 < i1 ? nf4_quantize(x[i + 1 - first], a) : 0;
      packed[i / 2] = static_cast<uint8_t>(hi << 4 | lo);
    }
  }
}

// Double quantization of every block's absmax. The mean is summed in double
// in block order, one fixed order whatever the thread count.
void finish_nf4(const QTensor& t, const float* absmax) {
  const size_t nb = ceil_div(t.n, kNF4Block), ng = ceil_div(nb, kNF4AbsmaxBlock);
  double sum = 0.0;
  for (size_t b = 0; b < nb; ++b) sum += absmax[b];
  const float offset = static_cast<float>(sum / static_cast<double>(nb));
  *t.offset = offset;
#pragma omp parallel for schedule(static)
  for (size_t g = 0; g < ng; ++g) {
    const size_t b0 = g * kNF4AbsmaxBlock, b1 = block_end(g, kNF4AbsmaxBlock, nb);
    float a2 = 0.0f;
    for (size_t b = b0; b < b1; ++b) a2 = std::max(a2, std::fabs(absmax[b] - offset));
    t.absmax2[g] = a2;
    for (size_t b = b0; b < b1; ++b) t.absmax_q[b] = nf4_absmax_quantize(absmax[b], a2, offset);
  }
}

float nf4_block_absmax(const QTensor& t, size_t b) {
  return nf4_absmax_dequantize(t.absmax_q[b], t.absmax2[b / kNF4AbsmaxBlock], *t.offset);
}

void dequantize_nf4(const QTensor& t, size_t first, size_t count, float* out) {
  const uint8_t* packed = static_cast<const uint8_t*>(t.data);
  size_t i = first;
  const size_t end = first + count;
  while (i < end) {
    const size_t b = i / kNF4Block, b0 = b * kNF4Block;
    const float a = nf4_block_absmax(t, b);
    if (i == b0 && b0 + kNF4Block <= end) {
      // A whole block: the 16 levels scaled once, then one table look-up per
      // nibble. Each entry is the same product nf4_dequantize forms.
      float scaled[16];
      for (int c = 0; c < 16; ++c) scaled[c] = kNF4Levels[c] * a;
      const uint8_t* p = packed + b0 / 2;
      for (int j = 0; j < kNF4Block / 2; ++j) {
        out[2 * j] = scaled[p[j] >> 4];
        out[2 * j + 1] = scaled[p[j] & 0x0F];
      }
      out += kNF4Block;
      i += kNF4Block;
      continue;
    }
    const size_t stop = std::min(b0 + kNF4Block, end);
    for (; i < stop; ++i) *out++ = nf4_dequantize(nf4_code_at(packed, i), a);
  }
}

}  // namespace

const QuantFormat& quant_format(QuantType t) {
  for (const QuantFormat& f : kQuantFormats)
    if (f.type == t) return f;
  throw RankError("no quantization format with code " + std::to_string(static_cast<int>(t)),
                  MESHLM_HERE);
}

void quantize_f32_blocks_ref(const float* x, const QTensor& out, size_t first, size_t count,
                             float*) {
  std::memcpy(static_cast<float*>(out.data) + first, x, count * sizeof(float));
}
void dequantize_f32_ref(const QTensor& t, size_t first, size_t count, float* out) {
  std::memcpy(out, static_cast<const float*>(t.data) + first, count * sizeof(float));
}
void quantize_int8_blocks_ref(const float* x, const QTensor& out, size_t first, size_t count,
                              float*) {
  quantize_q8(x, out, first, count);
}
void dequantize_int8_ref(const QTensor& t, size_t first, size_t count, float* out) {
  dequantize_q8(t, first, count, out);
}
void quantize_nf4_blocks_ref(const float* x, const QTensor& out, size_t first, size_t count,
                             float* absmax) {
  quantize_nf4(x, out, first, count, absmax);
}
void finish_nf4_ref(const QTensor& out, const float* absmax) { finish_nf4(out, absmax); }
void dequantize_nf4_ref(const QTensor& t, size_t first, size_t count, float* out) {
  dequantize_nf4(t, first, count, out);
}

size_t BlockQuantizer::absmax_bytes(QuantType type, size_t n) {
  const QuantFormat& f = quant_format(type);
  return f.finish_ref ? ceil_div(n, static_cast<size_t>(f.block)) * sizeof(float) : 0;
}

BlockQuantizer::BlockQuantizer(const QTensor& out)
    : out_(out),
      absmax_(absmax_bytes(out.type, out.n), MemCategory::workspace, "quant.block_absmax") {
  MESHLM_CHECK(out.n > 0 && out.data, "empty quantized tensor");
}

void BlockQuantizer::add(const float* x, size_t first, size_t count) {
  const QuantFormat& f = quant_format(out_.type);
  MESHLM_CHECK(first == next_ && count <= out_.n - first,
               "quantized in order: elements from " + std::to_string(next_) + " come next");
  MESHLM_CHECK(f.block == 0 || first % static_cast<size_t>(f.block) == 0,
               "a quantized range starts on a block");
  if (count == 0) return;
  f.quantize_blocks_ref(x, out_, first, count, absmax_.bytes() ? absmax_.as<float>() : nullptr);
  next_ = first + count;
}

void BlockQuantizer::finish() {
  MESHLM_CHECK(next_ == out_.n, "quantized tensor finished with elements missing");
  const QuantFormat& f = quant_format(out_.type);
  if (f.finish_ref) f.finish_ref(out_, absmax_.as<float>());
}

const QArray* QLayout::find(std::string_view name) const {
  for (int k = 0; k < narrays; ++k)
    if (name == arrays[k].name) return &arrays[k];
  return nullptr;
}

QLayout qlayout(QuantType type, size_t n) {
  MESHLM_CHECK(n > 0, "a quantized tensor has at least one element");
  QLayout L;
  L.type = type;
  L.n = n;
  size_t at = 0;
  auto add = [&](const char* name, DType elem, size_t count) {
    QArray& a = L.arrays[L.narrays++];
    a = {name, elem, count, at};
    at = align_up(at + a.bytes());
  };
  switch (type) {
    case QuantType::f32:
      add("data", DType::f32, n);
      break;
    case QuantType::int8:
      L.nblocks = ceil_div(n, kQ8Block);
      add("data", DType::i8, n);
      add("absmax", DType::f32, L.nblocks);
      break;
    case QuantType::nf4:
      L.nblocks = ceil_div(n, kNF4Block);
      L.ngroups = ceil_div(L.nblocks, kNF4AbsmaxBlock);
      add("data", DType::u8, ceil_div(n, 2));
      add("absmax", DType::i8, L.nblocks);
      add("absmax2", DType::f32, L.ngroups);
      add("offset", DType::f32, 1);
      break;
  }
  MESHLM_CHECK(L.narrays > 0, "unknown quantization type");
  L.total_bytes = at;
  return L;
}

QTensor qtensor_at(const QLayout& L, uint8_t* base) {
  MESHLM_CHECK(reinterpret_cast<uintptr_t>(base) % alignof(float) == 0,
               "quantized tensor base must be 4-byte aligned");
  auto at = [&](const char* name) -> uint8_t* {
    const QArray* a = L.find(name);
    return a ? base + a->offset : nullptr;
  };
  QTensor t;
  t.type = L.type;
  t.n = L.n;
  t.data = at("data");
  switch (L.type) {
    case QuantType::f32: break;
    case QuantType::int8: t.absmax = reinterpret_cast<float*>(at("absmax")); break;
    case QuantType::nf4:
      t.absmax_q = reinterpret_cast<int8_t*>(at("absmax"));
      t.absmax2 = reinterpret_cast<float*>(at("absmax2"));
      t.offset = reinterpret_cast<float*>(at("offset"));
      break;
  }
  return t;
}

const void* qarray_data(const QTensor& t, std::string_view name) {
  if (name == "data") return t.data;
  if (name == "absmax")
    return t.type == QuantType::nf4 ? static_cast<const void*>(t.absmax_q) : t.absmax;
  if (name == "absmax2") return t.absmax2;
  if (name == "offset") return t.offset;
  return nullptr;
}

void quantize_ref(const float* x, const QTensor& out) {
  BlockQuantizer q(out);
  q.add(x, 0, out.n);
  q.finish();
}

void dequantize_ref(const QTensor& t, size_t first, size_t count, float* out) {
  MESHLM_CHECK(first <= t.n && count <= t.n - first, "dequantize range out of the tensor");
  quant_format(t.type).dequantize_ref(t, first, count, out);
}

}  // namespace meshlm::quant
