// The quantized-model cache (io/quant_cache.h) and the hashes behind its key
// (io/hash.h): round trips, every way a cache file can be wrong, atomic
// replacement, and XXH3 values checked against xxhsum.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/h5.h"
#include "io/hash.h"
#include "io/quant_cache.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using namespace meshlm;
using namespace meshlm::io;

namespace {

// Bytes of the store that no array covers: a read must leave them alone.
constexpr uint8_t kUntouched = 0xAA;

// A small model: two nf4 tensors (4-bit data, int8 absmax per 64 weights,
// float32 second-level absmax and offset), an int8 tensor and a degenerate
// one (no shape, an empty array). Regions are 16-byte aligned with gaps.
struct Model {
  std::vector<CacheTensor> tensors;
  std::vector<uint8_t> store;
};

Model make_model(uint64_t seed) {
  Model m;
  size_t at = 8;  // a gap before the first region too
  auto array = [&at](const std::string& name, DType type, size_t count) {
    CacheArray a{name, type, count, at};
    at += count * dtype_size(type);
    at = (at + 16 + 15) / 16 * 16;
    return a;
  };
  auto nf4 = [&](const std::string& name, int64_t rows, int64_t cols) {
    size_t n = static_cast<size_t>(rows * cols);
    return CacheTensor{name, {rows, cols}, "nf4",
                       {array("data", DType::u8, n / 2), array("absmax", DType::i8, n / 64),
                        array("absmax2", DType::f32, (n / 64 + 255) / 256),
                        array("offset", DType::f32, 1)}};
  };
  m.tensors.push_back(nf4("wte", 96, 64));
  m.tensors.push_back(nf4("h.0.attn.c_attn.weight", 64, 192));
  m.tensors.push_back(CacheTensor{"h.0.mlp.c_fc.weight", {64, 256}, "int8",
                                  {array("data", DType::i8, 64 * 256),
                                   array("absmax", DType::f32, 256)}});
  m.tensors.push_back(CacheTensor{"empty", {}, "none", {array("data", DType::u8, 0)}});
  m.store.assign(at, kUntouched);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(-4.0f, 4.0f);
  for (const CacheTensor& t : m.tensors)
    for (const CacheArray& a : t.arrays)
      if (a.type == DType::f32) {  // finite floats: the reader refuses others
        for (size_t i = 0; i < a.count; ++i) {
          const float v = scale(rng);
          std::memcpy(&m.store[a.offset + i * sizeof(float)], &v, sizeof(float));
        }
      } else {
        for (size_t i = 0; i < a.count * dtype_size(a.type); ++i)
          m.store[a.offset + i] = static_cast<uint8_t>(rng());
      }
  return m;
}

CacheKey make_key() {
  return CacheKey{xxh3_128_hex("source bytes", 12),
                  {{"quant_type", "nf4"}, {"block", "64"}, {"absmax_block", "256"}}};
}

// Byte offset in the file of a contiguous dataset's data.
haddr_t data_offset(const std::string& path, const std::string& dset) {
  h5::File f = h5::open_file(path);
  h5::Dataset d = h5::open_dataset(f, dset);
  return H5Dget_offset(d);
}

void flip_byte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text_file(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary) << s;
}

class QuantCacheTest : public ScratchDirTest {
protected:
  // Reads `path` with the layout of `m` into a fresh store.
  CacheLookup read(const std::string& path, const Model& m, const CacheKey& key,
                   std::vector<uint8_t>* out = nullptr) {
    std::vector<uint8_t> store(m.store.size(), kUntouched);
    CacheLookup r = read_quant_cache(path, key, m.tensors, store.data(), store.size());
    if (out) *out = std::move(store);
    return r;
  }
};

}  // namespace

// ---------------------------------------------------------------------------
// Hashes
// ---------------------------------------------------------------------------

