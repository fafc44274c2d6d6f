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
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
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
#include "ops/ops.h"
#include "train/layout_search.h"

namespace meshlm {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// GFLOP/s of single-precision GEMMs (rows x n) * (n x n) on `threads`
// threads: the best of `reps` after one warm-up.
double gemm_gflops(int threads, int rows, int reps = 5, int n = 1024) {
  ops::set_threads(threads);
  std::vector<float> a(size_t(rows) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(rows) * n, 0.0f);
  double best = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = Clock::now();
    ops::gemm(false, false, rows, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (rep > 0) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * rows * n * n / best / 1e9;
}

// Figures of several rounds of the same measurement, each the best of its
// rounds: the least of nanoseconds per element (keys ending in "_ns"), the
// most of rates; objects key by key.
void keep_best(json& best, const json& round, bool least = false) {
  if (round.is_object()) {
    for (const auto& [key, value] : round.items()) {
      if (!best.contains(key)) best[key] = value;
      else keep_best(best[key], value, key.size() > 3 && key.ends_with("_ns"));
    }
  } else if (round.is_number()) {
    const double a = best.get<double>(), b = round.get<double>();
    best = least ? std::min(a, b) : std::max(a, b);
  }
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

// More than a CPU's last-level cache holds (32 MiB here, 2 x 1 MiB of L2).
constexpr size_t kColdBytes = size_t{96} << 20;

// The best of `reps` timings of `f` after one warm-up, in seconds; fewer
// (2 at least) once the timed ones took `enough` seconds.
template <typename F>
double best_of(int reps, double enough, F&& f) {
  double best = 1e30, spent = 0;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = Clock::now();
    f();
    if (rep == 0) continue;
    const double t = seconds_since(t0);
    best = std::min(best, t);
    spent += t;
    if (rep >= 2 && spent >= enough) break;
  }
  return best;
}
template <typename F>
double best_of(int reps, F&& f) {
  return best_of(reps, std::numeric_limits<double>::infinity(), std::forward<F>(f));
}

// The ops outside GEMMs on `threads` threads, as the step runs them on a
// rank, at shapes whose buffers do not fit in cache: nanoseconds per element
// of each op class (GELU per element of its (N, 4C) input, LayerNorm per
// element of (N, C) with its residual, the cross-entropy per logit, AdamW per
// parameter with the gradient norm's sum of squares), and the attention's
// GFLOP/s on its nominal 4 B T^2 C forward and 8 B T^2 C backward FLOPs,
// both kinds (probabilities and flash), by head size; and meshlm's linear
// layer by rows and width. Each the best of `reps` after a warm-up.
json op_rates(int threads, int reps) {
  ops::set_threads(threads);
  json r = json::object();
  {
    const size_t n = size_t(8192) * 1536;
    std::vector<float> x(n), y(n), d(n, 0.1f);
    // Pre-activations as a layer's are: normal, of a layer's spread (c_fc's
    // outputs at GPT-2's initialisation have a standard deviation of 0.02
    // sqrt(C), 0.4 at C 384 and 0.55 at 768). The float GELU's e^x is
    // vectorised (ops/vec_math.h) and takes the same time for any value;
    // libm's tanhf, which it replaced, did not (14.3 ns an element on one
    // core at 0.4, 17.2 at 1).
    std::mt19937 gen(12345);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (float& v : x) v = normal(gen);
    r["gelu_forward_ns"] = best_of(reps, [&] { ops::gelu_forward(y.data(), x.data(), n); }) / n * 1e9;
    r["gelu_backward_ns"] =
        best_of(reps, [&] { ops::gelu_backward(y.data(), x.data(), d.data(), n); }) / n * 1e9;
  }
  {
    const int N = 8192, C = 768;
    const size_t n = size_t(N) * C;
    std::vector<float> a(n, 0.5f), b(n, 0.25f), res(n), out(n), dout(n, 0.1f), din(n);
    std::vector<float> w(C, 1.0f), bias(C, 0.0f), dw(C), db(C), mean(N), rstd(N);
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 97) * 0.01f;
    // Forward: one LayerNorm, and one residual with its LayerNorm (each
    // layer has one of each, counted as two LayerNorms per layer).
    r["norm_forward_ns"] = best_of(reps, [&] {
                             ops::layernorm_forward(out.data(), mean.data(), rstd.data(), a.data(),
                                                    w.data(), bias.data(), N, C);
                             ops::residual_layernorm_forward(res.data(), out.data(), mean.data(),
                                                             rstd.data(), a.data(), b.data(), w.data(),
                                                             bias.data(), N, C);
                           }) / (2.0 * n) * 1e9;
    r["norm_backward_ns"] = best_of(reps, [&] {
                              for (int k = 0; k < 2; ++k)
                                ops::layernorm_backward(din.data(), dw.data(), db.data(), dout.data(),
                                                        a.data(), w.data(), mean.data(), rstd.data(), N,
                                                        C);
                              ops::residual_backward(res.data(), out.data(), dout.data(), n);
                            }) / (2.0 * n) * 1e9;
  }
  {
    const int N = 1024, V = 8192;
    const size_t n = size_t(N) * V;
    std::vector<float> logits(n), rowmax(N), sums(2 * size_t(N)), losses(N), dl(N, 1.0f / N);
    std::vector<int32_t> targets(N);
    for (int i = 0; i < N; ++i) targets[size_t(i)] = (i * 131) % V;
    for (size_t i = 0; i < n; ++i) logits[i] = static_cast<float>(i % 251) * 0.01f;
    r["xent_forward_ns"] = best_of(reps, [&] {
                             ops::xent_local_max(rowmax.data(), logits.data(), N, V, 0, V);
                             ops::xent_local_sums(sums.data(), logits.data(), rowmax.data(),
                                                  targets.data(), N, V, 0, V);
                             ops::xent_losses(losses.data(), rowmax.data(), sums.data(), N);
                           }) / n * 1e9;
    // In place: each timing turns the previous one's gradient into the next.
    r["xent_backward_ns"] = best_of(reps, [&] {
                              ops::xent_local_backward(logits.data(), rowmax.data(), sums.data(),
                                                       dl.data(), targets.data(), N, V, 0, V);
                            }) / n * 1e9;
  }
  {
    const size_t n = size_t(1) << 22;
    std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    const ops::AdamWSegment seg{0, n, true};
    const ops::AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};
    double sink = 0;
    r["adamw_ns"] = best_of(reps, [&] {
                      sink += ops::sum_of_squares(g.data(), n);
                      ops::adamw_update(p.data(), g.data(), m.data(), v.data(), {&seg, 1}, h);
                      std::fill(g.begin(), g.end(), 0.01f);
                    }) / n * 1e9;
    if (!(sink > 0)) throw RankError("calibrate: the gradient norm computed a wrong value", MESHLM_HERE);
  }
  // By head size (the inner dimension of the score products), at 2^19
  // channels of sequence: T = 256, B = 4, 512 channels.
  for (const int hs : {32, 64, 128}) {
    const int B = 4, T = 256, C = 512, NH = C / hs;
    const double fwd = 4.0 * B * T * T * C, bwd = 8.0 * B * T * T * C;
    std::vector<float> qkv(size_t(B) * T * 3 * C), out(size_t(B) * T * C), dout(out.size(), 0.01f);
    std::vector<float> dqkv(qkv.size()), att(size_t(B) * NH * T * T), datt(att.size());
    std::vector<float> lse(size_t(B) * NH * T), delta(lse.size());
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 113) * 0.002f;
    const std::string h = std::to_string(hs);
    r["attention_forward_gflops_by_head_size"][h] =
        fwd / best_of(reps, [&] { ops::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH); }) / 1e9;
    r["attention_backward_gflops_by_head_size"][h] =
        bwd / best_of(reps, [&] {
          ops::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T,
                                  C, NH);
        }) / 1e9;
    r["flash_attention_forward_gflops_by_head_size"][h] =
        fwd / best_of(reps, [&] {
          ops::flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
        }) / 1e9;
    r["flash_attention_backward_gflops_by_head_size"][h] =
        bwd / best_of(reps, [&] {
          ops::flash_attention_backward(dqkv.data(), delta.data(), dout.data(), out.data(),
                                        qkv.data(), lse.data(), B, T, C, NH);
        }) / 1e9;
  }
  // A block's four linear layers (forward and backward: C -> 3C, C -> C,
  // C -> 4C, 4C -> C) by rows and width, in GFLOP/s: the GEMMs' rate at the
  // shapes of a step, on weights out of cache as a step's are. Each the best
  // of at most `reps`, fewer (2 at least) once they took 0.3 s; 2048 rows
  // only at the narrow width (72 N C^2 FLOPs: 0.9 s a rep at C 768 on one
  // core).
  for (const int C : {256, 768})
    for (const int N : {128, 512, 2048}) {
      if (N == 2048 && C > 256) continue;
      const std::array<std::pair<int, int>, 4> shapes = {{{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}};
      std::vector<float> inp(size_t(N) * 4 * C, 0.01f), bias(size_t(4) * C);
      std::vector<float> out(size_t(N) * 4 * C), dout(out.size(), 0.001f), din(inp.size());
      std::vector<float> db(bias.size());
      // A step's layers: each rep's weights and gradients are ones the reps
      // before have not touched since kColdBytes of others (a step streams
      // its layers through the cache).
      const size_t layer = size_t(12) * C * C;
      const int layers = static_cast<int>(kColdBytes / (2 * layer * sizeof(float)) + 1);
      std::vector<float> ws(layer * size_t(layers), 0.02f), dws(ws.size(), 0.0f);
      int next = 0;
      const double s = best_of(reps, 0.3, [&] {
        float* w = ws.data() + layer * size_t(next);
        float* dw = dws.data() + layer * size_t(next);
        next = (next + 1) % layers;
        for (const auto& [in, oc] : shapes) {
          ops::matmul_forward(out.data(), inp.data(), w, bias.data(), N, in, oc);
          ops::matmul_backward(din.data(), dw, db.data(), dout.data(), inp.data(), w, N, in, oc);
          w += size_t(in) * oc;
          dw += size_t(in) * oc;
        }
      });
      r["matmul_gflops_by_width_and_rows"][std::to_string(C)][std::to_string(N)] =
          3.0 * 2.0 * N * 12.0 * C * C / s / 1e9;
    }
  return r;
}

