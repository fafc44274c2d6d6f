#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace meshlm::io {

namespace {

using nlohmann::json;

struct DTypeInfo {
  const char* name;
  size_t size;
};
// Every dtype of the safetensors format.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

uint16_t load_le16(const unsigned char* p) { return uint16_t(p[0] | p[1] << 8); }
uint32_t load_le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t load_le64(const unsigned char* p) {
  return uint64_t(load_le32(p)) | uint64_t(load_le32(p + 4)) << 32;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string range_str(uint64_t begin, uint64_t end) { return fmt::format("[{}, {})", begin, end); }

// The JSON value as a short piece of text for a message.
std::string brief(const json& v) {
  std::string s = v.dump();
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

// A non-negative JSON integer (2.0, -1, "3" and true are not).
bool as_count(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------

size_t safetensors_dtype_size(const std::string& dtype) {
  for (const DTypeInfo& d : kDTypes)
    if (dtype == d.name) return d.size;
  return 0;
}

bool safetensors_dtype_is_float(const std::string& dtype) {
  return dtype == "F32" || dtype == "F16" || dtype == "BF16" || dtype == "F64";
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;  // biased by 15
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;  // inf, or NaN with its payload
  } else if (exp != 0) {
    bits = sign | (exp - 15 + 127) << 23 | mant << 13;
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal mant * 2^-24: shift the leading 1 up to the implicit bit
    // (bit 10); every float32 exponent it needs (down to 2^-24) is normal.
    uint32_t e = 127 - 15 + 1;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | e << 23 | (mant & 0x3ff) << 13;
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(uint16_t h) {
  // bfloat16 is the top half of a float32.
  return std::bit_cast<float>(uint32_t(h) << 16);
}

uint64_t SafetensorsTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // checked when the header was read
  return n;
}

// ---------------------------------------------------------------------------
// SafetensorsFile
// ---------------------------------------------------------------------------

std::string SafetensorsFile::in_file() const { return "safetensors file '" + path_ + "': "; }

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw RankError(in_file() + "cannot open: " + std::strerror(errno), MESHLM_HERE);
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      throw RankError(in_file() + "cannot stat: " + std::strerror(errno), MESHLM_HERE);
    file_size_ = static_cast<uint64_t>(st.st_size);
    if (file_size_ < 8)
      throw RankError(in_file() + "file has " + std::to_string(file_size_) +
                          " bytes; a safetensors file starts with an 8-byte header length",
                      MESHLM_HERE);
    unsigned char len_bytes[8];
    if (::pread(fd_, len_bytes, 8, 0) != 8)
      throw RankError(in_file() + "cannot read the header length: " + std::strerror(errno),
                      MESHLM_HERE);
    const uint64_t n = load_le64(len_bytes);
    if (n > kSafetensorsMaxHeaderBytes)
      throw RankError(in_file() + "header length " + std::to_string(n) +
                          " bytes is absurd (meshlm accepts at most " +
                          std::to_string(kSafetensorsMaxHeaderBytes) +
                          "); is this a safetensors file?",
                      MESHLM_HERE);
    if (n > file_size_ - 8)
      throw RankError(in_file() + "truncated header: the header length says " + std::to_string(n) +
                          " bytes but only " + std::to_string(file_size_ - 8) +
                          " follow the 8-byte length",
                      MESHLM_HERE);
    data_start_ = 8 + n;
    std::string header(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd_, header.data() + got, n - got, static_cast<off_t>(8 + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw RankError(in_file() + "cannot read the header: " +
                            (r < 0 ? std::strerror(errno) : "unexpected end of file"),
                        MESHLM_HERE);
      got += static_cast<size_t>(r);
    }
    parse_header(header);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void SafetensorsFile::parse_header(const std::string& header) {
  json root;
  // The first name the header gives twice (JSON allows it; the last would win).
  std::set<std::string> seen;
  std::string twice;
  const json::parser_callback_t note_duplicates = [&](int depth, json::parse_event_t event,
                                                      json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && twice.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      twice = parsed.get<std::string>();
    return true;
  };
  try {
    root = json::parse(header, note_duplicates);
  } catch (const json::exception& e) {
    // nlohmann quotes the offending bytes; keep the message printable.
    std::string what = e.what();
    for (char& c : what)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    throw RankError(in_file() + "header is not valid JSON: " + what, MESHLM_HERE);
  }
  if (!root.is_object())
    throw RankError(
        in_file() + "header is not a JSON object (it is " + std::string(root.type_name()) + ")",
        MESHLM_HERE);
  if (!twice.empty())
    throw RankError(in_file() + "header names '" + log::printable(twice) + "' twice", MESHLM_HERE);

  const uint64_t data_bytes = file_size_ - data_start_;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        throw RankError(in_file() + "\"__metadata__\" is not a JSON object", MESHLM_HERE);
      for (const auto& [k, v] : entry.items())
        metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string at = in_file() + "tensor '" + name + "'";
    auto fail = [&](const std::string& what) { throw RankError(at + what, MESHLM_HERE); };
    if (!entry.is_object()) fail(": entry is not a JSON object (got " + brief(entry) + ")");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key)) fail(" has no \"" + std::string(key) + "\"");

    SafetensorsTensor t;
    t.name = name;
    const json& dtype = entry["dtype"];
    if (!dtype.is_string()) fail(": \"dtype\" must be a string (got " + brief(dtype) + ")");
    t.dtype = dtype.get<std::string>();
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0)
      fail(" has dtype '" + t.dtype + "' which meshlm cannot read (not a safetensors dtype)");

    const json& shape = entry["shape"];
    if (!shape.is_array())
      fail(": \"shape\" must be an array of non-negative integers (got " + brief(shape) + ")");
    uint64_t bytes = esize;  // product(shape) * esize, overflow-checked
    for (const json& d : shape) {
      uint64_t dim = 0;
      if (!as_count(d, dim) || dim > uint64_t(std::numeric_limits<int64_t>::max()))
        fail(": \"shape\" must be an array of non-negative integers (got " + brief(shape) + ")");
      t.shape.push_back(static_cast<int64_t>(dim));
      if (__builtin_mul_overflow(bytes, dim, &bytes))
        fail(": shape " + brief(shape) + " of dtype " + t.dtype + " is larger than 2^64 bytes");
    }

    const json& offs = entry["data_offsets"];
    if (!offs.is_array() || offs.size() != 2 || !as_count(offs[0], t.begin) ||
        !as_count(offs[1], t.end))
      fail(": \"data_offsets\" must be [begin, end], two non-negative integers (got " +
           brief(offs) + ")");
    if (t.begin > t.end)
      fail(": data_offsets " + range_str(t.begin, t.end) + " end before they begin");
    if (t.end > data_bytes)
      fail(": data_offsets " + range_str(t.begin, t.end) +
           " run past the end of the file (data block is " + std::to_string(data_bytes) +
           " bytes)");
    if (t.end - t.begin != bytes)
      fail(": data_offsets " + range_str(t.begin, t.end) + " hold " +
           std::to_string(t.end - t.begin) + " bytes but shape " + shape_str(t.shape) +
           " of dtype " + t.dtype + " needs " + std::to_string(bytes));
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  // Each byte of the data block belongs to one tensor at most.
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const auto &a = tensors_[i - 1], &b = tensors_[i];
    if (b.begin < a.end)
      throw RankError(in_file() + "tensors '" + a.name + "' " + range_str(a.begin, a.end) +
                          " and '" + b.name + "' " + range_str(b.begin, b.end) + " overlap",
                      MESHLM_HERE);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      file_size_(o.file_size_),
      data_start_(o.data_start_),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = o.file_size_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

const SafetensorsTensor& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw RankError(in_file() + "no tensor '" + name + "'", MESHLM_HERE);
  return tensors_[it->second];
}

void SafetensorsFile::read_f32(const std::string& name, float* out) const {
  read_f32(name, out, 0, info(name).numel());
}

void SafetensorsFile::read_f32(const std::string& name, float* out, uint64_t first,
                               uint64_t count) const {
  const SafetensorsTensor& t = info(name);
  const std::string at = in_file() + "tensor '" + name + "'";
  if (!safetensors_dtype_is_float(t.dtype))
    throw RankError(at + " has dtype '" + t.dtype +
                        "' which meshlm cannot read as float (F32, F16, BF16 and F64 can be)",
                    MESHLM_HERE);
  const uint64_t numel = t.numel();
  if (first > numel || count > numel - first)
    throw RankError(at + ": elements " + range_str(first, first + count) +
                        " are out of range (it has " + std::to_string(numel) + ")",
                    MESHLM_HERE);
  const size_t esize = safetensors_dtype_size(t.dtype);
  // Chunks hold whole elements: kSafetensorsChunkBytes is a multiple of 8.
  const uint64_t per_chunk = kSafetensorsChunkBytes / esize;
  std::vector<unsigned char> buf(static_cast<size_t>(std::min(count, per_chunk) * esize));
  uint64_t offset = data_start_ + t.begin + first * esize;
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, per_chunk);
    size_t len = static_cast<size_t>(n * esize), got = 0;
    while (got < len) {
      ssize_t r = ::pread(fd_, buf.data() + got, len - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        throw RankError(at + ": read failed at byte " + std::to_string(offset + got) + ": " +
                            std::strerror(errno),
                        MESHLM_HERE);
      if (r == 0)
        throw RankError(at + ": unexpected end of file at byte " + std::to_string(offset + got) +
                            " (the file was shorter than its header says; changed since it "
                            "was opened?)",
                        MESHLM_HERE);
      got += static_cast<size_t>(r);
    }
    // safetensors data is little-endian whatever the host.
    const unsigned char* p = buf.data();
    float* o = out + done;
    if (t.dtype == "F32") {
      for (uint64_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(load_le32(p + 4 * i));
    } else if (t.dtype == "F16") {
      for (uint64_t i = 0; i < n; ++i) o[i] = f16_to_f32(load_le16(p + 2 * i));
    } else if (t.dtype == "BF16") {
      for (uint64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(load_le16(p + 2 * i));
    } else {  // F64, rounded to nearest
      for (uint64_t i = 0; i < n; ++i)
        o[i] = static_cast<float>(std::bit_cast<double>(load_le64(p + 8 * i)));
    }
    done += n;
    offset += len;
  }
}

}  // namespace meshlm::io
