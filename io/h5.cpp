#include "io/h5.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/files.h"
#include "core/log.h"

namespace meshlm::io::h5 {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------

std::string type_name(hid_t type) {
  size_t bytes = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") +
             std::to_string(8 * bytes);
    case H5T_FLOAT: return "float" + std::to_string(8 * bytes);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return std::to_string(bytes) + "-byte enum";
    case H5T_ARRAY: return "array";
    default: return std::to_string(bytes) + "-byte non-numeric type";
  }
}

bool converts_losslessly(hid_t file_type, hid_t mem_type) {
  H5T_class_t fc = H5Tget_class(file_type), mc = H5Tget_class(mem_type);
  if (fc != mc) return false;
  size_t fbytes = H5Tget_size(file_type), mbytes = H5Tget_size(mem_type);
  if (fc == H5T_INTEGER) {
    bool fsigned = H5Tget_sign(file_type) != H5T_SGN_NONE;
    bool msigned = H5Tget_sign(mem_type) != H5T_SGN_NONE;
    if (fsigned == msigned) return fbytes <= mbytes;
    return !fsigned && fbytes < mbytes;  // uint16 -> int32 fits, int16 -> uint32 does not
  }
  if (fc == H5T_FLOAT) return fbytes <= mbytes;
  return H5Tequal(file_type, mem_type) > 0;
}

// ---------------------------------------------------------------------------
// One thread at a time
// ---------------------------------------------------------------------------

namespace {
std::recursive_mutex g_library;
std::atomic<int> g_waiting{0};   // threads blocked in LibraryLock()
thread_local double t_waited = 0;  // seconds this thread has waited

void take_library() {
  if (g_library.try_lock()) return;
  const auto t0 = std::chrono::steady_clock::now();
  ++g_waiting;
  g_library.lock();
  --g_waiting;
  t_waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

LibraryLock::LibraryLock() { take_library(); }
LibraryLock::~LibraryLock() { g_library.unlock(); }

void LibraryLock::yield() {
  if (g_waiting.load() == 0) return;
  g_library.unlock();
  // The waiter takes the lock (a mutex is not fair: without waiting for
  // that, this thread could take it straight back).
  while (g_waiting.load() > 0) std::this_thread::yield();
  take_library();
}

double LibraryLock::waited_seconds() { return t_waited; }

// ---------------------------------------------------------------------------
// Errors and names
// ---------------------------------------------------------------------------

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

// Keeps the description of the innermost entry of the error stack (the
// first one met walking upward): the one that says what really went wrong,
// e.g. "unable to open file: ... error message = 'No such file or directory'".
herr_t innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err->desc) *static_cast<std::string*>(out) = err->desc;
  return 0;
}

std::string with_h5_message(std::string msg, const std::string& h5msg) {
  if (!h5msg.empty()) msg += " (HDF5: " + h5msg + ")";
  return msg;
}

template <typename Get>
std::string get_name(Get get) {
  ssize_t n = get(nullptr, 0);
  if (n < 0) return "?";
  std::string s(static_cast<size_t>(n) + 1, '\0');
  get(s.data(), s.size());
  s.resize(static_cast<size_t>(n));
  return s;
}

}  // namespace

std::string last_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &msg);
  return msg;
}

std::string file_name(hid_t obj) {
  return get_name([obj](char* buf, size_t size) { return H5Fget_name(obj, buf, size); });
}

std::string object_name(hid_t obj) {
  return get_name([obj](char* buf, size_t size) { return H5Iget_name(obj, buf, size); });
}

void fail(hid_t loc, const std::string& name, const std::string& what) {
  throw RankError(file_name(loc) + ": '" + name + "': " + what, MESHLM_HERE);
}

int64_t check(int64_t status, hid_t loc, const std::string& name, const std::string& what) {
  if (status >= 0) return status;
  std::string h5msg = last_error();  // before any other HDF5 call clears it
  throw RankError(with_h5_message(file_name(loc) + ": '" + name + "': " + what, h5msg),
                  MESHLM_HERE);
}

// ---------------------------------------------------------------------------
// Files and paths
// ---------------------------------------------------------------------------

void create_parent_dirs(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    throw RankError("cannot create directory '" + parent.string() + "' for '" + path +
                        "': " + ec.message(),
                    MESHLM_HERE);
}

