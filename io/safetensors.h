// Reader of the safetensors format (the weight files of the Hugging Face hub).
//
// Layout of a file:
//
//     offset 0       uint64 little-endian  N = length of the header
//     offset 8       N bytes               UTF-8 JSON object (may end in spaces)
//     offset 8 + N   the data block        every tensor's bytes, little-endian, row-major
//
// The header maps each tensor name to
//     {"dtype": "F32", "shape": [768, 2304], "data_offsets": [begin, end]}
// with [begin, end) a byte range relative to the start of the data block,
// plus an optional "__metadata__" object of strings.
//
// SafetensorsFile checks the whole header when it opens the file (every
// size, offset and product is bounds- and overflow-checked, so nothing a
// file says can make a read go out of range) and keeps the file open.
// Tensors are read with pread in chunks of kSafetensorsChunkBytes, one
// tensor (or a range of it) at a time: the file is never mapped nor read
// whole, so a 6 GB checkpoint costs one tensor of memory.
//
// Every error is a RankError naming the file and, where there is one, the
// tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace meshlm::io {

// A header longer than this is taken as a sign of a corrupt or foreign file
// rather than allocated (GPT-2 XL's header is about 40 KB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;  // 100 MB
// Bytes read from the file per pread when a tensor is read.
inline constexpr size_t kSafetensorsChunkBytes = 1u << 20;

// One tensor as the header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as written in the file: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;   // empty for a scalar
  uint64_t begin = 0, end = 0;  // byte range [begin, end) inside the data block
  uint64_t numel() const;       // product of shape (1 for a scalar)
};

// Bytes per element of a safetensors dtype; 0 for a string that is none.
// Every dtype of the format is known (BOOL, U8, I8, F8_E4M3, F8_E5M2, I16,
// U16, F16, BF16, I32, U32, F32, I64, U64, F64), so a file that also holds
// integer tensors opens; only F32, F16, BF16 and F64 convert to float.
size_t safetensors_dtype_size(const std::string& dtype);
bool safetensors_dtype_is_float(const std::string& dtype);  // F32, F16, BF16, F64

// Exact conversions of IEEE binary16 and bfloat16 bit patterns to float
// (subnormals, infinities and NaNs included; NaN payloads are kept).
float f16_to_f32(uint16_t bits);
float bf16_to_f32(uint16_t bits);

class SafetensorsFile {
public:
  // Opens `path`, reads and validates the header; throws RankError.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_start() const { return data_start_; }  // 8 + N

  // Every tensor, in file order (ascending data_offsets begin; ties by name).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws RankError naming the file when there is no such tensor.
  const SafetensorsTensor& info(const std::string& name) const;
  // The "__metadata__" object (string values as they are, others as JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads the whole tensor `name` into out[0:numel] as float. F32, F16,
  // BF16 and F64 are converted (F64 rounds to nearest); any other dtype
  // throws RankError naming the tensor.
  void read_f32(const std::string& name, float* out) const;
  // Elements [first, first + count) of the flattened tensor only (e.g. the
  // first rows of a position table); throws when the range is out of bounds.
  void read_f32(const std::string& name, float* out, uint64_t first, uint64_t count) const;

private:
  std::string in_file() const;  // "safetensors file '<path>': "
  void parse_header(const std::string& header);

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0, data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace meshlm::io
