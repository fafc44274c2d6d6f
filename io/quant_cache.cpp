#include "io/quant_cache.h"

#include <cmath>
#include <cstdio>

#include <cstring>

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "io/h5.h"
#include "io/hash.h"

namespace meshlm::io {

namespace fs = std::filesystem;

namespace {

// /meta attributes that are not settings.
constexpr const char* kReservedNames[] = {"format_version", "key", "source_hash"};

// The element types a cache array may have: u8, i8 and f32, stored as the
// HDF5 types uint8, int8 and float32.
bool cache_type(DType t) { return t == DType::u8 || t == DType::i8 || t == DType::f32; }

hid_t native(DType t) {
  switch (t) {
    case DType::u8: return H5T_NATIVE_UINT8;
    case DType::i8: return H5T_NATIVE_INT8;
    case DType::f32: return H5T_NATIVE_FLOAT;
    default: break;
  }
  return H5I_INVALID_HID;
}

const char* type_label(DType t) {
  switch (t) {
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::f32: return "float32";
    default: break;
  }
  return dtype_name(t);
}

// The type a stored dataset holds, when it is one of ours.
bool stored_as(hid_t type, DType t) {
  H5T_class_t c = H5Tget_class(type);
  size_t bytes = H5Tget_size(type);
  switch (t) {
    case DType::u8: return c == H5T_INTEGER && bytes == 1 && H5Tget_sign(type) == H5T_SGN_NONE;
    case DType::i8: return c == H5T_INTEGER && bytes == 1 && H5Tget_sign(type) == H5T_SGN_2;
    case DType::f32: return c == H5T_FLOAT && bytes == 4;
    default: break;
  }
  return false;
}

size_t array_bytes(const CacheArray& a) { return a.count * dtype_size(a.type); }

// HDF5 link names: anything but '/' (a path separator) and "." (the group itself).
void check_link_name(const std::string& name, const std::string& what) {
  if (name.empty() || name == "." || name.find('/') != std::string::npos)
    throw RankError("quantization cache: " + what + " name '" + name +
                        "' cannot be an HDF5 link name (empty, '.' or containing '/')",
                    MESHLM_HERE);
}

// The caller's side of the contract: every array inside the store, names
// usable and unique. Checked before any byte moves.
void check_layout(const std::vector<CacheTensor>& tensors, size_t store_bytes) {
  std::set<std::string> names;
  for (const CacheTensor& t : tensors) {
    check_link_name(t.name, "tensor");
    if (!names.insert(t.name).second)
      throw RankError("quantization cache: tensor '" + t.name + "' is listed twice", MESHLM_HERE);
    std::set<std::string> arrays;
    for (const CacheArray& a : t.arrays) {
      check_link_name(a.name, "array");
      if (!arrays.insert(a.name).second)
        throw RankError("quantization cache: tensor '" + t.name + "' lists array '" + a.name +
                            "' twice",
                        MESHLM_HERE);
      if (!cache_type(a.type))
        throw RankError(fmt::format("quantization cache: tensor '{}' array '{}' has element type "
                                    "{}; a cache array is u8, i8 or f32",
                                    t.name, a.name, dtype_name(a.type)),
                        MESHLM_HERE);
      // offset + count * size <= store_bytes, written so that it cannot overflow.
      if (a.offset > store_bytes ||
          a.count > (store_bytes - a.offset) / dtype_size(a.type))
        throw RankError(fmt::format("quantization cache: tensor '{}' array '{}' ({} x {} at byte "
                                    "{}) does not fit in the store of {} bytes",
                                    t.name, a.name, a.count, type_label(a.type), a.offset,
                                    store_bytes),
                        MESHLM_HERE);
    }
  }
}

uint64_t tensor_checksum(const CacheTensor& t, const uint8_t* store) {
  Xxh3_64 h;
  for (const CacheArray& a : t.arrays) h.update(store + a.offset, array_bytes(a));
  return h.value();
}

// One field of the key: its length (8 bytes, little-endian) and its bytes,
// so that no two different lists of fields hash the same stream.
void key_field(Xxh3_128& h, const std::string& s) {
  uint64_t n = s.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  h.update(len, sizeof len);
  h.update(s);
}

// ---------------------------------------------------------------------------
// Attributes the h5 helpers do not cover: 1-D int64 arrays, attribute names
// ---------------------------------------------------------------------------

void write_int64_array_attr(hid_t obj, const std::string& name, const std::vector<int64_t>& v) {
  hsize_t n = v.size();
  h5::Dataspace space(H5Screate_simple(1, &n, nullptr));
  h5::Attribute attr(h5::check(
      H5Acreate2(obj, name.c_str(), H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT), obj,
      name, "cannot create attribute"));
  if (n > 0)
    h5::check(H5Awrite(attr, H5T_NATIVE_INT64, v.data()), obj, name, "cannot write attribute");
}

std::vector<int64_t> read_int64_array_attr(hid_t obj, const std::string& name) {
  if (!h5::has_attr(obj, name)) h5::fail(obj, name, "no such attribute");
  h5::Attribute attr(h5::check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), obj, name,
                               "cannot open attribute"));
  h5::Datatype type(H5Aget_type(attr));
  if (!h5::converts_losslessly(type, H5T_NATIVE_INT64))
    h5::fail(obj, name, "is " + h5::type_name(type) + ", not int64");
  h5::Dataspace space(H5Aget_space(attr));
  hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n < 0 || H5Sget_simple_extent_ndims(space) > 1) h5::fail(obj, name, "is not 1-D");
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (n > 0)
    h5::check(H5Aread(attr, H5T_NATIVE_INT64, v.data()), obj, name, "cannot read attribute");
  return v;
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  h5::check(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr_name, &names), obj,
            h5::object_name(obj), "cannot list attributes");
  return names;
}

