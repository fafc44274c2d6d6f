// Whole tensors in the block formats of quant/formats.h: where the arrays of
// one quantized tensor lie in memory (QLayout), a view of them (QTensor), and
// the scalar CPU reference that quantizes and dequantizes (the `_ref` every
// other implementation is tested against).
//
// One logical tensor of n elements is a few arrays placed back to back, each
// starting at a multiple of kQAlign bytes from the tensor's start:
//   f32:  data    (n fp32)
//   int8: data    (n int8 codes)           absmax  (nblocks fp32)
//   nf4:  data    (ceil(n/2) packed bytes) absmax  (nblocks int8 = absmax_q)
//         absmax2 (ngroups fp32)           offset  (1 fp32)
// with nblocks = ceil(n / 64) and ngroups = ceil(nblocks / 256). Each array
// has a name, an element type and a count, so that a file format can store
// it as the dataset /q/<tensor>/<name>.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/alloc.h"
#include "core/enum_names.h"
#include "core/tensor.h"
#include "quant/formats.h"

namespace meshlm::quant {

// ---- layout -------------------------------------------------------------------

constexpr size_t kQAlign = 64;  // bytes; a cache line, and a whole block of every format

// One array of a quantized tensor.
struct QArray {
  const char* name = "";   // "data", "absmax", "absmax2" or "offset"
  DType elem = DType::u8;  // u8, i8 or f32
  size_t count = 0;        // elements
  size_t offset = 0;       // bytes from the tensor's start, a multiple of kQAlign
  size_t bytes() const { return count * dtype_size(elem); }
};

// Where the arrays of one tensor of n elements lie.
struct QLayout {
  QuantType type = QuantType::f32;
  size_t n = 0;
  size_t nblocks = 0;  // int8, nf4: ceil(n / 64)
  size_t ngroups = 0;  // nf4: ceil(nblocks / 256)
  int narrays = 0;
  std::array<QArray, 4> arrays{};  // in memory order; [0] is always "data"
  size_t total_bytes = 0;          // a multiple of kQAlign: the next tensor may follow