// One rank's share of a step in small: meshlm's linear layer forward and
// backward (512 rows, 512 -> 2048) and a GELU over its output, 16 times, on
// one thread. Returns its seconds.
double shared_work() {
  ops::set_threads(1);
  const int N = 512, C = 512;
  std::vector<float> inp(size_t(N) * C, 0.01f), w(size_t(4) * C * C, 0.02f), bias(size_t(4) * C);
  std::vector<float> out(size_t(N) * 4 * C), g(out.size()), dout(out.size(), 0.001f), din(inp.size());
  std::vector<float> dw(w.size()), db(bias.size());
  const auto t0 = Clock::now();
  for (int rep = 0; rep < 16; ++rep) {
    ops::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, 4 * C);
    ops::gelu_forward(g.data(), out.data(), out.size());
    ops::matmul_backward(din.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                         4 * C);
  }
  return seconds_since(t0);
}

// Waits for a message of one byte from `peer` without taking a core (a
// waiting MPI rank polls).
void sleep_until_recv(comm::Communicator& c, int peer) {
  uint8_t b = 0;
  comm::Handle h = c.recv(&b, 1, DType::u8, peer);
  while (!h.test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// How well a node's cores serve ranks that share them: for k = the cores,
// twice, four times ... (up to the job's ranks, which must then all be on
// one node), the first k ranks run shared_work() at once, one thread each;
// the time from rank 0's start signal to the last one's end is set against
// k / cores times one rank's alone: the efficiency by ranks per core (1:
// the cores are shared without loss). Each round runs kSharingRepeats times
// and its fastest counts, alone and shared alike: a single round moved the
// figure at 1 rank per core from 0.97 to 0.79 when the machine was busy for
// a moment, and the planner's multi-rank estimates with it.
constexpr int kSharingRepeats = 3;

json sharing_efficiency(comm::Communicator& c, int cores) {
  const int rank = c.rank(), size = c.size();
  uint8_t go = 1;
  json r = json::object();
  double alone = 0;
  std::vector<int> ks = {1};
  for (int k = std::max(cores, 2); k <= size; k *= 2) ks.push_back(k);
  for (const int k : ks) {
    double best = std::numeric_limits<double>::infinity();
    for (int rep = 0; rep < kSharingRepeats; ++rep) {
      if (rank == 0) {
        const auto t0 = Clock::now();
        for (int p = 1; p < k; ++p) c.send(&go, 1, DType::u8, p).wait();
        shared_work();
        for (int p = 1; p < k; ++p) sleep_until_recv(c, p);
        best = std::min(best, seconds_since(t0));
      } else if (rank < k) {
        sleep_until_recv(c, 0);
        shared_work();
        c.send(&go, 1, DType::u8, 0).wait();
      }
    }
    if (rank != 0) continue;
    if (k == 1) alone = best;
    else r[fmt::format("{:g}", double(k) / cores)] = alone * k / cores / best;
  }
  // The ranks left out of the last round wait here, asleep, not in MPI.
  if (rank == 0)
    for (int p = 1; p < size; ++p) c.send(&go, 1, DType::u8, p).wait();
  else
    sleep_until_recv(c, 0);
  return r;
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

// A rank's runtime, as meshlm train measures it: resident after MPI's start
// (the caller's mesh: a run's communicators), HDF5's and the GEMM warm-up,
// outside the tracked buffers; threads as a run's default (the node's cores
// shared by its ranks).
void measure_runtime(json& j, int cores, int node_ranks) {
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
}

// ZeRO 2's reduction of one micro-batch's gradients to their owners, as
// Zero::reduce_to_owners runs it in a backward over a dp group of ranks 0
// and 1: each rank computes a layer's backward (meshlm's linear layer, 128
// rows of 256 -> 1024, one thread), then reduces a bucket of
// kZero2BucketFloats (a layer's gradients), each half to the rank that owns
// it (the owner first adds what its shard holds), and zeroes the bucket.
// The seconds beyond the backward alone (the reduction, its copies and adds,
// and the wait for the partner's backward, whose length varies from layer
// to layer as a step's does) per bucket: the mean of kZero2Reps after 2 of
// warm-up (a step pays every slow one), against the fastest backward alone.
// Returns the bucket's bytes per second on rank 0 (0 elsewhere). The other
// ranks take no part: `pair` is MPI_COMM_NULL on them.
static constexpr size_t kZero2BucketFloats = size_t{1} << 20;
static constexpr int kZero2Reps = 21;

static double zero2_reduce_gbps(MPI_Comm pair) {
  if (pair == MPI_COMM_NULL) return 0;
  ops::set_threads(1);
  std::unique_ptr<comm::Communicator> dp = comm::make_mpi_communicator(pair);
  const ops::Kernels& k = ops::Kernels::cpu();
  const size_t P = kZero2BucketFloats, half = P / 2;
  Buffer bucket(P * sizeof(float), MemCategory::grads, "calibrate.zero2_bucket");
  Buffer owned(half * sizeof(float), MemCategory::grads, "calibrate.zero2_shard");
  k.zero(owned.as<float>(), half);
  const int N = 128, C = 256;
  std::vector<float> inp(size_t(N) * C, 0.01f), w(size_t(4) * C * C, 0.02f), dout(size_t(N) * 4 * C, 0.001f);
  std::vector<float> din(inp.size()), dw(w.size()), db(size_t(4) * C);
  const auto backward = [&] {
    ops::matmul_backward(din.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, 4 * C);
  };
  const int me = dp->rank();
  double alone = std::numeric_limits<double>::infinity();
  std::vector<double> extra;
  for (int rep = 0; rep < 2 + kZero2Reps; ++rep) {
    k.fill(bucket.as<float>(), 1.0f, P);
    dp->barrier();
    auto t0 = Clock::now();
    backward();
    alone = std::min(alone, seconds_since(t0));
    dp->barrier();
    t0 = Clock::now();
    backward();
    for (int owner = 0; owner < 2; ++owner) {
      float* part = bucket.as<float>() + size_t(owner) * half;
      if (me == owner) k.add(part, owned.as<float>(), half);
      dp->reduce(part, owned.as<float>(), half, DType::f32, comm::ReduceOp::sum, owner).wait();
    }
    k.zero(bucket.as<float>(), P);
    if (rep >= 2) extra.push_back(seconds_since(t0));
  }
  double sum = 0;
  for (const double e : extra) sum += e - alone;
  return me == 0 ? double(P * sizeof(float)) / std::max(sum / double(extra.size()), 1e-9) / 1e9 : 0;
}

// MPI between ranks 0 and 1 (before anything else runs on the node): the
// latency of 8 bytes and the bandwidth of 16 MiB, one way, within or
// between nodes as the two ranks are placed.
void measure_mpi(json& j, comm::Communicator& all, MPI_Comm all_comm) {
  const int rank = all.rank();
  if (all.size() >= 2) {
    std::string peer = host_name();
    peer.resize(256, '\0');
    if (rank == 1) all.send(peer.data(), peer.size(), DType::u8, 0).wait();
    if (rank == 0) all.recv(peer.data(), peer.size(), DType::u8, 1).wait();
    const bool same_node = rank == 0 && peer.c_str() == host_name();
    for (const size_t bytes : {size_t(8), size_t(16u << 20)}) {
      std::vector<uint8_t> buf(bytes, 1);
      const int reps = bytes <= 8 ? 2000 : 10, warm = bytes <= 8 ? 100 : 2;
      Clock::time_point t0;
      for (int i = 0; i < warm + reps; ++i) {
        if (i == warm) t0 = Clock::now();
        if (rank == 0) {
          all.send(buf.data(), bytes, DType::u8, 1).wait();
          all.recv(buf.data(), bytes, DType::u8, 1).wait();
        } else if (rank == 1) {
          all.recv(buf.data(), bytes, DType::u8, 0).wait();
          all.send(buf.data(), bytes, DType::u8, 0).wait();
        }
      }
      if (rank != 0) continue;
      const double one_way = seconds_since(t0) / reps / 2;
      const std::string where = same_node ? "intra_node" : "inter_node";
      if (bytes <= 8) j[where + "_latency_us"] = one_way * 1e6;
      else j[where + "_gbps"] = double(bytes) / one_way / 1e9;
    }
    const std::unique_ptr<comm::OwnedComm> pair = comm::OwnedComm::first_ranks(all_comm, 2);
    const double gbps = zero2_reduce_gbps(pair->get());
    if (rank == 0) j[same_node ? "intra_node_zero2_reduce_gbps" : "inter_node_zero2_reduce_gbps"] = gbps;
  }
}

constexpr int kAllCoresRounds = 3;

// Rank 0's compute while the others sleep (a waiting MPI rank polls): GEMM
// rates by cores and rows, memory bandwidth, the op classes; then the cores'
// sharing efficiency, when every rank is on rank 0's node.
void measure_compute(json& j, comm::Communicator& all, int cores, int node_ranks) {
  const int rank = all.rank(), size = all.size();
  uint8_t go = 0;
  if (rank == 0) {
    j["gflops_per_core"] = gemm_gflops(1, 1024);
    j["memory_gbps_one_core"] = triad_gbps(1);
    j["memory_gbps_all_cores"] = triad_gbps(cores);
    j["ops_one_core"] = op_rates(1, 5);
    // Every core at once is what a VM's neighbours disturb most: from one
    // calibration to the next, single rounds of 5 read 107-179 GFLOP/s for
    // the sgemm on 2 cores and 140-181 for the linear layer at 2048 rows,
    // while one core read 93-98. kAllCoresRounds rounds of 3, spread over
    // the measurement, each figure the best of them.
    json best = json::object();
    for (int round = 0; round < kAllCoresRounds; ++round) {
      json r = {{"gflops_all_cores", gemm_gflops(cores, 1024, 3)}};
      for (const int m : {64, 256, 1024, 4096})
        r["gflops_all_cores_by_rows"][std::to_string(m)] = gemm_gflops(cores, m, 3);
      r["ops_all_cores"] = op_rates(cores, 3);
      keep_best(best, r);
    }
    j.update(best);
    for (int r = 1; r < size; ++r) all.send(&go, 1, DType::u8, r).wait();
  } else {
    sleep_until_recv(all, 0);
  }
  // The cores shared by ranks: only when every rank is on rank 0's node.
  if (node_ranks == size && size >= 2) {
    const json shared = sharing_efficiency(all, cores);
    if (rank == 0 && !shared.empty()) j["sharing_efficiency_by_ranks_per_core"] = shared;
  }
}

// Rank 0 writes the file (under a temporary name, renamed when whole) and
// prints the figures; collective: a failed write is every rank's error.
void write_calibration(const json& j, const std::string& path, MPI_Comm job, int rank, int cores) {
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
}

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
  ops::set_threads(std::max(1, cores / node_ranks));
  const ProcessMesh mesh(job, MeshLayout(size, 1, 1));  // a run's communicators
  measure_runtime(j, cores, node_ranks);
  measure_mpi(j, *all, job);
  measure_compute(j, *all, cores, node_ranks);
  write_calibration(j, path, job, rank, cores);
  return 0;
}

}  // namespace meshlm
