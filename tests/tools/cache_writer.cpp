// meshlm_cache_writer: writes or reads one quantization cache in a loop, so
// that tests/cli/concurrent_cache_writers.sh can race writers against each
// other and against a reader.
//
//   meshlm_cache_writer write PATH MIB SEED ROUNDS
//       writes a cache of about MIB MiB whose bytes derive from SEED, ROUNDS
//       times over PATH.
//   meshlm_cache_writer check PATH MIB SEEDS STOP_FILE
//       reads PATH over and over until STOP_FILE exists, then once more.
//       Every read must find no file yet (missing) or a whole cache: a hit
//       whose bytes are all those of one of SEEDS (comma-separated), so a
//       file mixing two writers' tensors fails too. Exits 1 otherwise, or
//       when the last read is not a hit.
//
// Every writer and reader uses the same key and layout; only the bytes
// differ between seeds.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_session.h"
#include "io/quant_cache.h"

using namespace meshlm;
using namespace meshlm::io;

namespace {

constexpr int kTensors = 8;

struct Model {
  std::vector<CacheTensor> tensors;
  std::vector<uint8_t> store;
};

// kTensors nf4-like tensors sharing about `mib` MiB.
Model make_layout(size_t mib) {
  Model m;
  const size_t data = (mib << 20) / kTensors / 64 * 64;
  size_t at = 0;
  auto array = [&at](const char* name, DType type, size_t count) {
    CacheArray a{name, type, count, at};
    at = (at + count * dtype_size(type) + 15) / 16 * 16;
    return a;
  };
  for (int i = 0; i < kTensors; ++i) {
    CacheTensor t{"h." + std::to_string(i) + ".mlp.c_fc.weight",
                  {static_cast<int64_t>(data / 64), 128},
                  "nf4",
                  {}};
    t.arrays.push_back(array("data", DType::u8, data));
    t.arrays.push_back(array("absmax", DType::i8, data / 32));
    t.arrays.push_back(array("absmax2", DType::f32, data / 32 / 256 + 1));
    t.arrays.push_back(array("offset", DType::f32, 1));
    m.tensors.push_back(std::move(t));
  }
  m.store.assign(at, 0);
  return m;
}

// The bytes of every array: splitmix64 of (seed, position), floats kept
// finite. The gaps between arrays stay zero, as a read leaves them.
void fill(Model& m, uint64_t seed) {
  for (const CacheTensor& t : m.tensors)
    for (const CacheArray& a : t.arrays) {
      const size_t end = a.offset + a.count * dtype_size(a.type);
      for (size_t i = a.offset; i < end; i += 8) {
        uint64_t z = seed * 0x9e3779b97f4a7c15ull + i;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        std::memcpy(&m.store[i], &z, std::min<size_t>(8, end - i));
      }
      // Floats with the exponent's top bit clear: finite (|x| < 2), as the
      // reader requires of a cache's scales.
      if (a.type == DType::f32)
        for (size_t i = a.offset + 3; i < end; i += 4) m.store[i] &= 0xBF;
    }
}

CacheKey test_key() { return CacheKey{"0123456789abcdef0123456789abcdef", {{"quant_type", "nf4"}}}; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int write_loop(const std::string& path, size_t mib, uint64_t seed, int rounds) {
  Model m = make_layout(mib);
  fill(m, seed);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r)
    write_quant_cache(path, test_key(), m.tensors, m.store.data(), m.store.size());
  std::printf("write seed %llu: %d rounds of %zu bytes in %.2f s\n",
              static_cast<unsigned long long>(seed), rounds, m.store.size(), seconds_since(t0));
  return 0;
}

int check_loop(const std::string& path, size_t mib, const std::string& seed_list,
               const std::string& stop_file) {
  std::map<uint64_t, Model> expected;
  std::stringstream ss(seed_list);
  for (std::string s; std::getline(ss, s, ',');) {
    uint64_t seed = std::stoull(s);
    expected[seed] = make_layout(mib);
    fill(expected[seed], seed);
  }
  Model got = make_layout(mib);
  std::map<uint64_t, int> hits;
  int reads = 0, missing = 0, bad = 0;
  bool last_hit = false;
  auto t0 = std::chrono::steady_clock::now();
  for (bool stop = false; !stop;) {
    // Stop after the read that follows the stop file: the writers are done.
    stop = std::filesystem::exists(stop_file) || seconds_since(t0) > 300;
    CacheLookup r = read_quant_cache(path, test_key(), got.tensors, got.store.data(),
                                     got.store.size());
    ++reads;
    last_hit = false;
    if (r.status == CacheStatus::missing) {
      ++missing;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // leave the cores to the writers
    } else if (r.status != CacheStatus::hit) {
      ++bad;
      std::printf("read %d: %s: %s\n", reads, cache_status_name(r.status), r.reason.c_str());
    } else {
      bool whole = false;
      for (const auto& [seed, m] : expected)
        if (got.store == m.store) {
          ++hits[seed];
          whole = last_hit = true;
        }
      if (!whole) {
        ++bad;
        std::printf("read %d: a hit whose bytes are no single writer's\n", reads);
      }
    }
  }
  std::printf("check: %d reads in %.2f s: %d missing, %d bad, hits", reads, seconds_since(t0),
              missing, bad);
  for (const auto& [seed, n] : hits)
    std::printf(" (seed %llu: %d)", static_cast<unsigned long long>(seed), n);
  std::printf("\n");
  if (!last_hit) std::printf("the last read, after the writers ended, was no hit\n");
  return bad == 0 && last_hit ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Parallel HDF5 is linked in; keep MPI initialised as in every meshlm program.
  comm::prefer_isolated_singleton();
  MPI_Init(&argc, &argv);
  int rc = 2;
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 6)
      rc = write_loop(argv[2], std::stoul(argv[3]), std::stoull(argv[4]), std::stoi(argv[5]));
    else if (mode == "check" && argc == 6)
      rc = check_loop(argv[2], std::stoul(argv[3]), argv[4], argv[5]);
    else
      std::fprintf(stderr,
                   "usage: meshlm_cache_writer write PATH MIB SEED ROUNDS\n"
                   "       meshlm_cache_writer check PATH MIB SEEDS STOP_FILE\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ERROR: %s\n", e.what());
    rc = 1;
  }
  std::fflush(stdout);
  MPI_Finalize();
  return rc;
}