TEST(Hash, KnownValues) {
  // Reference values from `xxhsum -H2 FILE` (XXH3-128) and `xxhsum -H3 FILE`
  // (XXH3-64) of Debian's xxhash 0.8.1, on files holding "" and "abc".
  EXPECT_EQ(xxh3_128_hex("", 0), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(xxh3_128_hex("abc", 3), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(xxh3_64("", 0), 0x2d06800538d394c2ull);
  EXPECT_EQ(xxh3_64("abc", 3), 0x78af5f94892f3950ull);
  EXPECT_EQ(Xxh3_128().hex(), "99aa06d3014798d86001c324468d497f");
}

TEST(Hash, StreamingEqualsOneShot) {
  std::string s(10000, '\0');
  std::mt19937 rng(7);
  for (char& c : s) c = static_cast<char>(rng());
  Xxh3_128 h128;
  Xxh3_64 h64;
  for (size_t at = 0, step = 1; at < s.size(); at += step, step = step * 3 + 1) {
    std::string_view piece = std::string_view(s).substr(at, step);
    h128.update(piece);
    h64.update(piece.data(), piece.size());
  }
  EXPECT_EQ(h128.hex(), xxh3_128_hex(s.data(), s.size()));
  EXPECT_EQ(h64.value(), xxh3_64(s.data(), s.size()));
}

using HashFileTest = ScratchDirTest;

TEST_F(HashFileTest, FileEqualsBytesAroundTheChunkBoundary) {
  const size_t c = kHashChunkBytes;
  std::mt19937_64 rng(3);
  for (size_t size : {size_t{0}, size_t{1}, c - 1, c, c + 1, 2 * c + 7}) {
    std::string bytes(size, '\0');
    for (char& ch : bytes) ch = static_cast<char>(rng());
    std::string path = file("f.bin");
    write_text_file(path, bytes);
    size_t calls = 0, last_done = 0, last_total = 0;
    std::string h = xxh3_128_file(path, [&](size_t done, size_t total) {
      EXPECT_GT(done, last_done);
      ++calls;
      last_done = done;
      last_total = total;
    });
    EXPECT_EQ(h, xxh3_128_hex(bytes.data(), bytes.size())) << size;
    EXPECT_EQ(calls, (size + c - 1) / c) << size;
    if (size > 0) {
      EXPECT_EQ(last_done, size);
      EXPECT_EQ(last_total, size);
    }
  }
}

TEST_F(HashFileTest, UnreadableFileNamesIt) {
  std::string path = file("nope.bin");
  try {
    xxh3_128_file(path);
    FAIL() << "no exception";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  try {
    xxh3_128_file(dir_.string());  // a directory opens but cannot be read
    FAIL() << "no exception";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find(dir_.string()), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

TEST(CacheKey, DependsOnSourceSettingsButNotTheirOrder) {
  CacheKey k = make_key();
  EXPECT_EQ(k.key().size(), 32u);
  CacheKey reordered = k;
  std::reverse(reordered.settings.begin(), reordered.settings.end());
  EXPECT_EQ(reordered.key(), k.key());
  CacheKey other_source = k;
  other_source.source_hash = xxh3_128_hex("other", 5);
  EXPECT_NE(other_source.key(), k.key());
  CacheKey other_value = k;
  other_value.settings[1].second = "128";
  EXPECT_NE(other_value.key(), k.key());
  // Fields are length-prefixed: moving a character between name and value
  // changes the key.
  CacheKey a{k.source_hash, {{"ab", "c"}}}, b{k.source_hash, {{"a", "bc"}}};
  EXPECT_NE(a.key(), b.key());
  CacheKey extra = k;
  extra.settings.push_back({"double_quant", "1"});
  EXPECT_NE(extra.key(), k.key());
}

TEST(CacheKey, BadSettingNamesThrow) {
  CacheKey dup{"x", {{"block", "64"}, {"block", "128"}}};
  EXPECT_THROW(dup.key(), RankError);
  CacheKey reserved{"x", {{"source_hash", "y"}}};
  EXPECT_THROW(reserved.key(), RankError);
}

// ---------------------------------------------------------------------------
// Reading back
// ---------------------------------------------------------------------------

TEST_F(QuantCacheTest, RoundTrip) {
  Model m = make_model(1);
  std::string path = file("cache.h5");
  size_t calls = 0, last = 0, total_seen = 0;
  write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size(),
                    [&](size_t done, size_t total) {
                      EXPECT_GE(done, last);
                      ++calls;
                      last = done;
                      total_seen = total;
                    });
  EXPECT_EQ(calls, 11u);  // one per array
  EXPECT_EQ(last, total_seen);

  std::vector<uint8_t> store;
  CacheLookup r = read(path, m, make_key(), &store);
  ASSERT_EQ(r.status, CacheStatus::hit) << r.reason;
  // Every byte equal, the gaps between regions included: those were never
  // touched (kUntouched in both).
  EXPECT_TRUE(store == m.store);
  EXPECT_EQ(listing(), std::vector<std::string>{"cache.h5"});
}

TEST_F(QuantCacheTest, FileLayoutAsDocumented) {
  Model m = make_model(2);
  std::string path = file("cache.h5");
  CacheKey key = make_key();
  write_quant_cache(path, key, m.tensors, m.store.data(), m.store.size());

  h5::File f = h5::open_file(path);
  h5::Group meta(H5Gopen2(f, "meta", H5P_DEFAULT));
  ASSERT_TRUE(meta.valid());
  EXPECT_EQ(h5::read_scalar_attr<int32_t>(meta, "format_version"), kQuantCacheFormatVersion);
  EXPECT_EQ(h5::read_string_attr(meta, "key"), key.key());
  EXPECT_EQ(h5::read_string_attr(meta, "source_hash"), key.source_hash);
  EXPECT_EQ(h5::read_string_attr(meta, "quant_type"), "nf4");
  EXPECT_EQ(h5::read_string_attr(meta, "absmax_block"), "256");

  // The dotted name is one link below /q, as h5py users will look it up.
  const CacheTensor& t = m.tensors[1];
  ASSERT_EQ(t.name, "h.0.attn.c_attn.weight");
  h5::Group q(H5Gopen2(f, "q", H5P_DEFAULT));
  EXPECT_GT(H5Lexists(q, "h.0.attn.c_attn.weight", H5P_DEFAULT), 0);
  h5::Group g(H5Gopen2(q, "h.0.attn.c_attn.weight", H5P_DEFAULT));
  ASSERT_TRUE(g.valid());
  EXPECT_EQ(h5::read_string_attr(g, "format"), "nf4");
  {
    h5::Attribute a(H5Aopen(g, "shape", H5P_DEFAULT));
    h5::Datatype type(H5Aget_type(a));
    EXPECT_GT(H5Tequal(type, H5T_NATIVE_INT64), 0);
    int64_t shape[2] = {};
    ASSERT_GE(H5Aread(a, H5T_NATIVE_INT64, shape), 0);
    EXPECT_EQ(shape[0], 64);
    EXPECT_EQ(shape[1], 192);
  }
  std::string concatenated;
  for (const CacheArray& a : t.arrays) {
    h5::Dataset d = h5::open_dataset(g, a.name);
    h5::Datatype type(H5Dget_type(d));
    hid_t expected = a.type == DType::u8   ? H5T_NATIVE_UINT8
                     : a.type == DType::i8 ? H5T_NATIVE_INT8
                                               : H5T_NATIVE_FLOAT;
    EXPECT_GT(H5Tequal(type, expected), 0) << a.name;
    EXPECT_EQ(h5::shape(d), std::vector<hsize_t>{a.count}) << a.name;
    concatenated.append(reinterpret_cast<const char*>(m.store.data() + a.offset),
                        a.count * dtype_size(a.type));
  }
  EXPECT_EQ(h5::read_scalar_attr<uint64_t>(g, "xxh3_64"),
            xxh3_64(concatenated.data(), concatenated.size()));

  // Members listed in creation order (as h5py iterates them): tensors in the
  // table's order, arrays in checksum order.
  auto by_creation = [](hid_t group) {
    std::vector<std::string> names;
    H5Literate(group, H5_INDEX_CRT_ORDER, H5_ITER_INC, nullptr,
                [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
                  static_cast<std::vector<std::string>*>(out)->push_back(name);
                  return 0;
                },
                &names);
    return names;
  };
  std::vector<std::string> tensor_names, array_names;
  for (const CacheTensor& x : m.tensors) tensor_names.push_back(x.name);
  for (const CacheArray& a : t.arrays) array_names.push_back(a.name);
  EXPECT_EQ(by_creation(q), tensor_names);
  EXPECT_EQ(by_creation(g), array_names);
}

TEST_F(QuantCacheTest, MissingFile) {
  Model m = make_model(1);
  std::string path = file("none.h5");
  CacheLookup r = read(path, m, make_key());
  EXPECT_EQ(r.status, CacheStatus::missing);
  EXPECT_NE(r.reason.find(path), std::string::npos) << r.reason;
}

TEST_F(QuantCacheTest, OtherSourceIsDifferentKey) {
  Model m = make_model(1);
  std::string path = file("cache.h5");
  write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
  CacheKey other = make_key();
  other.source_hash = xxh3_128_hex("other source", 12);
  CacheLookup r = read(path, m, other);
  EXPECT_EQ(r.status, CacheStatus::different_key) << r.reason;
  EXPECT_NE(r.reason.find("another source"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find(make_key().source_hash), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find(other.source_hash), std::string::npos) << r.reason;
}

TEST_F(QuantCacheTest, OtherSettingIsDifferentKey) {
  Model m = make_model(1);
  std::string path = file("cache.h5");
  write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());

  CacheKey other = make_key();
  other.settings[1].second = "128";
  CacheLookup r = read(path, m, other);
  EXPECT_EQ(r.status, CacheStatus::different_key) << r.reason;
  EXPECT_NE(r.reason.find("block = 64, not 128"), std::string::npos) << r.reason;

  CacheKey extra = make_key();
  extra.settings.push_back({"double_quant", "1"});
  r = read(path, m, extra);
  EXPECT_EQ(r.status, CacheStatus::different_key) << r.reason;
  EXPECT_NE(r.reason.find("without the setting double_quant"), std::string::npos) << r.reason;

  CacheKey fewer = make_key();
  fewer.settings.pop_back();
  r = read(path, m, fewer);
  EXPECT_EQ(r.status, CacheStatus::different_key) << r.reason;
  EXPECT_NE(r.reason.find("extra setting absmax_block = 256"), std::string::npos) << r.reason;
}

TEST_F(QuantCacheTest, FlippedDataByteIsCorruptNamingTheTensor) {
  Model m = make_model(3);
  std::string path = file("cache.h5");
  for (const CacheTensor& t : m.tensors) {
    for (const CacheArray& a : t.arrays) {
      if (a.count == 0) continue;
      write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
      haddr_t at = data_offset(path, "q/" + t.name + "/" + a.name);
      ASSERT_NE(at, HADDR_UNDEF) << t.name << "/" << a.name;
      flip_byte(path, at + (a.count * dtype_size(a.type)) / 2);
      CacheLookup r = read(path, m, make_key());
      EXPECT_EQ(r.status, CacheStatus::corrupt) << t.name << "/" << a.name << ": " << r.reason;
      EXPECT_NE(r.reason.find("'" + t.name + "'"), std::string::npos) << r.reason;
      EXPECT_NE(r.reason.find("checksum"), std::string::npos) << r.reason;
    }
  }
}

// A cache whose checksums hold but whose scales are not finite (written by
// something other than meshlm's quantizer) is corrupt, naming the tensor,
// the array and the element: its weights would be NaN or infinite.
TEST_F(QuantCacheTest, NonFiniteScalesAreCorrupt) {
  const Model clean = make_model(4);
  struct Poison {
    size_t tensor;
    const char* array;
    size_t element;
    float value;
    const char* words;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (const Poison& p :
       {Poison{0, "absmax2", 0, std::nanf(""), "tensor 'wte' array 'absmax2' holds NaN at element 0"},
        Poison{1, "offset", 0, -inf, "tensor 'h.0.attn.c_attn.weight' array 'offset' holds infinity"},
        Poison{2, "absmax", 255, inf,
               "tensor 'h.0.mlp.c_fc.weight' array 'absmax' holds infinity at element 255"}}) {
    Model m = clean;
    const CacheTensor& t = m.tensors[p.tensor];
    const auto a = std::find_if(t.arrays.begin(), t.arrays.end(),
                                [&](const CacheArray& x) { return x.name == p.array; });
    ASSERT_NE(a, t.arrays.end()) << p.array;
    std::memcpy(&m.store[a->offset + p.element * sizeof(float)], &p.value, sizeof(float));
    const std::string path = file("cache.h5");
    write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
    const CacheLookup r = read(path, m, make_key());
    EXPECT_EQ(r.status, CacheStatus::corrupt) << p.words << ": " << r.reason;
    EXPECT_NE(r.reason.find(p.words), std::string::npos) << r.reason;
  }
  write_quant_cache(file("clean.h5"), make_key(), clean.tensors, clean.store.data(),
                    clean.store.size());
  EXPECT_EQ(read(file("clean.h5"), clean, make_key()).status, CacheStatus::hit);
}

TEST_F(QuantCacheTest, TruncatedFileIsNeverAHit) {
  Model m = make_model(4);
  std::string full = file("full.h5");
  write_quant_cache(full, make_key(), m.tensors, m.store.data(), m.store.size());
  const size_t size = fs::file_size(full);
  std::string bytes = read_text_file(full);
  for (double fraction : {0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99}) {
    for (size_t cut : {static_cast<size_t>(fraction * size), size - 1}) {
      std::string path = file("cut.h5");
      write_text_file(path, bytes.substr(0, cut));
      CacheLookup r = read(path, m, make_key());
      // Once the user block's first line is there, the file is still
      // recognisably a meshlm cache (corrupt: it may be replaced); before
      // that it is nobody's (foreign: it may not).
      const bool recognisable = cut >= std::string("meshlm quantized cache\n").size();
      EXPECT_EQ(r.status, recognisable ? CacheStatus::corrupt : CacheStatus::foreign)
          << "cut at " << cut << " of " << size << ": " << cache_status_name(r.status) << ": "
          << r.reason;
    }
  }
}

// A bit flipped in the metadata (anywhere outside the arrays' data, which
// the test above covers) gives `corrupt`, or a hit with the right bytes
// where the bit was in unused space; never a crash, a hang or wrong bytes.
// The file format chosen for this (fixed-length strings, checksummed object
// headers) is explained in quant_cache.cpp.
TEST_F(QuantCacheTest, BitFlippedInTheMetadataIsNeverAWrongHit) {
  Model m = make_model(6);
  std::string full = file("full.h5");
  write_quant_cache(full, make_key(), m.tensors, m.store.data(), m.store.size());
  const std::string bytes = read_text_file(full);
  std::vector<bool> is_data(bytes.size(), false);
  for (const CacheTensor& t : m.tensors)
    for (const CacheArray& a : t.arrays) {
      if (a.count == 0) continue;
      haddr_t at = data_offset(full, "q/" + t.name + "/" + a.name);
      ASSERT_NE(at, HADDR_UNDEF);
      std::fill_n(is_data.begin() + static_cast<ptrdiff_t>(at), a.count * dtype_size(a.type),
                  true);
    }
  std::string path = file("flipped.h5");
  int corrupt = 0, hits = 0;
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    if (is_data[pos]) continue;
    std::string b = bytes;
    b[pos] = static_cast<char>(b[pos] ^ (1 << (pos % 8)));
    write_text_file(path, b);
    std::vector<uint8_t> store;
    CacheLookup r = read(path, m, make_key(), &store);
    if (r.status == CacheStatus::hit) {
      ++hits;
      EXPECT_TRUE(store == m.store) << "a wrong hit with the bit at byte " << pos << " flipped";
    } else {
      ++corrupt;
      EXPECT_EQ(r.status, CacheStatus::corrupt) << "byte " << pos << ": " << r.reason;
    }
  }
  EXPECT_GT(corrupt, 0);
  RecordProperty("flips_read_as_hits", hits);
  RecordProperty("flips_read_as_corrupt", corrupt);
}

// Files that are not meshlm caches are "foreign": never read as a cache and,
// unlike a damaged cache of meshlm's own, never to be replaced.
TEST_F(QuantCacheTest, NotAnHdf5FileOrNotACacheIsForeign) {
  Model m = make_model(1);
  std::string text = file("text.h5");
  write_text_file(text, "this is not HDF5\n");
  CacheLookup r = read(text, m, make_key());
  EXPECT_EQ(r.status, CacheStatus::foreign) << r.reason;
  EXPECT_NE(r.reason.find("not an HDF5 file"), std::string::npos) << r.reason;

  // An HDF5 file with the signature and garbage after it.
  std::string garbage = file("garbage.h5");
  write_text_file(garbage, std::string("\x89HDF\r\n\x1a\n", 8) + std::string(4096, '\x5a'));
  r = read(garbage, m, make_key());
  EXPECT_EQ(r.status, CacheStatus::foreign) << r.reason;

  // A valid HDF5 file that is something else.
  std::string other = file("other.h5");
  {
    h5::File f = h5::create_file(other);
    h5::write_dataset<float>(f, "x", std::vector<float>{1, 2, 3});
  }
  r = read(other, m, make_key());
  EXPECT_EQ(r.status, CacheStatus::foreign) << r.reason;
  EXPECT_NE(r.reason.find("/meta"), std::string::npos) << r.reason;

  // A directory where the file should be.
  fs::create_directory(file("dir.h5"));
  r = read(file("dir.h5"), m, make_key());
  EXPECT_EQ(r.status, CacheStatus::foreign) << r.reason;
}

// Every cache starts with its own line in the HDF5 user block, so that even
// a truncated one is recognisably meshlm's.
TEST_F(QuantCacheTest, CachesCarryTheirMagicLine) {
  Model m = make_model(2);
  std::string path = file("cache.h5");
  write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
  EXPECT_EQ(read_text_file(path).substr(0, 23), "meshlm quantized cache\n");
  EXPECT_EQ(read(path, m, make_key()).status, CacheStatus::hit);
}

TEST_F(QuantCacheTest, OtherLayoutIsCorrupt) {
  Model m = make_model(5);
  std::string path = file("cache.h5");
  write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
  auto expect_corrupt = [&](const Model& changed, const std::string& words) {
    CacheLookup r = read(path, changed, make_key());
    EXPECT_EQ(r.status, CacheStatus::corrupt) << words << ": " << r.reason;
    EXPECT_NE(r.reason.find(words), std::string::npos) << r.reason;
  };

  Model count = m;
  count.tensors[1].arrays[1].count += 1;  // still inside the store (the gaps)
  expect_corrupt(count, "tensor 'h.0.attn.c_attn.weight' array 'absmax' has 192 elements, expected 193");

  Model type = m;
  type.tensors[2].arrays[0].type = DType::u8;
  expect_corrupt(type, "array 'data' is stored as int8, expected uint8");

  Model shape = m;
  shape.tensors[0].shape = {64, 96};
  expect_corrupt(shape, "tensor 'wte' has shape [96, 64], expected [64, 96]");

  Model format = m;
  format.tensors[2].format = "int4";
  expect_corrupt(format, "has format 'int8', expected 'int4'");

  Model renamed = m;
  renamed.tensors[0].name = "wpe";
  expect_corrupt(renamed, "has no tensor 'wpe'");

  Model fewer = m;
  fewer.tensors.pop_back();
  expect_corrupt(fewer, "holds 4 tensors, expected 3");

  Model more_arrays = m;
  more_arrays.tensors[2].arrays.push_back(CacheArray{"offset", DType::f32, 1, 0});
  expect_corrupt(more_arrays, "has 2 arrays, expected 3");

  // The offsets are the store's business, not the file's: moving a region
  // is still a hit.
  Model moved = m;
  std::swap(moved.tensors[0].arrays[2].offset, moved.tensors[0].arrays[3].offset);
  std::vector<uint8_t> store;
  CacheLookup r = read(path, moved, make_key(), &store);
  EXPECT_EQ(r.status, CacheStatus::hit) << r.reason;
}

TEST_F(QuantCacheTest, CallerMistakesThrow) {
  Model m = make_model(1);
  std::string path = file("cache.h5");
  Model outside = m;
  outside.tensors[0].arrays[0].offset = m.store.size() - 10;
  EXPECT_THROW(write_quant_cache(path, make_key(), outside.tensors, m.store.data(), m.store.size()),
               RankError);
  EXPECT_THROW(read(path, outside, make_key()), RankError);
  Model huge = m;
  huge.tensors[0].arrays[2].count = SIZE_MAX / 2;  // count * 4 overflows
  EXPECT_THROW(read(path, huge, make_key()), RankError);
  Model slash = m;
  slash.tensors[0].name = "h/0";
  EXPECT_THROW(read(path, slash, make_key()), RankError);
  Model twice = m;
  twice.tensors[1].name = twice.tensors[0].name;
  EXPECT_THROW(read(path, twice, make_key()), RankError);
  Model not_stored = m;  // the cache stores u8, i8 and f32 arrays only
  not_stored.tensors[0].arrays[0].type = DType::u16;
  EXPECT_THROW(write_quant_cache(path, make_key(), not_stored.tensors, m.store.data(),
                                 m.store.size()),
               RankError);
  EXPECT_THROW(read(path, not_stored, make_key()), RankError);
  EXPECT_TRUE(listing().empty());
}

// ---------------------------------------------------------------------------
// Writing: replacement, directories, temporaries
// ---------------------------------------------------------------------------

TEST_F(QuantCacheTest, WriteReplacesAnExistingCache) {
  Model a = make_model(10), b = make_model(11);
  ASSERT_FALSE(a.store == b.store);
  std::string path = file("cache.h5");
  write_quant_cache(path, make_key(), a.tensors, a.store.data(), a.store.size());
  write_quant_cache(path, make_key(), b.tensors, b.store.data(), b.store.size());
  std::vector<uint8_t> store;
  CacheLookup r = read(path, b, make_key(), &store);
  ASSERT_EQ(r.status, CacheStatus::hit) << r.reason;
  EXPECT_TRUE(store == b.store);
  EXPECT_EQ(listing(), std::vector<std::string>{"cache.h5"});
}

TEST_F(QuantCacheTest, WriteCreatesMissingDirectories) {
  Model m = make_model(1);
  std::string path = (dir_ / "a" / "b" / "cache.h5").string();
  write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
  EXPECT_EQ(read(path, m, make_key()).status, CacheStatus::hit);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "a" / "b")) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"cache.h5"});
}

