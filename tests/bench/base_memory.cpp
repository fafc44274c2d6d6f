// meshlm_base_bench: memory and start-up time of the frozen, quantized base
// model (finetune.mode = lora), one copy per node (quant.share = node) or one
// per rank (quant.share = per_rank). tests/bench/base_memory.sh runs the
// whole measurement; docs/PERFORMANCE.md holds the results.
//
//   mpiexec -n N meshlm_base_bench FILE.cfg [--section.key=value ...] [--label TEXT]
//
// FILE.cfg is a `meshlm train` parameter file; only [model], [quant],
// [train] seed and [parallel] ranks_per_node matter. The mesh is dp = N,
// tp = pp = 1 whatever the file says: the store is the whole model on every
// rank, so the layout does not change it.
//
// Order of the measurement (every step on every rank):
//   1. MPI_Barrier, then read /proc: the baseline of an empty rank (MPI, the
//      mesh, the program).
//   2. FrozenBase::load, timed on every rank.
//   3. XXH3-64 over the whole store the rank sees: maps every page of it
//      into the rank, as training would; all ranks must get the same hash.
//   4. MPI_Barrier, then read /proc again.
//
// Figures (MiB = 2^20 bytes; PSS shares a page mapped by k processes 1/k to
// each, so the PSS of the ranks of a node adds up to the node's memory):
//   store       = bytes of one quantized copy (StoreManifest::bytes)
//   staging     = what rank 0 holds beside the store while it quantizes:
//                 one block of fp32 source rows and one tensor's nf4 absmax
//                 (StoreManifest::staging_bytes)
//   load_s      = max over ranks of the seconds in FrozenBase::load
//   before(n)   = sum of PSS at step 1 over the ranks of node n
//   after(n)    = sum of PSS at step 4 over the ranks of node n
//   copies(n)   = (after(n) - before(n)) / store
//                 target (share = node): after(n) <= before(n) + 1.15 store,
//                 i.e. copies(n) <= 1.15; per_rank gives ~ ranks per node
//   peak        = rank 0's VmHWM at step 4 - rank 0's VmRSS at step 1
//   peak_ratio  = peak / (store + staging)
//                 target: peak_ratio <= 1.20
// The result line gives the worst node (largest copies).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "app/parameter_file.h"
#include "core/alloc.h"
#include "comm/errors.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/hash.h"
#include "mesh/mesh.h"
#include "load/base_loader.h"
#include "train/trainer.h"

using namespace meshlm;

