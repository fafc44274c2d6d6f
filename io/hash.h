// Content hashes (xxHash's XXH3) for cache keys and checksums.
//
// 128-bit hashes are written as 32 lowercase hex characters in xxHash's
// canonical (big-endian) order, the same text `xxhsum -H2 FILE` prints, so
// a key in a log can be checked by hand. 64-bit hashes are plain integers
// (`xxhsum -H3` prints them in hex).
//
// Files are hashed in chunks of kHashChunkBytes: a base model of several GiB
// is never held in memory twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

struct XXH3_state_s;  // xxhash.h's streaming state, kept out of this header

namespace meshlm::io {

inline constexpr size_t kHashChunkBytes = size_t{4} << 20;

// XXH3-128 of `bytes` bytes at `data`, as 32 hex characters.
std::string xxh3_128_hex(const void* data, size_t bytes);

// XXH3-64 of `bytes` bytes at `data`.
uint64_t xxh3_64(const void* data, size_t bytes);

// XXH3-128 of the bytes of the file at `path`, as 32 hex characters.
// `progress(done, total)` is called after every chunk (total: the file's
// size when it was opened). Throws RankError naming the file when it cannot
// be opened or read.
std::string xxh3_128_file(const std::string& path,
                          const std::function<void(size_t done, size_t total)>& progress = {});

// Streaming XXH3-128: the hash of everything passed to update(), in order,
// as if it were one buffer. Combines several files' hashes and settings into
// one key. update(string) adds the string's bytes only (no length, no NUL):
// a caller that joins fields must separate them itself.
class Xxh3_128 {
public:
  Xxh3_128();
  ~Xxh3_128();
  Xxh3_128(Xxh3_128&&) noexcept;
  Xxh3_128& operator=(Xxh3_128&&) noexcept;

  Xxh3_128& update(const void* data, size_t bytes);
  Xxh3_128& update(std::string_view s) { return update(s.data(), s.size()); }
  // The hash so far (32 hex characters); more updates may follow.
  std::string hex() const;

private:
  struct Free {
    void operator()(XXH3_state_s* s) const;
  };
  std::unique_ptr<XXH3_state_s, Free> state_;
};

// Streaming XXH3-64, as Xxh3_128: checksums over several arrays in order.
class Xxh3_64 {
public:
  Xxh3_64();
  ~Xxh3_64();
  Xxh3_64(Xxh3_64&&) noexcept;
  Xxh3_64& operator=(Xxh3_64&&) noexcept;

  Xxh3_64& update(const void* data, size_t bytes);
  uint64_t value() const;

private:
  struct Free {
    void operator()(XXH3_state_s* s) const;
  };
  std::unique_ptr<XXH3_state_s, Free> state_;
};

}  // namespace meshlm::io