TEST_F(QuantCacheTest, WriteThatCannotCreateTheFileNamesThePath) {
  Model m = make_model(1);
  write_text_file(file("plain"), "a file, not a directory");
  std::string path = (dir_ / "plain" / "sub" / "cache.h5").string();
  try {
    write_quant_cache(path, make_key(), m.tensors, m.store.data(), m.store.size());
    FAIL() << "no exception";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // Renaming onto a directory fails after the file was written: the
  // temporary file goes.
  fs::create_directory(file("dir.h5"));
  try {
    write_quant_cache(file("dir.h5"), make_key(), m.tensors, m.store.data(), m.store.size());
    FAIL() << "no exception";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find(file("dir.h5")), std::string::npos) << e.what();
  }
  EXPECT_EQ(listing(), (std::vector<std::string>{"dir.h5", "plain"}));
}

TEST_F(QuantCacheTest, InterruptedWriteLeavesTheOldCacheAndNoTemporary) {
  Model a = make_model(20), b = make_model(21);
  std::string path = file("cache.h5");
  write_quant_cache(path, make_key(), a.tensors, a.store.data(), a.store.size());
  struct Interrupted {};
  EXPECT_THROW(write_quant_cache(path, make_key(), b.tensors, b.store.data(), b.store.size(),
                                 [](size_t done, size_t) {
                                   if (done > 1000) throw Interrupted{};
                                 }),
               Interrupted);
  EXPECT_EQ(listing(), std::vector<std::string>{"cache.h5"});
  std::vector<uint8_t> store;
  CacheLookup r = read(path, a, make_key(), &store);
  ASSERT_EQ(r.status, CacheStatus::hit) << r.reason;
  EXPECT_TRUE(store == a.store);
}