bool is_hdf5_file(const std::string& path) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  // Opening a FIFO blocks until a writer comes (forever, for a file named by
  // mistake): only a regular file is opened.
  if (!non_regular_kind(path).empty()) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  // The superblock sits at 0 or, after a user block, at 512 * 2^k.
  for (std::streamoff off = 0; off + 8 <= size; off = off == 0 ? 512 : 2 * off) {
    char buf[8];
    in.seekg(off);
    if (!in.read(buf, 8)) return false;
    if (std::memcmp(buf, kSignature, 8) == 0) return true;
  }
  return false;
}

AtomicWrite::AtomicWrite(std::string path) : path_(std::move(path)) {
  // "<path>.tmp.<host>.<pid>.<random>": whose file it is, and which of its
  // writers; removed on SIGTERM / SIGINT / SIGHUP (core/files.h), and by the
  // next writer of `path` when its process is gone.
  tmp_ = temp_name_for(path_);
  create_parent_dirs(path_);
  for (const std::string& old : remove_stale_temp_files(path_))
    log::info("# removed {}, a temporary file left by a process of this host that no longer runs",
              old);
  slot_ = register_temp_file(tmp_);
}

AtomicWrite::~AtomicWrite() {
  if (!committed_) std::remove(tmp_.c_str());
  unregister_temp_file(slot_);
}

void AtomicWrite::commit() {
  // On the disk before the rename makes it the real file, and the rename on
  // the disk before anyone is told: a crash never leaves a complete-looking
  // file with missing blocks.
  sync_file_and_dir(tmp_);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw RankError("cannot rename '" + tmp_ + "' to '" + path_ + "': " + std::strerror(errno),
                    MESHLM_HERE);
  sync_file_and_dir(path_);
  committed_ = true;
  unregister_temp_file(slot_);
  slot_ = -1;
}

File create_file(const std::string& path, hid_t fapl, hid_t fcpl) {
  silence_errors();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
  if (id < 0)
    throw RankError(with_h5_message(path + ": cannot create HDF5 file", last_error()),
                    MESHLM_HERE);
  return File(id);
}

File open_file(const std::string& path, bool writable, hid_t fapl) {
  silence_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw RankError(path + ": no such file", MESHLM_HERE);
  // By name first: a FIFO would block the open (and HDF5's) forever.
  if (const std::string kind = non_regular_kind(path); !kind.empty())
    throw RankError(path + ": is " + kind + ", not an HDF5 file", MESHLM_HERE);
  if (!is_hdf5_file(path)) throw RankError(path + ": not an HDF5 file", MESHLM_HERE);
  PropList own_fapl;
  if (fapl == H5P_DEFAULT) {
    own_fapl = PropList(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
    // Parallel file systems mounted without flock() (common with Lustre)
    // make HDF5's file lock fail; go on without it there.
    H5Pset_file_locking(own_fapl, true, true);
#endif
    fapl = own_fapl;
  }
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl);
  if (id < 0)
    throw RankError(with_h5_message(path + ": cannot open HDF5 file", last_error()),
                    MESHLM_HERE);
  return File(id);
}

void close_file(File& f, const std::string& path) {
  if (f.close() < 0)
    throw RankError(with_h5_message(path + ": cannot close HDF5 file (final flush failed)",
                                    last_error()),
                    MESHLM_HERE);
}

// ---------------------------------------------------------------------------
// Groups and datasets
// ---------------------------------------------------------------------------

namespace {

// Link creation list that creates missing parent groups ("a/b" in "a/b/c").
PropList intermediate_groups() {
  PropList lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  return lcpl;
}

Dataspace make_space(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return Dataspace(H5Screate(H5S_SCALAR));
  return Dataspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
}

}  // namespace

bool exists(hid_t loc, const std::string& name) {
  // H5Lexists fails (rather than answering false) when a parent is missing,
  // so walk the path one component at a time.
  std::string prefix = name.starts_with('/') ? "/" : "";
  size_t pos = prefix.size();
  while (pos < name.size()) {
    size_t slash = name.find('/', pos);
    if (slash == std::string::npos) slash = name.size();
    if (slash > pos) {
      if (!prefix.empty() && prefix.back() != '/') prefix += '/';
      prefix += name.substr(pos, slash - pos);
      if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    pos = slash + 1;
  }
  return true;
}

Group require_group(hid_t loc, const std::string& name) {
  if (exists(loc, name))
    return Group(check(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), loc, name, "cannot open group"));
  PropList lcpl = intermediate_groups();
  return Group(check(H5Gcreate2(loc, name.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT), loc, name,
                     "cannot create group"));
}

