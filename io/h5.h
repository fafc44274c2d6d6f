// Small HDF5 toolkit shared by meshlm's file formats (token data, run log,
// checkpoints, quantized cache).
//
//  * Owning handles: one RAII type per kind of hid_t, closed with the right
//    H5?close when they go out of scope. They convert to hid_t implicitly so
//    that they can be passed straight to the C API.
//  * Helpers for what the formats need: create/open a file, write a dataset
//    (1-D or N-D) or a scalar, write/read string and scalar attributes, read
//    a dataset into a std::vector after checking its type.
//  * File helpers: create parent directories, and AtomicWrite, which gives a
//    temporary name and renames it over the real one only when the file is
//    complete, so a failed write never leaves a half-written file behind.
//
// HDF5 prints its own error stack to stderr by default; the helpers turn
// that off and throw RankError instead, naming the file (and the dataset or
// attribute) and adding HDF5's innermost message.
//
// Object names may be paths ("memory/params/peak_bytes"); writers create the
// missing intermediate groups.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace meshlm::io::h5 {

// ---------------------------------------------------------------------------
// Owning handles
// ---------------------------------------------------------------------------

// Owns one hid_t and closes it with Close. Move-only.
template <herr_t (*Close)(hid_t)>
class Handle {
public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: pass handles to the C API as they are
  bool valid() const { return id_ >= 0; }

