#include "io/tokens.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/files.h"
#include "core/rng.h"
#include "io/h5.h"

namespace meshlm::io {

namespace {

std::string in_file(const std::string& path) { return "token file '" + path + "': "; }

uint32_t load_le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t load_le64(const unsigned char* p) {
  return uint64_t(load_le32(p)) | uint64_t(load_le32(p + 4)) << 32;
}
void store_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// pread until `len` bytes are in, or throw naming the file.
void pread_all(int fd, void* buf, size_t len, uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len > 0) {
    ssize_t r = ::pread(fd, p, len, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw RankError(in_file(path) + "read failed at byte " + std::to_string(offset) + ": " +
                          std::strerror(errno),
                      MESHLM_HERE);
    if (r == 0)
      throw RankError(in_file(path) + "unexpected end of file at byte " + std::to_string(offset),
                      MESHLM_HERE);
    p += r;
    len -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

[[noreturn]] void bad_id(const std::string& path, uint64_t position, int64_t value,
                         const std::string& why) {
  throw RankError(in_file(path) + "token at position " + std::to_string(position) + " has id " +
                      std::to_string(value) + " (" + why + ")",
                  MESHLM_HERE);
}

}  // namespace

// ---------------------------------------------------------------------------
// TokenReader
// ---------------------------------------------------------------------------

struct TokenReader::Impl {
  std::string path;
  std::string dataset = kTokensDataset;  // HDF5: the dataset read
  bool hdf5 = false;
  uint64_t n_tokens = 0;
  int bytes_per_token = 0;
  int64_t vocab_size_attr = 0;
  int64_t max_id_attr = -1;
  bool is_signed = false;  // HDF5 only: int16/int32 stored ids (negative ones are rejected)
  h5::File file;           // HDF5
  h5::Dataset dset;        // HDF5: `dataset`
  int fd = -1;             // raw

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  void open_raw();
  void open_hdf5();
};

void TokenReader::Impl::open_raw() {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw RankError(in_file(path) + "cannot stat: " + std::strerror(errno), MESHLM_HERE);
  uint64_t actual = static_cast<uint64_t>(st.st_size);
  if (actual < kRawTokensHeaderBytes)
    throw RankError(in_file(path) + "truncated header: file has " + std::to_string(actual) +
                        " bytes, the header alone needs " +
                        std::to_string(kRawTokensHeaderBytes),
                    MESHLM_HERE);
  unsigned char header[kRawTokensHeaderBytes];
  pread_all(fd, header, sizeof header, 0, path);
  uint32_t version = load_le32(header + 8);
  uint32_t bpt = load_le32(header + 12);
  n_tokens = load_le64(header + 16);
  if (version != kTokensFormatVersion)
    throw RankError(in_file(path) + "raw format_version " + std::to_string(version) +
                        " is not supported (this meshlm reads " +
                        std::to_string(kTokensFormatVersion) + ")",
                    MESHLM_HERE);
  if (bpt != 2 && bpt != 4)
    throw RankError(in_file(path) + "bytes_per_token is " + std::to_string(bpt) +
                        "; must be 2 or 4",
                    MESHLM_HERE);
  bytes_per_token = static_cast<int>(bpt);
  uint64_t max_tokens = (std::numeric_limits<uint64_t>::max() - kRawTokensHeaderBytes) / bpt;
  if (n_tokens > max_tokens)
    throw RankError(in_file(path) + "header claims an impossible " + std::to_string(n_tokens) +
                        " tokens",
                    MESHLM_HERE);
  uint64_t expected = kRawTokensHeaderBytes + n_tokens * bpt;
  if (actual != expected)
    throw RankError(in_file(path) + (actual < expected ? "truncated: " : "trailing bytes: ") +
                        "file has " + std::to_string(actual) + " bytes, expected " +
                        std::to_string(expected) + " (24-byte header + " +
                        std::to_string(n_tokens) + " tokens x " + std::to_string(bpt) +
                        " bytes)",
                    MESHLM_HERE);
}

void TokenReader::Impl::open_hdf5() {
  file = h5::open_file(path);
  const std::string named = "dataset '" + dataset + "'";
  if (!h5::exists(file, dataset))
    throw RankError(in_file(path) + "no " + named, MESHLM_HERE);
  dset = h5::open_dataset(file, dataset);
  h5::Datatype type(H5Dget_type(dset));
  size_t bytes = H5Tget_size(type);
  if (H5Tget_class(type) != H5T_INTEGER || (bytes != 2 && bytes != 4))
    throw RankError(in_file(path) + named + " is " + h5::type_name(type) +
                        "; token ids must be a 2- or 4-byte integer type (uint16 or uint32)",
                    MESHLM_HERE);
  std::vector<hsize_t> dims = h5::shape(dset);
  if (dims.size() != 1) {
    std::string s;
    for (hsize_t d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
    throw RankError(in_file(path) + named + " has shape (" + s + "); it must be 1-D",
                    MESHLM_HERE);
  }
  n_tokens = dims[0];
  bytes_per_token = static_cast<int>(bytes);
  is_signed = H5Tget_sign(type) != H5T_SGN_NONE;
  if (h5::has_attr(file, "format_version")) {
    const int64_t version = h5::read_scalar_attr<int64_t>(file, "format_version");
    if (version != kTokensFormatVersion)
      throw RankError(in_file(path) + "format_version " + std::to_string(version) +
                          "; this meshlm reads version " + std::to_string(kTokensFormatVersion),
                      MESHLM_HERE);
  }
  // The root's max_id bounds "tokens"; it may say nothing of a held-out part.
  if (h5::has_attr(dset, "max_id"))
    max_id_attr = h5::read_scalar_attr<int64_t>(dset, "max_id");
  else if (dataset == kTokensDataset && h5::has_attr(file, "max_id"))
    max_id_attr = h5::read_scalar_attr<int64_t>(file, "max_id");
  if (h5::has_attr(file, "vocab_size"))
    vocab_size_attr = h5::read_scalar_attr<int64_t>(file, "vocab_size");
  else if (h5::has_attr(dset, "vocab_size"))
    vocab_size_attr = h5::read_scalar_attr<int64_t>(dset, "vocab_size");
  // Attributes that say what no token file can be are a damaged file.
  const bool has_vocab = h5::has_attr(file, "vocab_size") || h5::has_attr(dset, "vocab_size");
  if (has_vocab && vocab_size_attr < 1)
    throw RankError(in_file(path) + "attribute vocab_size = " + std::to_string(vocab_size_attr) +
                        " is not a vocabulary size",
                    MESHLM_HERE);
  const bool has_max = h5::has_attr(dset, "max_id") ||
                       (dataset == kTokensDataset && h5::has_attr(file, "max_id"));
  if (has_max && max_id_attr < 0)
    throw RankError(in_file(path) + "attribute max_id = " + std::to_string(max_id_attr) +
                        " is not a token id",
                    MESHLM_HERE);
}

TokenReader TokenReader::open(const std::string& path, const std::string& dataset) {
  h5::LibraryLock lock;
  if (const std::string kind = non_regular_kind(path); !kind.empty())
    throw RankError(in_file(path) + "is " + kind + ", not a token file", MESHLM_HERE);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->dataset = dataset;
  impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl->fd < 0)
    throw RankError(in_file(path) + "cannot open: " + std::strerror(errno), MESHLM_HERE);

  char magic[8] = {};
  ssize_t got = ::pread(impl->fd, magic, sizeof magic, 0);
  if (got == sizeof magic && std::memcmp(magic, kRawTokensMagic, 8) == 0) {
    if (dataset != kTokensDataset)
      throw RankError(in_file(path) + "a raw token file holds one array of tokens, no dataset '" +
                          dataset + "'",
                      MESHLM_HERE);
    impl->open_raw();
  } else if (h5::is_hdf5_file(path)) {
    ::close(impl->fd);  // HDF5 opens the file itself
    impl->fd = -1;
    impl->hdf5 = true;
    impl->open_hdf5();
  } else {
    throw RankError(in_file(path) + "not an HDF5 token file nor a meshlm raw token file",
                    MESHLM_HERE);
  }
  return TokenReader(std::move(impl));
}

TokenReader::TokenReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenReader::TokenReader(TokenReader&&) noexcept = default;
TokenReader& TokenReader::operator=(TokenReader&&) noexcept = default;
TokenReader::~TokenReader() {
  h5::LibraryLock lock;  // closing the HDF5 file enters the library
  impl_.reset();
}

uint64_t TokenReader::size() const { return impl_->n_tokens; }
int TokenReader::bytes_per_token() const { return impl_->bytes_per_token; }
int64_t TokenReader::vocab_size_attr() const { return impl_->vocab_size_attr; }
int64_t TokenReader::max_id_attr() const { return impl_->max_id_attr; }

namespace {

// Reads tokens [start, start + count) a chunk at a time and hands each chunk
// to visit(ids, n, position of ids[0]) until it returns true (stop).
template <class Visit>
void for_each_chunk(const TokenReader& r, uint64_t start, uint64_t count, Visit&& visit) {
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<int32_t> buf(std::min(count, kChunk));
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(kChunk, count - done);
    r.read(start + done, n, buf.data());
    if (visit(buf.data(), n, start + done)) return;
    done += n;
  }
}

}  // namespace

uint64_t TokenReader::first_at_least(uint64_t start, uint64_t count, uint64_t limit) const {
  uint64_t found = UINT64_MAX;
  for_each_chunk(*this, start, count, [&](const int32_t* ids, uint64_t n, uint64_t at) {
    for (uint64_t i = 0; i < n; ++i)
      if (static_cast<uint32_t>(ids[i]) >= limit) {
        found = at + i;
        return true;
      }
    return false;
  });
  return found;
}

uint32_t TokenReader::max_id(uint64_t start, uint64_t count) const {
  uint32_t m = 0;
  for_each_chunk(*this, start, count, [&](const int32_t* ids, uint64_t n, uint64_t) {
    for (uint64_t i = 0; i < n; ++i) m = std::max(m, static_cast<uint32_t>(ids[i]));
    return false;
  });
  return m;
}

bool TokenReader::is_hdf5() const { return impl_->hdf5; }
const std::string& TokenReader::path() const { return impl_->path; }
const std::string& TokenReader::dataset() const { return impl_->dataset; }

bool TokenReader::has_dataset(const std::string& path, const std::string& dataset) {
  h5::LibraryLock lock;
  if (!non_regular_kind(path).empty() || !h5::is_hdf5_file(path)) return false;
  try {
    h5::File file = h5::open_file(path);
    return h5::exists(file, dataset);
  } catch (const std::exception&) {
    return false;
  }
}

void TokenReader::read(uint64_t start, uint64_t count, int32_t* out) const {
  h5::LibraryLock lock;  // a checkpoint may be written meanwhile (checkpoint.async)
  const Impl& f = *impl_;
  if (start > f.n_tokens || count > f.n_tokens - start)
    throw RankError(in_file(f.path) + "read of tokens [" + std::to_string(start) + ", " +
                        std::to_string(start + count) + ") is past the end (" +
                        std::to_string(f.n_tokens) + " tokens)",
                    MESHLM_HERE);
  if (count == 0) return;

  if (f.hdf5) {
    // Signed ids are read as int32 and must not be negative; unsigned ones
    // are read as uint32 into the same bytes (int32_t and uint32_t may alias)
    // and must fit in int32.
    if (f.is_signed) {
      h5::read_rows(f.dset, start, count, H5T_NATIVE_INT32, out);
      for (uint64_t i = 0; i < count; ++i)
        if (out[i] < 0) bad_id(f.path, start + i, out[i], "negative");
    } else {
      auto* u = reinterpret_cast<uint32_t*>(out);
      h5::read_rows(f.dset, start, count, H5T_NATIVE_UINT32, u);
      for (uint64_t i = 0; i < count; ++i)
        if (u[i] > uint32_t(std::numeric_limits<int32_t>::max()))
          bad_id(f.path, start + i, u[i], "larger than int32");
    }
    return;
  }

  // Raw: read the little-endian bytes into the front of `out`, then widen
  // in place from the back. Going backward, out[i] (bytes 4i..4i+3) only
  // overwrites bytes of ids >= i, which are already converted.
  const int bpt = f.bytes_per_token;
  auto* bytes = reinterpret_cast<unsigned char*>(out);
  pread_all(f.fd, bytes, count * bpt, kRawTokensHeaderBytes + start * bpt, f.path);
  for (uint64_t i = count; i-- > 0;) {
    const unsigned char* p = bytes + i * bpt;
    uint32_t v = bpt == 2 ? uint32_t(p[0]) | uint32_t(p[1]) << 8 : load_le32(p);
    if (v > uint32_t(std::numeric_limits<int32_t>::max()))
      bad_id(f.path, start + i, v, "larger than int32");
    out[i] = static_cast<int32_t>(v);
  }
}

// ---------------------------------------------------------------------------
// Shuffled order
// ---------------------------------------------------------------------------

void shuffled_order(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t* out) {
  Rng epoch_seed(Rng(seed).next_u64() + epoch);
  Rng rng(epoch_seed.next_u64());  // decorrelates neighbouring epochs
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(i);
  for (uint64_t i = n; i-- > 1;) std::swap(out[i], out[rng.below(i + 1)]);
}

// ---------------------------------------------------------------------------
// BatchLoader
// ---------------------------------------------------------------------------

BatchLoader::BatchLoader(const TokenReader& reader, int B, int T, bool shuffle, uint64_t seed,
                         int vocab_size, int dp_rank, int dp_size)
    : reader_(&reader), B_(B), T_(T), vocab_size_(vocab_size), dp_rank_(dp_rank),
      dp_size_(dp_size), shuffle_(shuffle), seed_(seed) {
  const std::string& path = reader.path();
  if (B < 1 || T < 1 || vocab_size < 1)
    throw RankError(in_file(path) + "batch loader needs B, T, vocab_size >= 1 (got B=" +
                        std::to_string(B) + ", T=" + std::to_string(T) +
                        ", vocab_size=" + std::to_string(vocab_size) + ")",
                    MESHLM_HERE);
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
    throw RankError(in_file(path) + "batch loader: dp_rank " + std::to_string(dp_rank) +
                        " is not in [0, dp_size=" + std::to_string(dp_size) + ")",
                    MESHLM_HERE);
  uint64_t n = reader.size();
  if (n < static_cast<uint64_t>(T) + 1)
    throw RankError("token file '" + path + "' has " + std::to_string(n) + " tokens; seq_len " +
                        std::to_string(T) + " needs at least " + std::to_string(T + 1),
                    MESHLM_HERE);
  n_windows_ = (n - 1) / static_cast<uint64_t>(T);
  if (shuffle) {
    if (n_windows_ > std::numeric_limits<uint32_t>::max())
      throw RankError(in_file(path) + std::to_string(n_windows_) +
                          " windows are too many to shuffle (at most 2^32 - 1); split the file",
                      MESHLM_HERE);
    order_ = Buffer(n_windows_ * sizeof(uint32_t), MemCategory::other, "data order");
  }
  window_.resize(static_cast<size_t>(T) + 1);
}

uint64_t BatchLoader::window_at(uint64_t epoch, uint64_t pos) {
  if (!shuffle_) return pos;
  if (order_epoch_ != epoch) {
    shuffled_order(seed_, epoch, n_windows_, order_.as<uint32_t>());
    order_epoch_ = epoch;
  }
  return order_.as<uint32_t>()[pos];
}

void BatchLoader::next(int32_t* inputs, int32_t* targets) {
  const uint64_t T = static_cast<uint64_t>(T_);
  // Walk the stream from the cursor: skip the blocks of lower DP ranks,
  // take B windows, then move the cursor past the whole step.
  uint64_t epoch = cursor_.epoch;
  uint64_t pos = cursor_.position;
  auto advance = [&](uint64_t k) {
    pos += k;
    epoch += pos / n_windows_;
    pos %= n_windows_;
  };
  advance(static_cast<uint64_t>(dp_rank_) * B_);
  for (int b = 0; b < B_; ++b) {
    uint64_t first = window_at(epoch, pos) * T;
    reader_->read(first, T + 1, window_.data());
    for (uint64_t i = 0; i <= T; ++i)
      if (window_[i] >= vocab_size_)
        bad_id(reader_->path(), first + i, window_[i],
               ">= vocab_size " + std::to_string(vocab_size_));
    std::copy_n(window_.begin(), T, inputs + b * T);
    std::copy_n(window_.begin() + 1, T, targets + b * T);
    advance(1);
  }
  uint64_t step = static_cast<uint64_t>(B_) * dp_size_;
  uint64_t p = cursor_.position + step;
  cursor_.epoch += p / n_windows_;
  cursor_.position = p % n_windows_;
}

void BatchLoader::set_cursor(const DataCursor& c) {
  if (c.position >= n_windows_)
    throw RankError(in_file(reader_->path()) + "data cursor position " +
                        std::to_string(c.position) + " is out of range (" +
                        std::to_string(n_windows_) + " windows of seq_len " +
                        std::to_string(T_) + ")",
                    MESHLM_HERE);
  cursor_ = c;
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

namespace {

void check_ids_below(const std::string& path, const std::vector<uint32_t>& ids, uint64_t limit,
                     const std::string& why) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= limit)
      throw RankError("cannot write token file '" + path + "': token at position " +
                          std::to_string(i) + " has id " + std::to_string(ids[i]) + " (" + why +
                          ")",
                      MESHLM_HERE);
}

struct CloseFile {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

bool is_token_file_h5(const std::string& path) {
  if (!non_regular_kind(path).empty() || !h5::is_hdf5_file(path)) return false;
  try {
    h5::File file = h5::open_file(path);
    if (!h5::exists(file, kTokensDataset) || !h5::has_attr(file, "vocab_size") ||
        !h5::has_attr(file, "format_version"))
      return false;
    // Nothing meshlm did not write: a dataset or group of another tool's
    // would be lost with the file.
    H5G_info_t info;
    if (H5Gget_info(file, &info) < 0) return false;
    return info.nlinks == 1 + (h5::exists(file, kValTokensDataset) ? 1u : 0u);
  } catch (const std::exception&) {
    return false;
  }
}

void check_replaceable_token_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !is_token_file_h5(path))
    throw RankError("token file '" + path + "' exists and is not a meshlm token file (an HDF5 "
                    "file of /tokens, and /val_tokens, with the root attributes vocab_size and "
                    "format_version, nothing else); meshlm replaces only its own: remove it or "
                    "name another",
                    MESHLM_HERE);
}

void write_tokens_h5(const std::string& path, const std::vector<uint32_t>& ids, int vocab_size) {
  if (vocab_size < 1)
    throw RankError("cannot write token file '" + path + "': vocab_size " +
                        std::to_string(vocab_size) + " must be >= 1",
                    MESHLM_HERE);
  check_ids_below(path, ids, static_cast<uint64_t>(vocab_size),
                  ">= vocab_size " + std::to_string(vocab_size));

  h5::AtomicWrite out(path);
  h5::File file = h5::create_file(out.tmp_path());
  hid_t file_type = vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
  h5::write_dataset_raw(file, "tokens", file_type, H5T_NATIVE_UINT32, ids.data(),
                        {static_cast<hsize_t>(ids.size())});
  h5::write_scalar_attr<int64_t>(file, "vocab_size", vocab_size);
  uint32_t max_id = 0;
  for (uint32_t id : ids) max_id = std::max(max_id, id);
  h5::write_scalar_attr<int64_t>(file, "max_id", max_id);
  h5::write_scalar_attr<int32_t>(file, "format_version", kTokensFormatVersion);
  h5::close_file(file, out.tmp_path());
  out.commit();
}

void write_tokens_raw(const std::string& path, const std::vector<uint32_t>& ids,
                      int bytes_per_token) {
  if (bytes_per_token != 2 && bytes_per_token != 4)
    throw RankError("cannot write token file '" + path + "': bytes_per_token " +
                        std::to_string(bytes_per_token) + " must be 2 or 4",
                    MESHLM_HERE);
  if (bytes_per_token == 2) check_ids_below(path, ids, 65536, "does not fit in 2 bytes");

  h5::AtomicWrite out(path);
  std::unique_ptr<std::FILE, CloseFile> f(std::fopen(out.tmp_path().c_str(), "wb"));
  if (!f)
    throw RankError("cannot create token file '" + out.tmp_path() + "': " +
                        std::strerror(errno),
                    MESHLM_HERE);
  auto put = [&](const unsigned char* data, size_t len) {
    if (std::fwrite(data, 1, len, f.get()) != len)
      throw RankError("cannot write token file '" + out.tmp_path() + "': " +
                          std::strerror(errno),
                      MESHLM_HERE);
  };

  unsigned char header[kRawTokensHeaderBytes];
  std::memcpy(header, kRawTokensMagic, 8);
  store_le(header + 8, kTokensFormatVersion, 4);
  store_le(header + 12, static_cast<uint64_t>(bytes_per_token), 4);
  store_le(header + 16, ids.size(), 8);
  put(header, sizeof header);

  constexpr size_t kChunk = 1 << 16;  // ids encoded per fwrite
  std::vector<unsigned char> buf(kChunk * bytes_per_token);
  for (size_t begin = 0; begin < ids.size(); begin += kChunk) {
    size_t n = std::min(kChunk, ids.size() - begin);
    for (size_t i = 0; i < n; ++i)
      store_le(buf.data() + i * bytes_per_token, ids[begin + i], bytes_per_token);
    put(buf.data(), n * bytes_per_token);
  }
  if (std::fclose(f.release()) != 0)
    throw RankError("cannot write token file '" + out.tmp_path() + "': " +
                        std::strerror(errno),
                    MESHLM_HERE);
  out.commit();
}

uint64_t tokenize_bytes(const std::string& text_path, const std::string& out_path) {
  if (const std::string kind = non_regular_kind(text_path); !kind.empty())
    throw RankError("text file '" + text_path + "' is " + kind + ", not a text file", MESHLM_HERE);
  if (same_file(text_path, out_path))
    throw RankError("the text file and the token file are the same file, '" + text_path +
                        "': meshlm will not write over its input",
                    MESHLM_HERE);
  check_replaceable_token_file(out_path);
  std::ifstream in(text_path, std::ios::binary);
  if (!in)
    throw RankError("text file '" + text_path + "': cannot open: " + std::strerror(errno),
                    MESHLM_HERE);
  // Holds the whole text as 4-byte ids: a tool for small corpora and tests.
  std::vector<uint32_t> ids;
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i)
      ids.push_back(static_cast<unsigned char>(chunk[static_cast<size_t>(i)]));
  }
  if (in.bad())
    throw RankError("text file '" + text_path + "': read failed", MESHLM_HERE);
  if (ids.empty()) throw RankError("text file '" + text_path + "' is empty", MESHLM_HERE);
  write_tokens_h5(out_path, ids, 256);
  return ids.size();
}

}  // namespace meshlm::io