Dataset open_dataset(hid_t loc, const std::string& name) {
  if (!exists(loc, name)) fail(loc, name, "no such dataset");
  hid_t id = H5Dopen2(loc, name.c_str(), H5P_DEFAULT);
  return Dataset(check(id, loc, name, "cannot open as a dataset"));
}

Group open_group(hid_t loc, const std::string& name) {
  if (name != "/" && !exists(loc, name)) fail(loc, name, "no such group");
  return Group(check(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), loc, name, "cannot open as a group"));
}

void release_free_lists() { H5garbage_collect(); }

std::vector<hsize_t> shape(hid_t dset) {
  Dataspace space(H5Dget_space(dset));
  int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail(dset, object_name(dset), "cannot read the shape");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

void write_dataset_raw(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                       const void* data, const std::vector<hsize_t>& dims) {
  Dataspace space = make_space(dims);
  PropList lcpl = intermediate_groups();
  Dataset dset(check(H5Dcreate2(loc, name.c_str(), file_type, space, lcpl, H5P_DEFAULT,
                                H5P_DEFAULT),
                     loc, name, "cannot create dataset"));
  hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n > 0)
    check(H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), loc, name,
          "cannot write dataset");
}

void write_scalar_raw(hid_t loc, const std::string& name, hid_t type, const void* value) {
  if (!exists(loc, name)) {
    write_dataset_raw(loc, name, type, type, value, {});
    return;
  }
  Dataset dset = open_dataset(loc, name);
  if (!shape(dset).empty()) fail(loc, name, "exists and is not a scalar");
  check(H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, value), loc, name,
        "cannot write dataset");
}

void check_type(hid_t dset, hid_t mem_type) {
  Datatype stored(H5Dget_type(dset));
  if (!converts_losslessly(stored, mem_type))
    fail(dset, object_name(dset),
         "stored as " + type_name(stored) + ", cannot be read as " + type_name(mem_type));
}

// Reads that convert (a uint16 token file read as uint32, a big-endian
// file) go through HDF5's type-conversion buffer, 1 MiB by default, which
// HDF5 keeps on its free list once made: untracked memory that appears at
// the first read of training data, after the runtime's part is measured.
// A transfer list with a buffer of kConvertBufferBytes converts in strips
// of that size instead.
constexpr size_t kConvertBufferBytes = size_t{64} << 10;

PropList read_transfer(hid_t dset, const std::string& name) {
  PropList dxpl(H5Pcreate(H5P_DATASET_XFER));
  check(dxpl, dset, name, "cannot make a transfer property list");
  check(H5Pset_buffer(dxpl, kConvertBufferBytes, nullptr, nullptr), dset, name,
        "cannot set the type-conversion buffer");
  return dxpl;
}

void read_all(hid_t dset, hid_t mem_type, void* out) {
  std::string name = object_name(dset);  // names are taken before the call they describe
  PropList dxpl = read_transfer(dset, name);
  check(H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, dxpl, out), dset, name,
        "cannot read dataset");
}

void read_rows(hid_t dset, hsize_t start, hsize_t count, hid_t mem_type, void* out) {
  if (count == 0) return;
  std::string name = object_name(dset);
  std::string range = fmt::format("[{}, {})", start, start + count);
  Dataspace fspace(H5Dget_space(dset));
  const int rank = H5Sget_simple_extent_ndims(fspace);
  check(rank, dset, name, "cannot read its shape");
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 1)), 1), offset(dims.size(), 0);
  if (rank > 0) H5Sget_simple_extent_dims(fspace, dims.data(), nullptr);
  offset[0] = start;
  dims[0] = count;
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, offset.data(), nullptr, dims.data(), nullptr),
        dset, name, "cannot select rows " + range);
  Dataspace mspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  PropList dxpl = read_transfer(dset, name);
  check(H5Dread(dset, mem_type, mspace, fspace, dxpl, out), dset, name,
        "cannot read rows " + range);
}

