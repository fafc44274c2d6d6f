#include "core/tensor.h"

namespace meshlm {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::u16: return "u16";
    case DType::u32: return "u32";
    case DType::i8: return "i8";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + ")";
}

}  // namespace meshlm