  const QArray* find(std::string_view name) const;  // null when the type has no such array
  double bits_per_weight() const { return 8.0 * static_cast<double>(total_bytes) / n; }
};

QLayout qlayout(QuantType type, size_t n);

// ---- view ---------------------------------------------------------------------

// A quantized tensor in memory; owns nothing. The pointers of arrays that the
// type does not have are null. A `const QTensor&` is used for reading.
struct QTensor {
  QuantType type = QuantType::f32;
  size_t n = 0;
  void* data = nullptr;        // f32: float[n]; int8: int8_t[n]; nf4: uint8_t[ceil(n/2)]
  float* absmax = nullptr;     // int8: [nblocks]
  int8_t* absmax_q = nullptr;  // nf4: [nblocks], the double-quantized absmax codes
  float* absmax2 = nullptr;    // nf4: [ngroups]
  float* offset = nullptr;     // nf4: [1]
};

// The view of a tensor laid out by `layout` from `base` (aligned to at least
// 4 bytes; kQAlign is best).
QTensor qtensor_at(const QLayout& layout, uint8_t* base);
// Where t keeps the array of that name ("data", "absmax", "absmax2",
// "offset": the names of QArray), or null when its type has none; the
// inverse of qtensor_at's naming, for copying a tensor array by array.
const void* qarray_data(const QTensor& t, std::string_view name);

// ---- reference implementation --------------------------------------------------

// Quantizes x[0, out.n) (finite values) into out. Blocks are independent and
// the offset of nf4 is summed in one fixed order, so the bytes do not depend
// on the number of OpenMP threads.
void quantize_ref(const float* x, const QTensor& out);

// The same bytes, from a tensor given a range of elements at a time, so
// that the whole tensor in fp32 never has to exist: add() ranges in order,
// each starting at a multiple of the format's block, until all out.n
// elements are in, then finish(). nf4 keeps every block's fp32 absmax
// (absmax_bytes(): out.n / 16 bytes, in the workspace category) until
// finish() quantizes them a second time against their mean.
class BlockQuantizer {
public:
  explicit BlockQuantizer(const QTensor& out);
  void add(const float* x, size_t first, size_t count);
  void finish();
  // What an nf4 tensor of n elements keeps until finish(); 0 for the others.
  static size_t absmax_bytes(QuantType type, size_t n);

private:
  QTensor out_;
  size_t next_ = 0;  // the first element not yet added
  Buffer absmax_;
};

// out[0, count) = elements [first, first + count) of t, for any range (it
// need not start or end on a block boundary). Serial: callers parallelise
// over ranges (qlinear's dequantize_rows does so over rows).
void dequantize_ref(const QTensor& t, size_t first, size_t count, float* out);

// ---- the formats: one table ----------------------------------------------------

// Per format, the scalar reference (what BlockQuantizer and dequantize_ref
// dispatch to). quantize_*_blocks_ref quantizes elements [first, first +
// count) from x (x[0] is element `first`, a multiple of the block); a format
// with a second level (nf4) leaves each block's fp32 absmax in absmax[b]
// (b counted from the tensor's first block) for its finish_*_ref, which
// runs once all blocks are in.
void quantize_f32_blocks_ref(const float* x, const QTensor& out, size_t first, size_t count,
                             float* absmax);
void dequantize_f32_ref(const QTensor& t, size_t first, size_t count, float* out);
void quantize_int8_blocks_ref(const float* x, const QTensor& out, size_t first, size_t count,
                              float* absmax);
void dequantize_int8_ref(const QTensor& t, size_t first, size_t count, float* out);
void quantize_nf4_blocks_ref(const float* x, const QTensor& out, size_t first, size_t count,
                             float* absmax);
void finish_nf4_ref(const QTensor& out, const float* absmax);
void dequantize_nf4_ref(const QTensor& t, size_t first, size_t count, float* out);

// Everything meshlm says about a format comes from this table: the values
// quant.type accepts, --help, the settings of the cache key, and which
// reference implementation runs.
struct QuantFormat {
  QuantType type;
  const char* name;        // the value of quant.type
  int block;               // elements per absmax block; 0 = not blocked
  int absmax_group;        // blocks per group of the double quantization; 0 = none
  double bits_per_weight;  // stored bits per element of a large tensor
  void (*quantize_blocks_ref)(const float* x, const QTensor& out, size_t first, size_t count,
                              float* absmax);
  void (*finish_ref)(const QTensor& out, const float* absmax);  // null: nothing to finish
  void (*dequantize_ref)(const QTensor& t, size_t first, size_t count, float* out);
};
inline constexpr QuantFormat kQuantFormats[] = {
    {QuantType::nf4, "nf4", kNF4Block, kNF4AbsmaxBlock, kNF4BitsPerWeight,
     quantize_nf4_blocks_ref, finish_nf4_ref, dequantize_nf4_ref},
    {QuantType::int8, "int8", kQ8Block, 0, kQ8BitsPerWeight, quantize_int8_blocks_ref, nullptr,
     dequantize_int8_ref},
    {QuantType::f32, "f32", 0, 0, 32.0, quantize_f32_blocks_ref, nullptr, dequantize_f32_ref},
};
const QuantFormat& quant_format(QuantType t);

// QuantType's keyword names, taken from the table.
inline constexpr auto kQuantTypeNames = [] {
  std::array<EnumName<QuantType>, std::size(kQuantFormats)> names{};
  for (size_t i = 0; i < names.size(); ++i) names[i] = {kQuantFormats[i].type, kQuantFormats[i].name};
  return names;
}();
constexpr std::span<const EnumName<QuantType>> enum_names(QuantType) { return kQuantTypeNames; }

}  // namespace meshlm::quant
