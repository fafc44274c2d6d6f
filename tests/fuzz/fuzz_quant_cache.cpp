// Fuzz target: the quantized-model cache reader, io::read_quant_cache
// (io/quant_cache.h), asked for one fixed small model (quant_cache_layout()
// below: an nf4 tensor, an int8 tensor, an empty one) and one key.
//
// The reader promises to answer any bad cache file with a status and a
// reason, never an exception: here ANY exception escaping it, a crash, a
// hang or a sanitizer report is a finding. A "hit" must also leave the
// store holding exactly the bytes whose checksums the file carries.
//
// Two kinds of input:
//  * a file as it is, when the input starts with the HDF5 signature
//    (tests/fuzz/corpus/quant_cache/: caches written by io::write_quant_cache
//    for this layout). The cache's metadata carries HDF5 checksums, so most
//    byte mutations stop there; they test that damage is reported.
//  * otherwise a description, read by ByteReader, of a cache file that the
//    target writes with the HDF5 library, as io::write_quant_cache would but
//    with any part of it changed: groups missing or of another kind, the
//    attributes (format_version, key, source hash, settings, shape, format,
//    xxh3_64) missing or of another type, shape or value, arrays of another
//    type, rank, count or storage, extra tensors and arrays, links. This is
//    the structured mutation: each byte of the input is one decision, so the
//    fuzzer explores the reader's checks rather than HDF5's checksums.
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "fuzz_targets.h"
#include "io/h5.h"
#include "io/hash.h"
#include "io/quant_cache.h"

namespace meshlm::fuzz {

namespace h5 = io::h5;

std::vector<io::CacheTensor> quant_cache_layout() {
  return {
      {"wte", {8, 16}, "nf4",
       {{"data", DType::u8, 64, 0}, {"absmax", DType::i8, 2, 64},
        {"absmax2", DType::f32, 1, 68}, {"offset", DType::f32, 1, 72}}},
      {"h.0.mlp.c_fc.weight", {4, 8}, "int8",
       {{"data", DType::i8, 32, 76}, {"absmax", DType::f32, 4, 108}}},
      {"empty", {}, "none", {{"data", DType::u8, 0, 124}}},
  };
}
io::CacheKey quant_cache_key() {
  return {"0123456789abcdef0123456789abcdef", {{"quant_type", "nf4"}, {"block", "64"}}};
}

namespace {

hid_t file_type_of(DType t) {
  return t == DType::u8 ? H5T_STD_U8LE : t == DType::i8 ? H5T_STD_I8LE : H5T_IEEE_F32LE;
}

// A string attribute as the writer makes it (fixed length, NUL-terminated),
// or, when the input says so, of another kind: variable length, an array of
// strings, an integer, an empty string, or another value.
void string_attr(ByteReader& in, hid_t obj, const char* name, std::string value) {
  const unsigned kind = in.one_in(4) ? in.pick(8) : 0;
  if (kind == 1) return;  // missing
  if (kind == 2) value = in.bytes(40);
  if (kind == 3) value.clear();
  const hsize_t n = 1 + in.pick(3);
  h5::Dataspace space(kind == 4 || kind == 5 ? H5Screate_simple(1, &n, nullptr)
                                             : H5Screate(H5S_SCALAR));
  h5::Datatype type(H5Tcopy(H5T_C_S1));
  const bool vlen = kind == 5 || kind == 6;
  H5Tset_size(type, vlen ? H5T_VARIABLE : value.size() + 1);
  H5Tset_cset(type, H5T_CSET_UTF8);
  if (kind == 7) {  // not a string
    int64_t v[1] = {static_cast<int64_t>(in.u64())};
    h5::Attribute attr(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT));
    if (attr.valid()) H5Awrite(attr, H5T_NATIVE_INT64, v);
    return;
  }
  h5::Attribute attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return;
  if (vlen) {
    std::vector<const char*> p(n, value.c_str());
    H5Awrite(attr, type, p.data());
  } else {
    std::string buf;
    for (hsize_t i = 0; i < n; ++i) buf += value + '\0';
    H5Awrite(attr, type, buf.data());
  }
}

// A numeric attribute holding `values` as `file_type`, or, when the input
// says so, missing, of another type, another shape, or other values.
void number_attr(ByteReader& in, hid_t obj, const char* name, hid_t file_type,
                 std::vector<int64_t> values, bool scalar) {
  static const hid_t* const kTypes[] = {&H5T_STD_I64LE_g, &H5T_STD_U64LE_g, &H5T_STD_I32LE_g,
                                        &H5T_STD_U8LE_g,  &H5T_IEEE_F64LE_g, &H5T_STD_I64BE_g};
  const unsigned kind = in.one_in(4) ? in.pick(8) : 0;
  if (kind == 1) return;  // missing
  if (kind == 2) file_type = *kTypes[in.pick(6)];
  if (kind == 3) scalar = !scalar;
  if (kind == 4 && !values.empty()) values[in.pick(static_cast<unsigned>(values.size()))] =
      static_cast<int64_t>(in.u64());
  if (kind == 5) values.push_back(static_cast<int64_t>(in.u8()));
  if (kind == 6 && !values.empty()) values.pop_back();
  if (kind == 7) {  // a string where a number belongs
    string_attr(in, obj, name, "12");
    return;
  }
  if (values.empty() && scalar) values.push_back(0);
  hsize_t n = values.size();
  h5::Dataspace space(scalar ? H5Screate(H5S_SCALAR)
                      : n == 0 && in.one_in(2) ? H5Screate(H5S_NULL)
                                               : H5Screate_simple(1, &n, nullptr));
  h5::Attribute attr(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT));
  if (attr.valid() && n > 0) H5Awrite(attr, H5T_NATIVE_INT64, values.data());
}

