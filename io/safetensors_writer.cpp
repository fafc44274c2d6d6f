#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "io/h5.h"
#include "io/safetensors.h"

namespace meshlm::io {

// ---------------------------------------------------------------------------
// 16-bit floats
// ---------------------------------------------------------------------------

uint16_t f32_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(u >> 16 | 0x0040u);  // quiet NaN
  // bfloat16 is the top half of a float32: add just under half of the
  // dropped part's unit, plus one when the kept part is odd (ties to even).
  // A carry out of the mantissa raises the exponent, up to infinity.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

uint16_t f32_to_f16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>(u >> 16 & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | (a >> 13 & 0x1ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  // Rounds m >> shift to nearest, ties to even.
  auto round_shift = [](uint32_t m, int shift) {
    const uint32_t kept = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1u)) ? 1u : 0u);
  };
  if (a < 0x38800000u) {
    // Below 2^-14, binary16's smallest normal: a multiple of 2^-24. Half of
    // that (2^-25) and less round to zero.
    if (a <= 0x33000000u) return sign;
    const int e = static_cast<int>(a >> 23);              // 102 .. 112
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;         // value = m 2^(e - 150)
    return static_cast<uint16_t>(sign | round_shift(m, 126 - e));  // 0x400 is the smallest normal
  }
  // Normal: rebias the exponent, keep 10 of the 23 mantissa bits; a carry
  // out of the mantissa raises the exponent (65504 stays below infinity: the
  // 65520 case is above).
  const uint32_t h = (((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13);
  const uint32_t rest = a & 0x1fffu;
  return static_cast<uint16_t>(sign | (h + (rest > 0x1000u || (rest == 0x1000u && (h & 1u)) ? 1u : 0u)));
}

bool is_safetensors_file(const std::string& path) {
  try {
    if (!non_regular_kind(path).empty()) return false;
    SafetensorsFile f(path);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------------------
// SafetensorsWriter
// ---------------------------------------------------------------------------

std::string SafetensorsWriter::in_file() const { return "safetensors file '" + path_ + "': "; }

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     std::vector<SafetensorsEntry> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  if (path_.empty()) throw RankError("no output file named (an empty path)", MESHLM_HERE);
  const std::string kind = non_regular_kind(path_);
  if (!kind.empty())
    throw RankError(in_file() + "the path is " + kind + "; meshlm writes a regular file there",
                    MESHLM_HERE);
  std::error_code ec;
  if (std::filesystem::exists(path_, ec) && !is_safetensors_file(path_))
    throw RankError(in_file() +
                        "a file that is not a safetensors file is already there; meshlm replaces "
                        "only safetensors files (remove it or name another)",
                    MESHLM_HERE);

  // The header, tensors in the order given (nlohmann's ordered_json keeps
  // it, so the file reads in the same order as its data).
  nlohmann::ordered_json header;
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t at = 0;
  for (const SafetensorsEntry& t : tensors_) {
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) throw RankError(in_file() + "tensor '" + t.name + "': unknown dtype '" + t.dtype + "'", MESHLM_HERE);
    if (t.name == "__metadata__" || header.contains(t.name))
      throw RankError(in_file() + "tensor '" + t.name + "' named twice (or a reserved name)",
                      MESHLM_HERE);
    uint64_t bytes = esize;
    for (int64_t d : t.shape) {
      if (d < 0) throw RankError(in_file() + "tensor '" + t.name + "': negative dimension", MESHLM_HERE);
      bytes *= static_cast<uint64_t>(d);
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
    ends_.push_back(at);
  }
  data_bytes_ = at;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data block starts 8-aligned
  data_start_ = 8 + text.size();

  tmp_ = std::make_unique<h5::AtomicWrite>(path_);
  fd_ = ::open(tmp_->tmp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0)
    throw RankError(in_file() + "cannot create '" + tmp_->tmp_path() + "': " + std::strerror(errno),
                    MESHLM_HERE);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  write_all(len, 8);
  write_all(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write_all(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t r = ::write(fd_, p + done, bytes - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw RankError(in_file() + "cannot write '" + tmp_->tmp_path() + "': " + std::strerror(errno),
                      MESHLM_HERE);
    done += static_cast<size_t>(r);
  }
}

void SafetensorsWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw RankError(in_file() + "written to after commit()", MESHLM_HERE);
  if (bytes > data_bytes_ - written_)
    throw RankError(in_file() + std::to_string(bytes) + " bytes given at byte " +
                        std::to_string(written_) + " of a data block of " +
                        std::to_string(data_bytes_),
                    MESHLM_HERE);
  write_all(data, bytes);
  written_ += bytes;
}

void SafetensorsWriter::commit() {
  if (fd_ < 0) throw RankError(in_file() + "committed twice", MESHLM_HERE);
  if (written_ != data_bytes_) {
    size_t t = 0;
    while (t < ends_.size() && ends_[t] <= written_) ++t;
    throw RankError(in_file() + "closed with tensor '" +
                        (t < tensors_.size() ? tensors_[t].name : std::string("?")) +
                        "' incomplete (" + std::to_string(written_) + " of " +
                        std::to_string(data_bytes_) + " data bytes written)",
                    MESHLM_HERE);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    throw RankError(in_file() + "cannot close '" + tmp_->tmp_path() + "': " + std::strerror(errno),
                    MESHLM_HERE);
  tmp_->commit();  // flushed to disk, then renamed
}

}  // namespace meshlm::io