hsize_t link_count(hid_t group) {
  H5G_info_t info{};
  h5::check(H5Gget_info(group, &info), group, h5::object_name(group), "cannot read group info");
  return info.nlinks;
}

// ---------------------------------------------------------------------------
// The file format: chosen so that a damaged cache is reported, not crashed on
// ---------------------------------------------------------------------------
//
// HDF5 trusts its metadata: a bit flipped in a structure that carries no
// checksum can make HDF5 1.10 crash or loop forever (flipping each bit of a
// small cache in turn found both). Two choices leave no such structure in a
// cache file:
//  * the HDF5 1.8 file format (libver bounds V18, readable by any HDF5 since
//    1.8 and by h5py): superblock and object headers of version 2, each with
//    a checksum HDF5 verifies when it reads them;
//  * fixed-length strings: variable-length ones live in the global heap,
//    which has no checksum (a flip there made H5Aread spin).
// What HDF5 leaves unchecked, the arrays' data, the xxh3_64 attributes cover.

// Serial file access, the 1.8 format, and no failure on file systems mounted
// without flock() (as h5::open_file).
h5::PropList cache_fapl() {
  h5::PropList fapl(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl, true, true);
#endif
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
  return fapl;
}

// A NUL-terminated UTF-8 string of fixed length, stored in the object header
// (h5::read_string_attr reads it; h5py gives bytes: .decode()).
void write_fixed_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  h5::Datatype type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type, value.size() + 1);
  H5Tset_cset(type, H5T_CSET_UTF8);
  h5::Dataspace space(H5Screate(H5S_SCALAR));
  h5::Attribute attr(h5::check(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
                               obj, name, "cannot create attribute"));
  h5::check(H5Awrite(attr, type, value.c_str()), obj, name, "cannot write attribute");
}

// A group that remembers the order its members were created in, so that
// h5py lists tensors in the table's order and a tensor's arrays in the order
// of its checksum.
h5::Group ordered_group(hid_t loc, const std::string& name) {
  h5::PropList gcpl(H5Pcreate(H5P_GROUP_CREATE));
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return h5::Group(h5::check(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), loc,
                             name, "cannot create group"));
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

// "cache '<path>' has no /meta group", "cache '<path>': tensor 'wte' ...".
// The user block (bytes HDF5 leaves to the application before its
// superblock) of every cache starts with kMagic: a cache stays recognisably
// meshlm's even when truncated or damaged, so it may be replaced, while any
// other file at the path may not.
constexpr const char kMagic[] = "meshlm quantized cache\n";
constexpr hsize_t kUserBlockBytes = 512;