namespace {

constexpr double kNodeSlack = 1.15;  // node PSS: one quantized copy + 15%
constexpr double kPeakSlack = 1.20;  // rank 0's peak: store + largest tensor + 20%
constexpr double kMiB = 1024.0 * 1024.0;

// What each rank sends to rank 0.
struct RankSample {
  double pss_before, rss_before, pss_after, rss_after, hwm_after;  // bytes
  double load_seconds;
  int node_index;
};

double mib(double bytes) { return bytes / kMiB; }

const char* cache_word(const load::FillReport& r) {
  if (r.cache_hit) return "hit";
  if (r.cache == "off" || r.cache.empty()) return "off";
  return "miss";
}

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2 || argv[1][0] == '-')
    throw CollectiveError(
        "usage: meshlm_base_bench FILE.cfg [--section.key=value ...] [--label TEXT]", MESHLM_HERE);
  std::string label;
  std::vector<std::string> overrides;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--label" && i + 1 < argc) label = argv[++i];
    else if (a.rfind("--label=", 0) == 0) label = a.substr(8);
    else overrides.push_back(a);
  }
  const RunConfig cfg = load_run_config(MPI_COMM_WORLD, argv[1], overrides);
  const std::string share = name_of(cfg.quant.share);
  if (label.empty()) label = share;

  ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(world, 1, 1), cfg.parallel.ranks_per_node);

  // 1. The empty rank.
  MPI_Barrier(mesh.world());
  const ProcessMemory before = read_process_memory();

  // 2. The load.
  const double t0 = now_seconds();
  std::unique_ptr<load::FrozenBase> base = load::FrozenBase::load(cfg.model, cfg.quant, cfg.train.seed, mesh);
  const double load_seconds = now_seconds() - t0;

  // 3. Every page of the store, read by every rank.
  const quant::NodeStore& store = base->store();
  const uint64_t hash = io::xxh3_64(store.data(), store.bytes());
  std::vector<uint64_t> hashes(static_cast<size_t>(world));
  MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, mesh.world());
  for (int r = 1; r < world; ++r) {
    if (hashes[r] == hashes[0]) continue;
    std::string msg = "the ranks see different stores (XXH3-64 per rank:";
    for (int q = 0; q < world; ++q) msg += fmt::format(" {}:{:016x}", q, hashes[q]);
    throw CollectiveError(msg + ")", MESHLM_HERE);
  }

  // 4. After.
  MPI_Barrier(mesh.world());
  const ProcessMemory after = read_process_memory();

  const RankSample mine{static_cast<double>(before.pss),    static_cast<double>(before.rss),
                        static_cast<double>(after.pss),     static_cast<double>(after.rss),
                        static_cast<double>(after.rss_peak), load_seconds,
                        mesh.node_index()};
  std::vector<RankSample> all(static_cast<size_t>(world));
  MPI_Gather(&mine, sizeof(RankSample), MPI_BYTE, all.data(), sizeof(RankSample), MPI_BYTE, 0,
             mesh.world());
  if (rank != 0) return 0;

  const load::StoreManifest& m = base->manifest();
  const double store_b = static_cast<double>(m.bytes);
  const double staging_b = static_cast<double>(m.staging_bytes());
  size_t params = 0;
  for (const load::StoreEntry& e : m.entries) params += static_cast<size_t>(e.spec.full_shape.numel());
  const GPTConfig& g = cfg.model;
  const load::FillReport& rep = base->report();

  std::printf("# meshlm_base_bench: %s | %d ranks | quant.share %s | parallel.ranks_per_node %d\n",
              label.c_str(), world, share.c_str(), cfg.parallel.ranks_per_node);
  std::printf("# model: n_layer %d n_head %d n_embd %d vocab_size %d (padded %d) max_seq_len %d | "
              "%zu parameters | fp32 %.1f MiB | %s store %.1f MiB (%.3f bits/weight)\n",
              g.n_layer, g.n_head, g.n_embd, g.vocab_size, g.padded_vocab_size(), g.max_seq_len,
              params, mib(4.0 * params), name_of(cfg.quant.type), mib(store_b),
              8.0 * store_b / static_cast<double>(params));
  std::printf("# quant.base: %s\n", cfg.quant.base.empty() ? "(GPT-2 initialisation, train.seed)"
                                                          : cfg.quant.base.c_str());
  std::printf("# rank 0 filled the store in %.3f s; cache: %s\n", rep.seconds, rep.cache.c_str());
  std::printf("# store XXH3-64 %016llx (the same on every rank)\n",
              static_cast<unsigned long long>(hashes[0]));

  // Per rank.
  std::printf("#\n# %4s %4s %10s %10s %10s %10s %10s %8s   (MiB; hwm = VmHWM after)\n", "rank",
              "node", "pss_before", "pss_after", "rss_before", "rss_after", "hwm", "load_s");
  for (int r = 0; r < world; ++r) {
    const RankSample& s = all[r];
    std::printf("# %4d %4d %10.1f %10.1f %10.1f %10.1f %10.1f %8.3f\n", r, s.node_index,
                mib(s.pss_before), mib(s.pss_after), mib(s.rss_before), mib(s.rss_after),
                mib(s.hwm_after), s.load_seconds);
  }

  // Per node.
  const int nodes = mesh.node_count();
  std::vector<double> node_before(nodes, 0), node_after(nodes, 0);
  std::vector<int> node_ranks(nodes, 0);
  for (const RankSample& s : all) {
    node_before[s.node_index] += s.pss_before;
    node_after[s.node_index] += s.pss_after;
    ++node_ranks[s.node_index];
  }
  std::printf("#\n# %4s %5s %10s %10s %10s %10s %7s %6s   (MiB; limit = before + %.2f store)\n",
              "node", "ranks", "pss_before", "pss_after", "added", "limit", "copies", "target",
              kNodeSlack);
  int worst = 0;
  double worst_copies = -1e300;
  for (int n = 0; n < nodes; ++n) {
    const double added = node_after[n] - node_before[n];
    const double limit = node_before[n] + kNodeSlack * store_b;
    const double copies = added / store_b;
    if (copies > worst_copies) worst_copies = copies, worst = n;
    std::printf("# %4d %5d %10.1f %10.1f %10.1f %10.1f %7.3f %6s\n", n, node_ranks[n],
                mib(node_before[n]), mib(node_after[n]), mib(added), mib(limit), copies,
                node_after[n] <= limit ? "met" : "missed");
  }

  // Rank 0's peak.
  const double peak = all[0].hwm_after - all[0].rss_before;
  const double peak_ratio = peak / (store_b + staging_b);
  double load_max = 0;
  for (const RankSample& s : all) load_max = std::max(load_max, s.load_seconds);

  // The result line.
  std::printf("#\n# %-22s %-8s %5s %5s %9s %11s %8s %5s %5s %7s %6s %8s %10s %6s %6s\n", "label",
              "share", "ranks", "nodes", "store_MiB", "staging_MiB", "load_s", "cache", "node",
              "copies", "target", "peak_MiB", "limit_MiB", "peak_r", "target");
  std::printf("  %-22s %-8s %5d %5d %9.1f %11.1f %8.3f %5s %5d %7.3f %6s %8.1f %10.1f %6.3f %6s\n",
              label.c_str(), share.c_str(), world, nodes, mib(store_b), mib(staging_b), load_max,
              cache_word(rep), worst, worst_copies, worst_copies <= kNodeSlack ? "met" : "missed",
              mib(peak), mib(kPeakSlack * (store_b + staging_b)), peak_ratio,
              peak_ratio <= kPeakSlack ? "met" : "missed");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  log::set_rank(rank);
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const CollectiveError& e) {
    fatal_all(MPI_COMM_WORLD, e.what(), e.file(), e.line());
  } catch (const Error& e) {
    fatal_one(e.what(), e.file(), e.line());
  } catch (const std::exception& e) {
    fatal_one(e.what(), __FILE__, __LINE__);
  }
  MPI_Finalize();
  return status;
}
