// `meshlm plan --calibrate FILE`: this machine's figures for the planner
// (cluster.rates; docs/planner.md, "Calibration"). Collective over the job:
// under mpiexec with two or more ranks, ranks 0 and 1 also measure MPI's
// latency and bandwidth between them.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "app/plan.h"
#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/alloc.h"
#include "core/error.h"
#include "io/h5.h"
#include "mesh/mesh.h"
#include "ops/blas.h"
#include "train/layout_search.h"

namespace meshlm {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// GFLOP/s of single-precision GEMMs (rows x n) * (n x n) on `threads`
// threads: the best of 5 after one warm-up.
double gemm_gflops(int threads, int rows, int n = 1024) {
  ops::set_threads(threads);
  std::vector<float> a(size_t(rows) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(rows) * n, 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
    ops::gemm(false, false, rows, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (rep > 0) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * rows * n * n / best / 1e9;
}

// GB/s of a triad a = b + s c over 3 x 64 MiB arrays on `threads` threads
// (bytes read and written: 3 arrays), the best of 5.
double triad_gbps(int threads) {
  const size_t n = (64u << 20) / sizeof(float);
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    if (rep > 0) best = std::min(best, seconds_since(t0));
  }
  if (a[n / 2] != 7.0f) throw RankError("calibrate: the triad computed a wrong value", MESHLM_HERE);
  return 3.0 * n * sizeof(float) / best / 1e9;
}

bool is_calibration_file(const std::string& path) {
  try {
    std::ifstream in(path);
    return json::parse(in).at("what").get<std::string>() == kCalibrateWhat;
  } catch (const std::exception&) {
    return false;
  }
}

std::string host_name() {
  std::array<char, 256> h{};
  ::gethostname(h.data(), h.size() - 1);
  return h.data();
}

}  // namespace

int cmd_plan_calibrate(MPI_Comm job, const std::string& path) {
  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  const int rank = all->rank(), size = all->size();
  // Only a file of --calibrate is replaced.
  check_all(job, rank != 0 || !std::filesystem::exists(path) || is_calibration_file(path),
            "meshlm plan --calibrate '" + path + "' exists and is not a file of --calibrate: not replaced",
            MESHLM_HERE);
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  const int node_ranks = node_rank_count(job, 0);
  json j = {{"what", kCalibrateWhat}, {"cores", cores}, {"ranks", size}};

  // A rank's runtime, as meshlm train measures it: resident after MPI's
  // start and the GEMM warm-up, outside the tracked buffers; threads as a
  // run's default (the node's cores shared by its ranks).
  ops::set_threads(std::max(1, cores / node_ranks));
  const ProcessMesh mesh(job, MeshLayout(size, 1, 1));  // a run's communicators
  {
    // HDF5 started and a file written and read, as a run's token file and
    // log: in a directory of its own (mkdtemp), so that no file is replaced.
    std::string dir = (std::filesystem::temp_directory_path() / "meshlm-calibrate-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr)
      throw RankError("meshlm plan --calibrate: cannot create a temporary directory in " +
                          std::filesystem::temp_directory_path().string(),
                      MESHLM_HERE);
    const std::string probe = dir + "/probe.h5";
    {
      io::h5::File f = io::h5::create_file(probe);
      io::h5::write_dataset(f, "tokens", std::vector<uint16_t>(4096, 1));
    }
    { io::h5::File f = io::h5::open_file(probe); }
    std::filesystem::remove_all(dir);
  }
  {
    Buffer scratch(ops::kGemmWarmUpFloats * sizeof(float), MemCategory::workspace, "OpenBLAS warm-up");
    ops::warm_up_gemm(scratch.as<float>());
  }
  const ProcessMemory now = read_process_memory();
  const size_t tracked = MemTracker::get().current_total(Device::cpu);
  j["runtime_bytes"] = now.rss > tracked ? now.rss - tracked : 0;
  j["runtime_pss_bytes"] = now.pss > tracked ? now.pss - tracked : 0;
  j["runtime_threads"] = std::max(1, cores / node_ranks);

  // MPI between ranks 0 and 1 (before anything else runs on the node).
  if (size >= 2) {
    std::string peer = host_name();
    peer.resize(256, '\0');
    if (rank == 1) all->send(peer.data(), peer.size(), DType::u8, 0).wait();
    if (rank == 0) all->recv(peer.data(), peer.size(), DType::u8, 1).wait();
    const bool same_node = rank == 0 && peer.c_str() == host_name();
    for (const size_t bytes : {size_t(8), size_t(16u << 20)}) {
      std::vector<uint8_t> buf(bytes, 1);
      const int reps = bytes <= 8 ? 2000 : 10, warm = bytes <= 8 ? 100 : 2;
      Clock::time_point t0;
      for (int i = 0; i < warm + reps; ++i) {
        if (i == warm) t0 = Clock::now();
        if (rank == 0) {
          all->send(buf.data(), bytes, DType::u8, 1).wait();
          all->recv(buf.data(), bytes, DType::u8, 1).wait();
        } else if (rank == 1) {
          all->recv(buf.data(), bytes, DType::u8, 0).wait();
          all->send(buf.data(), bytes, DType::u8, 0).wait();
        }
      }
      if (rank != 0) continue;
      const double one_way = seconds_since(t0) / reps / 2;
      const std::string where = same_node ? "intra_node" : "inter_node";
      if (bytes <= 8) j[where + "_latency_us"] = one_way * 1e6;
      else j[where + "_gbps"] = double(bytes) / one_way / 1e9;
    }
  }

  // Rank 0's compute while the others sleep (a waiting MPI rank polls).
  uint8_t go = 0;
  if (rank == 0) {
    j["gflops_per_core"] = gemm_gflops(1, 1024);
    j["gflops_all_cores"] = gemm_gflops(cores, 1024);
    json rows = json::object();
    for (const int m : {64, 256, 1024, 4096}) rows[std::to_string(m)] = gemm_gflops(cores, m);
    j["gflops_all_cores_by_rows"] = rows;
    j["memory_gbps_one_core"] = triad_gbps(1);
    j["memory_gbps_all_cores"] = triad_gbps(cores);
    for (int r = 1; r < size; ++r) all->send(&go, 1, DType::u8, r).wait();
  } else {
    comm::Handle h = all->recv(&go, 1, DType::u8, 0);
    while (!h.test()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  bool ok = true;
  std::string err;
  if (rank == 0) {
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    out.close();
    if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      ok = false;
      err = "meshlm plan --calibrate: cannot write '" + path + "'";
    }
  }
  check_all(job, ok, err, MESHLM_HERE);
  if (rank == 0) {
    fmt::print("# meshlm plan --calibrate: sgemm {:.1f} GFLOP/s on one core, {:.1f} on all {}; "
               "memory {:.1f} / {:.1f} GB/s; runtime {:.1f} MiB per rank",
               j["gflops_per_core"].get<double>(), j["gflops_all_cores"].get<double>(), cores,
               j["memory_gbps_one_core"].get<double>(), j["memory_gbps_all_cores"].get<double>(),
               j["runtime_bytes"].get<double>() / (1 << 20));
    for (const char* w : {"intra_node", "inter_node"})
      if (j.contains(std::string(w) + "_gbps"))
        fmt::print("; MPI {}: {:.2f} GB/s, {:.2f} us", w, j[std::string(w) + "_gbps"].get<double>(),
                   j[std::string(w) + "_latency_us"].get<double>());
    fmt::print(" -> {}\n", path);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace meshlm