void write_magic(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  const size_t n = sizeof(kMagic) - 1;
  const bool ok = f && std::fwrite(kMagic, 1, n, f) == n;
  if (f && std::fclose(f) != 0) throw RankError(path + ": cannot write the user block", MESHLM_HERE);
  if (!ok) throw RankError(path + ": cannot write the user block", MESHLM_HERE);
}

bool has_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buf[sizeof(kMagic) - 1];
  return in.read(buf, sizeof(buf)) && std::memcmp(buf, kMagic, sizeof(buf)) == 0;
}

// "'<path>' is a directory, not a meshlm quantized cache".
CacheLookup foreign(const std::string& path, const std::string& what) {
  return {CacheStatus::foreign, "'" + path + "' is " + what + ", not a meshlm quantized cache"};
}

CacheLookup corrupt(const std::string& path, const std::string& what) {
  return {CacheStatus::corrupt, "cache '" + path + "'" + (what.starts_with(':') ? "" : " ") + what};
}

// Why the key stored in /meta differs from the expected one, in words.
CacheLookup explain_other_key(const std::string& path, hid_t meta, const CacheKey& key,
                              const std::string& stored_key, const std::string& expected_key) {
  auto other = [&path](const std::string& what) {
    return CacheLookup{CacheStatus::different_key, "cache '" + path + "' was made " + what};
  };
  std::string source = h5::has_attr(meta, "source_hash") ? h5::read_string_attr(meta, "source_hash")
                                                         : "(none)";
  if (source != key.source_hash)
    return other(fmt::format("from another source (hash {} != {})", source, key.source_hash));
  for (const auto& [name, value] : key.settings) {
    if (!h5::has_attr(meta, name))
      return other(fmt::format("without the setting {} (expected {})", name, value));
    std::string stored = h5::read_string_attr(meta, name);
    if (stored != value) return other(fmt::format("with {} = {}, not {}", name, stored, value));
  }
  for (const std::string& name : attr_names(meta)) {
    bool reserved = std::find(std::begin(kReservedNames), std::end(kReservedNames), name) !=
                    std::end(kReservedNames);
    bool known = std::any_of(key.settings.begin(), key.settings.end(),
                             [&name](const auto& s) { return s.first == name; });
    if (!reserved && !known)
      return other(fmt::format("with the extra setting {} = {}", name,
                               h5::read_string_attr(meta, name)));
  }
  return other(fmt::format("with the key {}, not {}", stored_key, expected_key));
}

