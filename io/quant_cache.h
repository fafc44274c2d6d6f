// The quantized-model cache: a frozen base model is quantized once and the
// result kept in an HDF5 file, so later runs load it instead of quantizing
// again.
//
// The quantized model lives in one contiguous byte buffer, the store (in a
// run, an MPI shared-memory window). Each logical tensor occupies a region
// of the store made of a few arrays ("data" u8, "absmax" f32 or i8, ...) at
// known byte offsets. This module does not know the quantization formats:
// the caller lists the tensors and their arrays (CacheTensor), and the cache
// copies those bytes to and from the file.
//
// File layout (format_version 1):
//
//   bytes 0-511               the HDF5 user block; starts "meshlm quantized
//                             cache\n", so that even a damaged cache is
//                             recognisably meshlm's (a file without it or
//                             /meta is "foreign" and never replaced)
//   /meta                     group; attributes:
//       format_version        int32, kQuantCacheFormatVersion
//       key                   string, the cache key (32 hex, CacheKey::key())
//       source_hash           string, XXH3-128 hex of the source bytes
//       <setting name>        string, one attribute per CacheKey setting
//                             ("quant_type" = "nf4", "block" = "64", ...)
//   /q/<tensor name>          group per tensor, named as in the model's table
//                             (dots and all: f['q']['h.0.attn.c_attn.weight']);
//                             attributes:
//       shape                 int64[ndim], the logical tensor's shape
//       format                string, the quantization format ("nf4", ...)
//       xxh3_64               uint64, XXH3-64 of the bytes of the tensor's
//                             arrays, concatenated in the order they were
//                             written (the order of CacheTensor::arrays)
//   /q/<tensor name>/<array>  1-D dataset of `count` elements, one per array
//                             of the tensor, stored as uint8 (u8), int8 (i8)
//                             or float32 (f32), contiguous, little-endian.
//
// Strings are fixed-length, NUL-terminated UTF-8 (h5py returns bytes:
// .decode()). The file uses the HDF5 1.8 format, whose metadata carries
// checksums (why: quant_cache.cpp). Groups track creation order, so h5py
// lists tensors in the order written and each tensor's arrays in checksum
// order:
//
//   g = f["q"]["h.0.attn.c_attn.weight"]
//   xxhash.xxh3_64(b"".join(g[a][()].tobytes() for a in g)).intdigest() == g.attrs["xxh3_64"]
//
// The key is XXH3-128 over "meshlm quant cache", the format version, the
// source hash and the settings sorted by name, each field as its 8-byte
// little-endian length followed by its bytes. A cache whose key differs was
// made from another source or with other settings: it is rewritten, never
// used.
//
// Writes go to "<path>.tmp.<pid>.<random>" in the same directory and are
// renamed over <path> only when complete, so a reader (or a second writer)
// sees either the old file or the new one, never a torn one. A cache damaged
// later (a crash before the data reached the disk, a bit flip) fails its
// checksums on read and is reported as corrupt.
//
// Reads and writes are serial HDF5 calls made by one process (default file
// access, no MPI-IO); the caller picks the rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace meshlm::io {

// One array of a tensor: `count` elements of `type` (u8, i8 or f32) at byte
// `offset` of the store.
struct CacheArray {
  std::string name;
  DType type;
  size_t count;
  size_t offset;  // bytes into the store
};

struct CacheTensor {
  std::string name;            // "h.0.attn.c_attn.weight"; no '/'
  std::vector<int64_t> shape;  // of the logical (unquantized) tensor
  std::string format;          // "nf4", "int8", ...
  std::vector<CacheArray> arrays;
};

struct CacheKey {
  std::string source_hash;  // XXH3-128 hex of the source bytes
  // Everything else that changes the quantized bytes, e.g. {"quant_type",
  // "nf4"}, {"block", "64"}, {"absmax_block", "256"}. Order does not matter;
  // names must be unique and not one of format_version, key, source_hash.
  std::vector<std::pair<std::string, std::string>> settings;

  // XXH3-128 hex of source_hash + settings + format version: the cache key.
  // Throws RankError for a duplicate or reserved setting name.
  std::string key() const;
};

inline constexpr int kQuantCacheFormatVersion = 1;

// hit: the store holds the cache. missing: no file at the path.
// different_key: a cache made from another source, other settings or another
// format version. corrupt: a meshlm cache (its /meta says so) that is not of
// the expected layout or fails a checksum. foreign: something at the path
// that is not recognisably a meshlm cache (not a regular file, not HDF5, no
// /meta with format_version and key): meshlm must not replace it.
enum class CacheStatus { hit, missing, different_key, corrupt, foreign };

const char* cache_status_name(CacheStatus s);  // "hit", "missing", ...

struct CacheLookup {
  CacheStatus status;
  std::string reason;  // one sentence for the log, naming the file
};

// Reads the cache at `path` into `store` (store_bytes long) when it exists,
// has the same key and layout (tensor names, shapes, formats; array names,
// types and counts) and every tensor's checksum matches. Nothing is written
// outside the listed arrays' regions; after anything but a hit their
// contents are unspecified.
//
// A bad cache file (missing, truncated, not HDF5, another layout, a failed
// checksum, another key) is answered by the status and reason, never by an
// exception. Throws RankError only for a caller's mistake: an array that
// does not fit in the store or whose type is not u8, i8 or f32, a name that
// cannot be an HDF5 link name, a duplicate name.
CacheLookup read_quant_cache(const std::string& path, const CacheKey& key,
                             const std::vector<CacheTensor>& tensors, uint8_t* store,
                             size_t store_bytes);

// Writes the whole cache to a temporary file in the directory of `path`
// (created, with its parents, when missing) and renames it over `path`.
// Two processes writing the same path at once leave one complete file; a
// failure (or an exception from `progress`) removes the temporary file and
// leaves an existing cache untouched. `progress(done, total)` is called after
// each array with the bytes written so far. Throws RankError naming `path`
// on I/O failure, and for the caller's mistakes listed at read_quant_cache.
void write_quant_cache(const std::string& path, const CacheKey& key,
                       const std::vector<CacheTensor>& tensors, const uint8_t* store,
                       size_t store_bytes,
                       const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace meshlm::io
