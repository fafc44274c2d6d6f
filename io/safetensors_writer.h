// Writer of the safetensors format (the layout is described in
// io/safetensors.h, whose reader opens every file this writes).
//
// The header is made first, from the list of tensors (name, dtype, shape),
// so each tensor's data_offsets are known before any byte of data; the
// tensors' bytes then follow one after the other, in the order of the list,
// written as the caller makes them (a block of rows at a time): a file of
// several GB never needs more memory than the caller's block.
//
//     offset 0       uint64 little-endian  N = length of the header
//     offset 8       N bytes               the JSON header, padded with spaces so that
//                                          the data starts at a multiple of 8
//     offset 8 + N   the data block        tensor after tensor, no gaps
//
// The file is written under a temporary name beside `path` (io/h5.h's
// AtomicWrite: removed on an exception or a signal, flushed to disk and
// renamed onto `path` by commit()), so a reader never sees half a file.
// A file already at `path` is replaced only when it is itself a safetensors
// file (its header parses); anything else there (a checkpoint, a token
// file, a directory) is an error naming it, and nothing is written.
//
// Conversions from float32 to the format's 16-bit floats round to nearest,
// ties to even (IEEE 754's default, what torch's .to(torch.bfloat16) and
// .half() do), NaN staying a quiet NaN of the same sign.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshlm::io {

namespace h5 {
class AtomicWrite;
}

// float32 -> bfloat16: round to nearest even; values past bfloat16's
// largest finite (about 3.39e38) become infinities of their sign.
uint16_t f32_to_bf16(float x);
// float32 -> IEEE binary16: round to nearest even, subnormals included;
// |x| >= 65520 becomes an infinity of its sign (the caller decides whether
// that is an error: meshlm's export refuses it).
uint16_t f32_to_f16(float x);

// True when `path` is a regular file whose safetensors header reads
// (io::SafetensorsFile opens it). Never throws.
bool is_safetensors_file(const std::string& path);

// One tensor of the file to write.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // a safetensors dtype: "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;  // empty for a scalar
};

class SafetensorsWriter {
public:
  // Checks `path` (see above), opens its temporary file and writes the
  // header. `metadata` becomes "__metadata__" (string values, as the format
  // wants). Throws RankError naming the file.
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsEntry> tensors,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();  // without commit(): the temporary file is removed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next `bytes` bytes of the data block: the tensors' little-endian
  // elements, row-major, in the order of the list. Writing past the last
  // tensor's end throws.
  void write(const void* data, size_t bytes);
  // Checks that every tensor is complete, flushes the file to disk, closes
  // it and renames it onto the path.
  void commit();

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return data_start_ + data_bytes_; }

private:
  std::string in_file() const;  // "safetensors file '<path>': "
  void write_all(const void* data, size_t bytes);  // to the temporary file, as they are

  std::string path_;
  std::unique_ptr<h5::AtomicWrite> tmp_;
  int fd_ = -1;
  std::vector<SafetensorsEntry> tensors_;
  std::vector<uint64_t> ends_;  // each tensor's end in the data block
  uint64_t data_start_ = 0, data_bytes_ = 0, written_ = 0;
};

}  // namespace meshlm::io