// The file's side of read_quant_cache: HDF5 failures throw (and are turned
// into `corrupt` by the caller); every other finding is returned.
CacheLookup read_checked(const std::string& path, const CacheKey& key,
                         const std::vector<CacheTensor>& tensors, uint8_t* store,
                         bool& recognised) {
  const std::string expected_key = key.key();
  h5::File file = h5::open_file(path);

  if (!h5::exists(file, "meta"))
    return recognised ? corrupt(path, "has no /meta group")
                      : foreign(path, "an HDF5 file without /meta");
  h5::Group meta = h5::open_group(file, "meta");
  if (!h5::has_attr(meta, "format_version") || !h5::has_attr(meta, "key"))
    return recognised ? corrupt(path, "has no format_version and key in /meta")
                      : foreign(path, "an HDF5 file whose /meta has no format_version and key");
  recognised = true;
  int32_t version = h5::read_scalar_attr<int32_t>(meta, "format_version");
  if (version != kQuantCacheFormatVersion)
    return {CacheStatus::different_key,
            fmt::format("cache '{}' has format version {}, this meshlm writes version {}", path,
                        version, kQuantCacheFormatVersion)};
  std::string stored_key = h5::read_string_attr(meta, "key");
  if (stored_key != expected_key)
    return explain_other_key(path, meta, key, stored_key, expected_key);

  // The layout, all of it, before any data is read: a mismatch costs no I/O.
  if (!h5::exists(file, "q")) return corrupt(path, "has no /q group");
  h5::Group q = h5::open_group(file, "q");
  if (link_count(q) != tensors.size())
    return corrupt(path, fmt::format("holds {} tensors, expected {}", link_count(q),
                                     tensors.size()));
  std::vector<h5::Group> groups;
  std::vector<std::vector<h5::Dataset>> datasets;
  for (const CacheTensor& t : tensors) {
    auto where = [&t](const std::string& what) { return ": tensor '" + t.name + "' " + what; };
    if (!h5::exists(q, t.name)) return corrupt(path, "has no tensor '" + t.name + "'");
    h5::Group g = h5::open_group(q, t.name);
    std::vector<int64_t> shape = read_int64_array_attr(g, "shape");
    if (shape != t.shape)
      return corrupt(path, where(fmt::format("has shape [{}], expected [{}]",
                                             fmt::join(shape, ", "), fmt::join(t.shape, ", "))));
    std::string format = h5::read_string_attr(g, "format");
    if (format != t.format)
      return corrupt(path, where("has format '" + format + "', expected '" + t.format + "'"));
    if (link_count(g) != t.arrays.size())
      return corrupt(path, where(fmt::format("has {} arrays, expected {}", link_count(g),
                                             t.arrays.size())));
    std::vector<h5::Dataset> ds;
    for (const CacheArray& a : t.arrays) {
      auto array = [&](const std::string& what) { return where("array '" + a.name + "' " + what); };
      if (!h5::exists(g, a.name)) return corrupt(path, array("is missing"));
      h5::Dataset d = h5::open_dataset(g, a.name);
      h5::Datatype type(H5Dget_type(d));
      if (!stored_as(type, a.type))
        return corrupt(path, array("is stored as " + h5::type_name(type) + ", expected " +
                                   type_label(a.type)));
      std::vector<hsize_t> dims = h5::shape(d);
      if (dims.size() != 1)
        return corrupt(path, array(fmt::format("has {} dimensions, expected 1", dims.size())));
      if (dims[0] != a.count)
        return corrupt(path, array(fmt::format("has {} elements, expected {}", dims[0], a.count)));
      ds.push_back(std::move(d));
    }
    groups.push_back(std::move(g));
    datasets.push_back(std::move(ds));
  }

  // The data: each array straight into its region of the store (type and
  // count checked above, so a read never passes the region's end).
  size_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CacheTensor& t = tensors[i];
    for (size_t j = 0; j < t.arrays.size(); ++j) {
      const CacheArray& a = t.arrays[j];
      if (a.count > 0) h5::read_all(datasets[i][j], native(a.type), store + a.offset);
      bytes += array_bytes(a);
    }
    uint64_t stored = h5::read_scalar_attr<uint64_t>(groups[i], "xxh3_64");
    uint64_t computed = tensor_checksum(t, store);
    if (stored != computed)
      return corrupt(path, fmt::format(": tensor '{}' fails its checksum (xxh3_64 of the data "
                                       "{:016x}, stored {:016x})",
                                       t.name, computed, stored));
    // Scales and offsets multiply every weight: none may be NaN or infinite
    // (a store meshlm wrote has none; one from elsewhere is not trained on).
    for (const CacheArray& a : t.arrays) {
      if (a.type != DType::f32) continue;
      for (size_t k = 0; k < a.count; ++k) {
        float v;
        std::memcpy(&v, store + a.offset + k * sizeof(float), sizeof(float));
        if (!std::isfinite(v))
          return corrupt(path, fmt::format(": tensor '{}' array '{}' holds {} at element {}",
                                           t.name, a.name, std::isnan(v) ? "NaN" : "infinity", k));
      }
    }
  }
  return {CacheStatus::hit,
          fmt::format("cache '{}' matches: {} tensors, {} bytes", path, tensors.size(), bytes)};
}

}  // namespace

const char* cache_status_name(CacheStatus s) {
  switch (s) {
    case CacheStatus::hit: return "hit";
    case CacheStatus::missing: return "missing";
    case CacheStatus::different_key: return "different_key";
    case CacheStatus::corrupt: return "corrupt";
    case CacheStatus::foreign: return "foreign";
  }
  return "?";
}

