// Tensor views: a pointer with a shape, a dtype and a device. A view owns
// nothing; memory is owned by a Buffer (core/alloc.h), usually one big flat
// buffer cut into many views by a table (model/gpt.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace meshlm {

// The element types of the whole program: tensors, collectives, the
// arrays of quantized tensors (quant/quantize.h) and of the quantized cache
// (io/quant_cache.h).
enum class DType : uint8_t { f32, f64, bf16, i32, u8, u16, u32, i8 };
enum class Device : uint8_t { cpu, cuda };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::bf16: case DType::u16: return 2;
    case DType::u8: case DType::i8: return 1;
  }
  return 0;
}
const char* dtype_name(DType t);  // "f32", "u8", "i8", ...
const char* device_name(Device d);

// Up to 4 dimensions, outermost first (row-major).
struct Shape {
  static constexpr int kMaxDims = 4;
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    MESHLM_CHECK(d.size() <= kMaxDims, "too many dimensions");
    for (int64_t x : d) dims[ndim++] = x;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;  // "(768, 2304)"
};

struct TensorView {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

}  // namespace meshlm