void read_block(hid_t dset, hsize_t r0, hsize_t nr, hsize_t c0, hsize_t nc, hid_t mem_type,
                void* out) {
  if (nr == 0 || nc == 0) return;
  const std::string name = object_name(dset);
  Dataspace fspace(H5Dget_space(dset));
  check(fspace.get(), dset, name, "cannot read its shape");
  // A vector is (n, 1) here and 1-D in the file: HDF5 reads the first entries.
  const hsize_t start[2] = {r0, c0}, count[2] = {nr, nc};
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr), dset, name,
        "cannot select a block");
  const hsize_t n = nr * nc;
  Dataspace mspace(H5Screate_simple(1, &n, nullptr));
  check(H5Dread(dset, mem_type, mspace, fspace, H5P_DEFAULT, out), dset, name,
        fmt::format("cannot read rows [{}, {})", r0, r0 + nr));
}

Dataset create_dataset(hid_t loc, const std::string& name, hid_t file_type,
                       const std::vector<hsize_t>& dims) {
  Dataspace space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  check(space.get(), loc, name, "cannot make its dataspace");
  Dataset d(H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  check(d.get(), loc, name, "cannot create the dataset");
  return d;
}

void write_rows(hid_t dset, hsize_t start, hsize_t count, hid_t mem_type, const void* data) {
  if (count == 0) return;
  const std::string name = object_name(dset);
  const std::string range = fmt::format("[{}, {})", start, start + count);
  std::vector<hsize_t> dims = shape(dset), offset(std::max<size_t>(dims.size(), 1), 0);
  if (dims.empty()) dims.push_back(1);
  offset[0] = start;
  dims[0] = count;
  Dataspace fspace(H5Dget_space(dset));
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, offset.data(), nullptr, dims.data(), nullptr),
        dset, name, "cannot select rows " + range);
  Dataspace mspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  check(H5Dwrite(dset, mem_type, mspace, fspace, H5P_DEFAULT, data), dset, name,
        "cannot write rows " + range);
}

namespace {

TypeInfo type_info(hid_t type) {
  TypeInfo t;
  t.name = type_name(type);
  t.bytes = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      t.cls = TypeInfo::Class::integer;
      t.is_unsigned = H5Tget_sign(type) == H5T_SGN_NONE;
      break;
    case H5T_FLOAT: t.cls = TypeInfo::Class::floating; break;
    case H5T_STRING: t.cls = TypeInfo::Class::string; break;
    default: break;
  }
  return t;
}

herr_t collect_object(hid_t group, const char* name, const H5L_info_t*, void* op) {
  H5O_info_t info{};
  if (H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS,
                           H5P_DEFAULT) < 0)
    return -1;
  if (info.type != H5O_TYPE_GROUP && info.type != H5O_TYPE_DATASET) return 0;
  static_cast<std::vector<ObjectInfo>*>(op)->push_back(
      {name, info.type == H5O_TYPE_GROUP, info.num_attrs});
  return 0;
}

herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* op) {
  static_cast<std::vector<std::string>*>(op)->push_back(name);
  return 0;
}

}  // namespace

TypeInfo dataset_type(hid_t dset) {
  Datatype type(H5Dget_type(dset));
  check(type.get(), dset, object_name(dset), "cannot read the type");
  return type_info(type);
}

std::vector<ObjectInfo> walk_objects(hid_t file) {
  std::vector<ObjectInfo> out;
  H5O_info_t root{};
  check(H5Oget_info2(file, &root, H5O_INFO_NUM_ATTRS), file, "/", "cannot read the root group");
  out.push_back({"", true, root.num_attrs});
  check(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_object, &out), file, "/",
        "cannot walk the groups");
  return out;
}

// ---------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

namespace {

std::string attr_label(hid_t obj, const std::string& name) {
  return object_name(obj) + "' attribute '" + name;
}

Attribute create_attr(hid_t obj, const std::string& name, hid_t type) {
  std::string label = attr_label(obj, name);
  if (has_attr(obj, name))
    check(H5Adelete(obj, name.c_str()), obj, label, "cannot replace attribute");
  Dataspace scalar(H5Screate(H5S_SCALAR));
  return Attribute(check(H5Acreate2(obj, name.c_str(), type, scalar, H5P_DEFAULT, H5P_DEFAULT),
                         obj, label, "cannot create attribute"));
}

Attribute open_attr(hid_t obj, const std::string& name) {
  std::string label = attr_label(obj, name);
  if (!has_attr(obj, name)) fail(obj, label, "no such attribute");
  return Attribute(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), obj, label,
                         "cannot open attribute"));
}

}  // namespace