std::string CacheKey::key() const {
  std::vector<std::pair<std::string, std::string>> sorted = settings;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& name = sorted[i].first;
    if (name.empty() || std::find(std::begin(kReservedNames), std::end(kReservedNames), name) !=
                            std::end(kReservedNames))
      throw RankError("quantization cache: '" + name + "' cannot be a setting name", MESHLM_HERE);
    if (i > 0 && sorted[i - 1].first == name)
      throw RankError("quantization cache: setting '" + name + "' is given twice", MESHLM_HERE);
  }
  Xxh3_128 h;
  key_field(h, "meshlm quant cache");
  key_field(h, std::to_string(kQuantCacheFormatVersion));
  key_field(h, source_hash);
  for (const auto& [name, value] : sorted) {
    key_field(h, name);
    key_field(h, value);
  }
  return h.hex();
}

CacheLookup read_quant_cache(const std::string& path, const CacheKey& key,
                             const std::vector<CacheTensor>& tensors, uint8_t* store,
                             size_t store_bytes) {
  check_layout(tensors, store_bytes);
  key.key();  // a bad setting name is the caller's mistake: throw it here, not as "corrupt"
  std::error_code ec;
  if (!fs::exists(path, ec)) return {CacheStatus::missing, "no cache at '" + path + "'"};
  h5::silence_errors();  // a damaged file makes HDF5 fail loudly; we report it in one line
  if (!fs::is_regular_file(path, ec)) return foreign(path, "not a regular file");
  if (!h5::is_hdf5_file(path)) {
    if (has_magic(path)) return corrupt(path, "is a damaged meshlm cache (no HDF5 superblock)");
    return foreign(path, "not an HDF5 file");
  }
  bool recognised = has_magic(path);  // or once /meta shows it (caches without the user block)
  try {
    return read_checked(path, key, tensors, store, recognised);
  } catch (const std::exception& e) {
    if (!fs::exists(path, ec)) return {CacheStatus::missing, "no cache at '" + path + "'"};
    if (!recognised) return foreign(path, std::string("an unreadable HDF5 file (") + e.what() + ")");
    return corrupt(path, std::string("cannot be read: ") + e.what());
  }
}

void write_quant_cache(const std::string& path, const CacheKey& key,
                       const std::vector<CacheTensor>& tensors, const uint8_t* store,
                       size_t store_bytes,
                       const std::function<void(size_t done, size_t total)>& progress) {
  check_layout(tensors, store_bytes);
  const std::string cache_key = key.key();
  size_t total = 0;
  for (const CacheTensor& t : tensors)
    for (const CacheArray& a : t.arrays) total += array_bytes(a);

  h5::AtomicWrite tmp(path);  // rename() replaces `path` whole: a reader opens either file
  try {
    h5::PropList fcpl(H5Pcreate(H5P_FILE_CREATE));
    H5Pset_userblock(fcpl, kUserBlockBytes);
    h5::File file = h5::create_file(tmp.tmp_path(), cache_fapl(), fcpl);
    {
      h5::Group meta = h5::require_group(file, "meta");
      h5::write_scalar_attr<int32_t>(meta, "format_version", kQuantCacheFormatVersion);
      write_fixed_string_attr(meta, "key", cache_key);
      write_fixed_string_attr(meta, "source_hash", key.source_hash);
      for (const auto& [name, value] : key.settings) write_fixed_string_attr(meta, name, value);
    }
    h5::Group q = ordered_group(file, "q");
    size_t done = 0;
    for (const CacheTensor& t : tensors) {
      h5::Group g = ordered_group(q, t.name);
      write_int64_array_attr(g, "shape", t.shape);
      write_fixed_string_attr(g, "format", t.format);
      h5::write_scalar_attr<uint64_t>(g, "xxh3_64", tensor_checksum(t, store));
      for (const CacheArray& a : t.arrays) {
        h5::write_dataset_raw(g, a.name, native(a.type), native(a.type), store + a.offset,
                              {static_cast<hsize_t>(a.count)});
        done += array_bytes(a);
        if (progress) progress(done, total);
      }
    }
    q.close();
    h5::close_file(file, tmp.tmp_path());
    write_magic(tmp.tmp_path());
    tmp.commit();
  } catch (const RankError& e) {
    throw RankError("cannot write quantization cache '" + path + "': " + e.what(), MESHLM_HERE);
  }
}

}  // namespace meshlm::io