// A group that tracks creation order, as the writer's.
h5::Group ordered_group(hid_t loc, const std::string& name) {
  h5::PropList gcpl(H5Pcreate(H5P_GROUP_CREATE));
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return h5::Group(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT));
}

// Something other than the group `name`: a dataset, a dangling soft link or
// an external link to no file.
void not_a_group(ByteReader& in, hid_t loc, const std::string& name) {
  switch (in.pick(3)) {
    case 0: {
      h5::Dataspace space(H5Screate(H5S_SCALAR));
      h5::Dataset d(H5Dcreate2(loc, name.c_str(), H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT));
      break;
    }
    case 1: H5Lcreate_soft("/nowhere", loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT); break;
    default:
      H5Lcreate_external("missing-file.h5", "/q", loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      break;
  }
}

// One array dataset of a tensor, with `bytes` as its contents, or changed.
void write_array(ByteReader& in, hid_t group, const io::CacheArray& a,
                 const std::vector<unsigned char>& bytes) {
  static const hid_t* const kTypes[] = {&H5T_STD_U8LE_g,  &H5T_STD_I8LE_g,  &H5T_IEEE_F32LE_g,
                                        &H5T_IEEE_F32BE_g, &H5T_STD_U16LE_g, &H5T_IEEE_F64LE_g,
                                        &H5T_STD_B8LE_g,  &H5T_STD_I32LE_g};
  const unsigned kind = in.one_in(4) ? in.pick(10) : 0;
  if (kind == 1) return;  // missing
  if (kind == 2) {
    not_a_group(in, group, a.name);  // (a dataset of another shape, or a link)
    return;
  }
  if (kind == 3) {  // a group
    h5::Group g(H5Gcreate2(group, a.name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    return;
  }
  hid_t type = file_type_of(a.type);
  if (kind == 4) type = *kTypes[in.pick(8)];
  hsize_t dims[2] = {a.count, 1};
  int rank = 1;
  if (kind == 5) dims[0] = a.count + 1 - std::min<size_t>(in.pick(3), a.count + 1);  // +1, 0, -1
  if (kind == 6) {
    rank = 2;
    dims[1] = 1 + in.pick(2);
  }
  h5::Dataspace space(kind == 7 ? H5Screate(H5S_SCALAR)
                      : kind == 8 && a.count == 0 ? H5Screate(H5S_NULL)
                                                  : H5Screate_simple(rank, dims, nullptr));
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (kind == 9 && dims[0] > 0) {  // chunked storage, maybe filtered
    hsize_t chunk[2] = {1 + static_cast<hsize_t>(in.pick(16)), 1};
    H5Pset_chunk(dcpl, rank, chunk);
    if (in.one_in(2)) H5Pset_deflate(dcpl, 1);
    if (in.one_in(2)) H5Pset_fletcher32(dcpl);
  }
  h5::Dataset d(H5Dcreate2(group, a.name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  if (!d.valid()) return;
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n <= 0 || in.one_in(32)) return;  // never written: the fill value
  // The expected bytes (padded with input when the dataset is larger),
  // converted by HDF5 when the stored type differs.
  const size_t esize = dtype_size(a.type);
  std::vector<unsigned char> buf(static_cast<size_t>(n) * esize);
  const size_t k = std::min(buf.size(), bytes.size());
  std::copy_n(bytes.begin(), k, buf.begin());
  in.fill(buf.data() + k, buf.size() - k);
  hid_t mem = a.type == DType::u8 ? H5T_NATIVE_UINT8
              : a.type == DType::i8 ? H5T_NATIVE_INT8 : H5T_NATIVE_FLOAT;
  if (kind == 4 && H5Tget_class(type) != H5T_FLOAT && a.type == DType::f32) mem = type;
  H5Dwrite(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
}

// Writes the cache that the input describes to `path`; returns the store
// contents the file's arrays hold when it was written unchanged.
void build_cache(ByteReader& in, const std::string& path) {
  h5::silence_errors();
  const std::vector<io::CacheTensor> layout = quant_cache_layout();
  const io::CacheKey key = quant_cache_key();
  h5::PropList fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!in.one_in(8)) H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
  h5::File file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  if (!file.valid()) {
    std::fprintf(stderr, "meshlm fuzz: cannot create %s\n", path.c_str());
    std::abort();
  }

  // /meta
  if (in.one_in(16)) {
    not_a_group(in, file, "meta");
  } else {
    h5::Group meta(H5Gcreate2(file, "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    number_attr(in, meta, "format_version", H5T_STD_I32LE, {io::kQuantCacheFormatVersion}, true);
    string_attr(in, meta, "key", key.key());
    string_attr(in, meta, "source_hash", key.source_hash);
    for (const auto& [name, value] : key.settings)
      string_attr(in, meta, name.c_str(), value);
    if (in.one_in(8)) string_attr(in, meta, "extra", "setting");
  }

  // /q
  if (in.one_in(16)) {
    not_a_group(in, file, "q");
    return;
  }
  h5::Group q = ordered_group(file, "q");
  std::vector<io::CacheTensor> tensors = layout;
  if (in.one_in(8)) std::swap(tensors[0], tensors[in.pick(3)]);  // another order
  for (const io::CacheTensor& t : tensors) {
    const unsigned kind = in.one_in(8) ? in.pick(4) : 0;
    if (kind == 1) continue;  // missing
    if (kind == 2) {
      not_a_group(in, q, t.name);
      continue;
    }
    h5::Group g = ordered_group(q, kind == 3 ? t.name + "_" : t.name);
    std::vector<unsigned char> data;  // the tensor's bytes, arrays in order
    std::vector<std::vector<unsigned char>> arrays;
    for (const io::CacheArray& a : t.arrays) {
      arrays.emplace_back(a.count * dtype_size(a.type));
      in.fill(arrays.back().data(), arrays.back().size());
      data.insert(data.end(), arrays.back().begin(), arrays.back().end());
    }
    number_attr(in, g, "shape", H5T_STD_I64LE, t.shape, false);
    string_attr(in, g, "format", t.format);
    const uint64_t sum = io::xxh3_64(data.data(), data.size());
    number_attr(in, g, "xxh3_64", H5T_STD_U64LE, {static_cast<int64_t>(sum)}, true);
    for (size_t j = 0; j < t.arrays.size(); ++j) write_array(in, g, t.arrays[j], arrays[j]);
    if (in.one_in(16)) write_array(in, g, {"extra", DType::u8, 4, 0}, {1, 2, 3, 4});
  }
  if (in.one_in(16)) {
    h5::Group extra = ordered_group(q, "extra");
    number_attr(in, extra, "shape", H5T_STD_I64LE, {1}, false);
  }
}

}  // namespace

void fuzz_quant_cache(const uint8_t* data, size_t size) {
  static const unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::string path;
  if (size >= 8 && std::memcmp(data, kHdf5Signature, 8) == 0) {
    path = write_scratch_file("cache.h5", data, size);
  } else {
    path = scratch_file("cache.h5");
    ByteReader in(data, size);
    build_cache(in, path);
  }
  const std::vector<io::CacheTensor> layout = quant_cache_layout();
  std::vector<uint8_t> store(kQuantCacheStoreBytes, 0xAA);
  const io::CacheLookup r =
      io::read_quant_cache(path, quant_cache_key(), layout, store.data(), store.size());
  report((std::string(io::cache_status_name(r.status)) + ": " + r.reason).c_str());
  if (r.reason.empty()) {
    std::fprintf(stderr, "status %s without a reason\n", io::cache_status_name(r.status));
    std::abort();
  }
  if (r.status == io::CacheStatus::hit) {
    // Every tensor's arrays hash to the checksum the file holds (read back
    // independently of the reader).
    h5::File f = h5::open_file(path);
    for (const io::CacheTensor& t : layout) {
      io::Xxh3_64 h;
      for (const io::CacheArray& a : t.arrays) h.update(store.data() + a.offset, a.count * dtype_size(a.type));
      h5::Group g(H5Gopen2(f, ("q/" + t.name).c_str(), H5P_DEFAULT));
      const uint64_t stored = h5::read_scalar_attr<uint64_t>(g, "xxh3_64");
      if (stored != h.value()) {
        std::fprintf(stderr, "hit, but tensor '%s' does not hash to its checksum\n", t.name.c_str());
        std::abort();
      }
    }
    // Bytes outside the arrays are untouched.
    std::vector<bool> covered(store.size());
    for (const io::CacheTensor& t : layout)
      for (const io::CacheArray& a : t.arrays)
        for (size_t i = 0; i < a.count * dtype_size(a.type); ++i) covered[a.offset + i] = true;
    for (size_t i = 0; i < store.size(); ++i)
      if (!covered[i] && store[i] != 0xAA) {
        std::fprintf(stderr, "hit, but byte %zu outside every array was written\n", i);
        std::abort();
      }
  }
}

}  // namespace meshlm::fuzz

MESHLM_FUZZ_ENTRY(meshlm::fuzz::fuzz_quant_cache)