void write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  // Variable-length UTF-8: h5py reads it back as a str, and its size is not
  // bounded by the 64 KiB object-header limit of fixed-size attributes.
  Datatype type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  std::string label = attr_label(obj, name);
  Attribute attr = create_attr(obj, name, type);
  const char* p = value.c_str();
  check(H5Awrite(attr, type, &p), obj, label, "cannot write attribute");
}

std::string read_string_attr(hid_t obj, const std::string& name) {
  std::string label = attr_label(obj, name);
  Attribute attr = open_attr(obj, name);
  Datatype stored(H5Aget_type(attr));
  if (H5Tget_class(stored) != H5T_STRING)
    fail(obj, label, "is " + type_name(stored) + ", not a string");
  // One string is read: an array of them would overrun the buffer below.
  Dataspace space(H5Aget_space(attr));
  if (H5Sget_simple_extent_npoints(space) != 1) fail(obj, label, "is not a single string");
  Datatype mem(H5Tcopy(H5T_C_S1));
  H5Tset_cset(mem, H5Tget_cset(stored));
  if (H5Tis_variable_str(stored) > 0) {
    H5Tset_size(mem, H5T_VARIABLE);
    char* p = nullptr;
    check(H5Aread(attr, mem, &p), obj, label, "cannot read attribute");
    std::string value = p ? p : "";
    H5free_memory(p);
    return value;
  }
  // One byte more than stored: a NUL-padded (or space-padded) string of
  // `size` characters has no terminator, and H5T_C_S1 is NUL-terminated, so
  // reading it into `size` bytes would drop its last character.
  size_t size = H5Tget_size(stored);
  H5Tset_size(mem, size + 1);
  std::string buf(size + 1, '\0');
  check(H5Aread(attr, mem, buf.data()), obj, label, "cannot read attribute");
  buf.resize(strnlen(buf.data(), size + 1));
  return buf;
}

void write_scalar_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* value) {
  std::string label = attr_label(obj, name);
  Attribute attr = create_attr(obj, name, type);
  check(H5Awrite(attr, type, value), obj, label, "cannot write attribute");
}

void read_scalar_attr_raw(hid_t obj, const std::string& name, hid_t type, void* value) {
  std::string label = attr_label(obj, name);
  Attribute attr = open_attr(obj, name);
  Dataspace space(H5Aget_space(attr));
  if (H5Sget_simple_extent_npoints(space) != 1) fail(obj, label, "is not a single value");
  Datatype stored(H5Aget_type(attr));
  if (!converts_losslessly(stored, type))
    fail(obj, label, "stored as " + type_name(stored) + ", cannot be read as " + type_name(type));
  check(H5Aread(attr, type, value), obj, label, "cannot read attribute");
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  check(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attr, &names), obj,
        object_name(obj), "cannot list the attributes");
  return names;
}

AttrInfo attr_info(hid_t obj, const std::string& name) {
  Attribute attr = open_attr(obj, name);
  Datatype type(H5Aget_type(attr));
  Dataspace space(H5Aget_space(attr));
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  return {type_info(type), n > 0 ? static_cast<size_t>(n) : 0};
}

template <typename T>
std::vector<T> read_attr_values(hid_t obj, const std::string& name) {
  const std::string label = attr_label(obj, name);
  Attribute attr = open_attr(obj, name);
  Dataspace space(H5Aget_space(attr));
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<T> v(n > 0 ? static_cast<size_t>(n) : 0);
  if (!v.empty()) check(H5Aread(attr, native_type<T>(), v.data()), obj, label, "cannot read attribute");
  return v;
}
template std::vector<int64_t> read_attr_values<int64_t>(hid_t, const std::string&);
template std::vector<uint64_t> read_attr_values<uint64_t>(hid_t, const std::string&);
template std::vector<double> read_attr_values<double>(hid_t, const std::string&);

}  // namespace meshlm::io::h5