  // Closes now; returns the status of the close (negative on failure), so a
  // writer can tell whether the last flush of a file succeeded.
  herr_t close() {
    herr_t status = 0;
    if (id_ >= 0) status = Close(id_);
    id_ = H5I_INVALID_HID;
    return status;
  }
  void reset() { close(); }

private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Attribute = Handle<H5Aclose>;
using Datatype = Handle<H5Tclose>;  // only for types HDF5 hands out (H5Dget_type, H5Tcopy)
using PropList = Handle<H5Pclose>;

// ---------------------------------------------------------------------------
// Types: the HDF5 memory type of a C++ scalar
// ---------------------------------------------------------------------------

template <typename T>
hid_t native_type();
template <> inline hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <> inline hid_t native_type<double>() { return H5T_NATIVE_DOUBLE; }
template <> inline hid_t native_type<int8_t>() { return H5T_NATIVE_INT8; }
template <> inline hid_t native_type<uint8_t>() { return H5T_NATIVE_UINT8; }
template <> inline hid_t native_type<int16_t>() { return H5T_NATIVE_INT16; }
template <> inline hid_t native_type<uint16_t>() { return H5T_NATIVE_UINT16; }
template <> inline hid_t native_type<int32_t>() { return H5T_NATIVE_INT32; }
template <> inline hid_t native_type<uint32_t>() { return H5T_NATIVE_UINT32; }
template <> inline hid_t native_type<int64_t>() { return H5T_NATIVE_INT64; }
template <> inline hid_t native_type<uint64_t>() { return H5T_NATIVE_UINT64; }

// "uint16", "float32", "2-byte enum", ... for error messages.
std::string type_name(hid_t type);

// True when every value of the stored type `file_type` fits `mem_type` of
// the same class (integer or float) without loss, e.g. uint16 -> int32 or
// float32 -> float64, but not uint32 -> int32 nor float -> int.
bool converts_losslessly(hid_t file_type, hid_t mem_type);

// ---------------------------------------------------------------------------
// One thread at a time
// ---------------------------------------------------------------------------

// Debian's parallel HDF5 is built without thread safety, so the library may
// be entered by one thread of a process at a time. A rank has a second
// thread that calls HDF5 only while an asynchronous checkpoint is written
// (checkpoint.async, train/checkpoint.h); that writer and every entry point
// the main thread may call meanwhile (the token reader, the run log) hold
// this lock. Recursive: an entry point may call another.
class LibraryLock {
public:
  LibraryLock();  // blocks while another thread holds it
  ~LibraryLock();
  LibraryLock(const LibraryLock&) = delete;
  LibraryLock& operator=(const LibraryLock&) = delete;
  // Lets a thread that is waiting for the lock have it, then takes it
  // again: the writer's call between blocks of a long write, so the main
  // thread waits for one block at most. Only at the outermost level.
  void yield();
  // Seconds the calling thread has spent waiting for the lock while
  // another thread held it, since the thread began.
  static double waited_seconds();
};

// ---------------------------------------------------------------------------
// Errors and names
// ---------------------------------------------------------------------------

// Turns off HDF5's printing of its error stack (process-wide); failures are
// reported through exceptions instead. Every open/create helper calls it.
void silence_errors();

// HDF5's innermost message for the most recent failure ("" when none).
std::string last_error();

// Name of the file that holds object `obj` (as it was opened).
std::string file_name(hid_t obj);

// Object path of `obj` inside its file ("/metrics/loss").
std::string object_name(hid_t obj);

// Throws RankError "<file>: '<name>': <what>" for the object `name` below
// `loc`. check() does so when `status` < 0 and adds HDF5's own message; it
// returns `status` otherwise (ids are statuses too: negative means failure).
// Pass plain strings: any HDF5 call made between the failing call and
// check() would clear the message it reports.
[[noreturn]] void fail(hid_t loc, const std::string& name, const std::string& what);
int64_t check(int64_t status, hid_t loc, const std::string& name, const std::string& what);

// ---------------------------------------------------------------------------
// Files and paths
// ---------------------------------------------------------------------------

// Creates the directories above `path` (nothing when it has none).
void create_parent_dirs(const std::string& path);

// True when `path` carries the HDF5 signature (at offset 0 or at a user-block
// offset 512, 1024, 2048, ...). False for unreadable or missing files, and
// for anything but a regular file (a FIFO is not opened: that would block).
bool is_hdf5_file(const std::string& path);

// A file written under a temporary name "<path>.tmp.<host>.<pid>.<random>"
// (core/files.h: removed if the process is ended by a signal, or by the next
// writer when its process is gone) and renamed onto
// `path` by commit(). If commit() is never reached (an exception), the
// destructor removes the temporary file. The parent directories of `path`
// are created by the constructor.
class AtomicWrite {
public:
  explicit AtomicWrite(std::string path);
  ~AtomicWrite();
  AtomicWrite(const AtomicWrite&) = delete;
  AtomicWrite& operator=(const AtomicWrite&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }
  // Flushes the temporary file to disk (fsync), renames it onto path() and
  // flushes the directory; the file must be closed.
  void commit();

private:
  std::string path_, tmp_;
  bool committed_ = false;
  int slot_ = -1;  // in the registry of temporary files removed on a signal
};

// Creates (truncates) a file. `fapl` selects the driver (H5P_DEFAULT: serial);
// `fcpl` the creation properties (e.g. a user block).
File create_file(const std::string& path, hid_t fapl = H5P_DEFAULT, hid_t fcpl = H5P_DEFAULT);
// Opens an existing file read-only, or read-write when `writable`. With the
// default `fapl`, a file system without file locks (flock) is no error.
// RankError naming the file when it is missing, not a regular file (a FIFO,
// a directory: refused by name, never opened) or not HDF5.
File open_file(const std::string& path, bool writable = false, hid_t fapl = H5P_DEFAULT);
// Closes a file that was written, checking that the final flush succeeded.
void close_file(File& f, const std::string& path);

// ---------------------------------------------------------------------------
// Groups and datasets
// ---------------------------------------------------------------------------

// True when the object `name` exists below `loc` (every component of a path
// is checked, so "a/b/c" is false rather than an error when "a" is missing).
bool exists(hid_t loc, const std::string& name);

// Opens the group `name`, creating it and any missing parents.
Group require_group(hid_t loc, const std::string& name);

Dataset open_dataset(hid_t loc, const std::string& name);
// Opens the existing group `name` ("/" for the root); a missing one, or an
// object that is not a group, fails naming the file and the path.
Group open_group(hid_t loc, const std::string& name);

// Frees HDF5's internal free lists (H5garbage_collect): memory a large read
// no longer uses goes back to the allocator.
void release_free_lists();

// The shape of a dataset (empty for a scalar).
std::vector<hsize_t> shape(hid_t dset);

// Writes a new dataset `name` of shape `dims` (row-major) with the file type
// equal to T's native type.
template <typename T>
void write_dataset(hid_t loc, const std::string& name, const T* data,
                   const std::vector<hsize_t>& dims);
template <typename T>
void write_dataset(hid_t loc, const std::string& name, const std::vector<T>& data) {
  write_dataset(loc, name, data.data(), {static_cast<hsize_t>(data.size())});
}

// Lower-level form: any stored type `file_type` (e.g. H5T_STD_U16LE for data
// held in memory as uint32 -- HDF5 converts on the way). `mem_type` is the
// type of `data`.
void write_dataset_raw(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                       const void* data, const std::vector<hsize_t>& dims);

// Writes a scalar dataset, or overwrites the value of an existing one.
template <typename T>
void write_scalar(hid_t loc, const std::string& name, T value);

// Reads a whole dataset. Throws unless its stored type converts to T
// without loss; `dims`, when given, receives its shape.
template <typename T>
std::vector<T> read_dataset(hid_t loc, const std::string& name,
                            std::vector<hsize_t>* dims = nullptr);

// Reads rows [start, start + count) (along the first dimension; of a 1-D
// dataset, elements) of an open dataset into `out` (memory type
// `mem_type`), without loading the rest.
void read_rows(hid_t dset, hsize_t start, hsize_t count, hid_t mem_type, void* out);

// Reads the block rows [r0, r0 + nr) x columns [c0, c0 + nc) of a 2-D
// dataset (of a 1-D one read as (n, 1): c0 = 0, nc = 1) into `out`, row-major.
void read_block(hid_t dset, hsize_t r0, hsize_t nr, hsize_t c0, hsize_t nc, hid_t mem_type,
                void* out);

// Creates the dataset `name` of stored type `file_type` and shape `dims`,
// for write_rows to fill.
Dataset create_dataset(hid_t loc, const std::string& name, hid_t file_type,
                       const std::vector<hsize_t>& dims);
// Writes rows [start, start + count) (along the first dimension) of an open
// dataset from `data` (memory type `mem_type`, row-major).
void write_rows(hid_t dset, hsize_t start, hsize_t count, hid_t mem_type, const void* data);

// What a stored type is, as the `meshlm ckpt` tools show it.
struct TypeInfo {
  std::string name;  // type_name's
  enum class Class { integer, floating, string, other } cls = Class::other;
  bool is_unsigned = false;
  size_t bytes = 0;
};
TypeInfo dataset_type(hid_t dset);

// One group or dataset of a file: its path without the leading '/' ("" for
// the root), and its number of attributes.
struct ObjectInfo {
  std::string path;
  bool is_group = false;
  hsize_t num_attrs = 0;
};
// The root, then every group and dataset below it, depth-first in name order.
std::vector<ObjectInfo> walk_objects(hid_t file);

// ---------------------------------------------------------------------------
// Attributes (on a file, group or dataset; replaced when they exist)
// ---------------------------------------------------------------------------

// The names of `obj`'s attributes, in name order.
std::vector<std::string> attr_names(hid_t obj);
// An attribute's type and number of values (1 for a scalar).
struct AttrInfo {
  TypeInfo type;
  size_t count = 0;
};
AttrInfo attr_info(hid_t obj, const std::string& name);
// All values of a numeric attribute, converted to T (int64_t, uint64_t or double).
template <typename T>
std::vector<T> read_attr_values(hid_t obj, const std::string& name);

bool has_attr(hid_t obj, const std::string& name);
void write_string_attr(hid_t obj, const std::string& name, const std::string& value);
std::string read_string_attr(hid_t obj, const std::string& name);

template <typename T>
void write_scalar_attr(hid_t obj, const std::string& name, T value);
// Throws unless the attribute is a scalar whose type converts to T losslessly.
template <typename T>
T read_scalar_attr(hid_t obj, const std::string& name);

// Untyped cores of the templates above (defined in h5.cpp).
void write_scalar_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* value);
void read_scalar_attr_raw(hid_t obj, const std::string& name, hid_t type, void* value);
void write_scalar_raw(hid_t loc, const std::string& name, hid_t type, const void* value);
// Throws unless the stored type of `dset` converts to `mem_type` losslessly.
void check_type(hid_t dset, hid_t mem_type);
// Reads all of `dset` into `out` (memory type `mem_type`).
void read_all(hid_t dset, hid_t mem_type, void* out);

