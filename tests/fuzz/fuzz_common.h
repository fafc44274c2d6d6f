// Shared pieces of the fuzz targets (tests/fuzz/fuzz_*.cpp):
//
//  * scratch_file(): a path in a private directory made once per process
//    (under $TMPDIR, else /tmp) and removed at exit, for readers that take a
//    path. Each target rewrites its one file on every input.
//  * ByteReader: takes decisions and bytes from the front of a fuzz input,
//    for the structured targets (a mutation of one byte changes one decision
//    of how a file is built). Past the end it answers zeros, so every input
//    is a complete description.
//
// Every target is a function `void fuzz_<name>(const uint8_t*, size_t)`
// that lets only meshlm's own errors (meshlm::Error) pass silently: any
// other exception escapes it, and libFuzzer reports it as a crash. The same
// functions replay tests/fuzz/regressions/ in tests/unit/test_fuzz_regressions.cpp
// (compiled with MESHLM_FUZZ_NO_ENTRY, without libFuzzer's entry point).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace meshlm::fuzz {

inline std::string* g_scratch_dir = nullptr;  // leaked on purpose: used from atexit

inline void remove_scratch_dir() {
  if (g_scratch_dir) {
    std::error_code ec;
    std::filesystem::remove_all(*g_scratch_dir, ec);
  }
}

// A file name inside this process's private scratch directory.
inline std::string scratch_file(const std::string& name) {
  if (!g_scratch_dir) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = (std::filesystem::path(base && *base ? base : "/tmp") /
                        "meshlm_fuzz_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      std::perror("meshlm fuzz: mkdtemp");
      std::abort();
    }
    g_scratch_dir = new std::string(tmpl);
    std::atexit(remove_scratch_dir);
  }
  return *g_scratch_dir + "/" + name;
}

// Writes the bytes to scratch_file(name) (truncating it) and returns its path.
inline std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_file(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::perror(("meshlm fuzz: cannot write " + path).c_str());
    std::abort();
  }
  return path;
}

// MESHLM_FUZZ_VERBOSE=1: the targets print how each input was answered (the
// error, the cache lookup), to see what a corpus exercises:
//   MESHLM_FUZZ_VERBOSE=1 build-fuzz/tests/fuzz/fuzz_tokens tests/fuzz/corpus/tokens/*
inline bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("MESHLM_FUZZ_VERBOSE");
    return e && std::string(e) == "1";
  }();
  return v;
}
inline void report(const char* what) {
  if (verbose()) std::fprintf(stderr, "meshlm fuzz: %s\n", what);
}

// Decisions and bytes taken from the front of the input.
class ByteReader {
public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  size_t left() const { return n_; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }
  // A number in [0, n) (n >= 1).
  unsigned pick(unsigned n) { return n <= 256 ? u8() % n : u16() % n; }
  // True with probability about 1 / n: "perturb this part of the file".
  // False past the end of the input: zeros describe the plain file.
  bool one_in(unsigned n) { return pick(n) == n - 1; }
  // Up to `max` bytes (a length byte, then the bytes).
  std::string bytes(size_t max) {
    size_t len = u8() % (max + 1);
    len = len < n_ ? len : n_;
    std::string s(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    n_ -= len;
    return s;
  }
  // Fills out[0:len] (zeros past the end of the input).
  void fill(void* out, size_t len) {
    if (len == 0) return;  // (out may be null)
    const size_t k = len < n_ ? len : n_;
    if (k > 0) std::memcpy(out, p_, k);
    std::memset(static_cast<char*>(out) + k, 0, len - k);
    p_ += k;
    n_ -= k;
  }

private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace meshlm::fuzz

// libFuzzer's entry point, calling the target's function.
#ifdef MESHLM_FUZZ_NO_ENTRY
#define MESHLM_FUZZ_ENTRY(fn)
#else
#define MESHLM_FUZZ_ENTRY(fn)                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {    \
    fn(data, size);                                                             \
    return 0;                                                                   \
  }
#endif