// ---------------------------------------------------------------------------
// Template definitions
// ---------------------------------------------------------------------------

template <typename T>
void write_dataset(hid_t loc, const std::string& name, const T* data,
                   const std::vector<hsize_t>& dims) {
  write_dataset_raw(loc, name, native_type<T>(), native_type<T>(), data, dims);
}

template <typename T>
void write_scalar(hid_t loc, const std::string& name, T value) {
  write_scalar_raw(loc, name, native_type<T>(), &value);
}

template <typename T>
std::vector<T> read_dataset(hid_t loc, const std::string& name, std::vector<hsize_t>* dims) {
  Dataset dset = open_dataset(loc, name);
  check_type(dset, native_type<T>());
  std::vector<hsize_t> d = shape(dset);
  size_t n = 1;
  for (hsize_t x : d) n *= static_cast<size_t>(x);
  std::vector<T> out(n);
  if (n > 0) read_all(dset, native_type<T>(), out.data());
  if (dims) *dims = std::move(d);
  return out;
}

template <typename T>
void write_scalar_attr(hid_t obj, const std::string& name, T value) {
  write_scalar_attr_raw(obj, name, native_type<T>(), &value);
}

template <typename T>
T read_scalar_attr(hid_t obj, const std::string& name) {
  T value{};
  read_scalar_attr_raw(obj, name, native_type<T>(), &value);
  return value;
}

}  // namespace meshlm::io::h5
