#include "train/report.h"

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "core/alloc.h"
#include "core/log.h"

namespace meshlm {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

namespace {
struct Stat {
  double min, avg, max;
};
// Collective: min/avg/max of each value over the ranks.
std::vector<Stat> reduce_stats(const std::vector<double>& v, comm::Communicator& world) {
  const size_t n = v.size();
  std::vector<double> mn(n), mx(n), sum(n);
  world.all_reduce(v.data(), mn.data(), n, DType::f64, comm::ReduceOp::min).wait();
  world.all_reduce(v.data(), mx.data(), n, DType::f64, comm::ReduceOp::max).wait();
  world.all_reduce(v.data(), sum.data(), n, DType::f64, comm::ReduceOp::sum).wait();
  std::vector<Stat> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {mn[i], sum[i] / world.size(), mx[i]};
  return out;
}
}  // namespace

void print_predicted_memory(const MemoryByCategory& predicted, comm::Communicator& world) {
  const Stat s = reduce_stats({static_cast<double>(total(predicted))}, world)[0];
  log::info("# memory predicted per rank: min {} | avg {} | max {} (rank 0: params {}, grads {}, "
            "optimizer {}, activations {})",
            format_bytes(s.min), format_bytes(s.avg), format_bytes(s.max),
            format_bytes(at(predicted, MemCategory::params)),
            format_bytes(at(predicted, MemCategory::grads)),
            format_bytes(at(predicted, MemCategory::optimizer)),
            format_bytes(at(predicted, MemCategory::activations)));
}

size_t ProcessPrediction::peak() const {
  size_t most = 0;
  for (int p = 0; p < kNumMemPhases; ++p)
    most = std::max(most, phases[p] + (p == static_cast<int>(MemPhase::training) ? shared : 0));
  return runtime + most;
}

std::vector<size_t> predicted_node_peaks(const std::vector<ProcessPrediction>& ranks) {
  std::vector<std::array<size_t, kNumMemPhases>> sums;
  for (const ProcessPrediction& r : ranks) {
    if (r.node >= static_cast<int>(sums.size())) sums.resize(r.node + 1, {});
    for (int p = 0; p < kNumMemPhases; ++p) sums[r.node][p] += r.runtime_pss + r.phases[p];
  }
  std::vector<size_t> peaks;
  for (const auto& s : sums) peaks.push_back(*std::max_element(s.begin(), s.end()));
  return peaks;
}

std::vector<NodeMemory> node_memory(const std::vector<RankMemory>& ranks) {
  std::vector<ProcessPrediction> expected;
  for (const RankMemory& m : ranks) expected.push_back(m.expected);
  const std::vector<size_t> peaks = predicted_node_peaks(expected);
  std::vector<NodeMemory> nodes(peaks.size());
  for (size_t n = 0; n < peaks.size(); ++n) nodes[n].predicted = peaks[n];
  for (const RankMemory& m : ranks) {
    NodeMemory& node = nodes[m.expected.node];
    ++node.ranks;
    node.runtime_pss += m.expected.runtime_pss;
    node.pss += m.process.pss;
  }
  return nodes;
}

double RankMemory::error() const {
  if (process.rss_peak == 0 || expected.peak() == 0) return 0.0;
  return (static_cast<double>(expected.peak()) - static_cast<double>(process.rss_peak)) /
         static_cast<double>(process.rss_peak);
}

std::vector<RankMemory> gather_memory(const MemoryByCategory& predicted,
                                      const ProcessPrediction& expected, comm::Communicator& world) {
  const MemTracker& t = MemTracker::get();
  RankMemory mine;
  mine.predicted = predicted;
  mine.expected = expected;
  for (int p = 0; p < kNumMemPhases; ++p) mine.phase_peak[p] = t.phase_peak(static_cast<MemPhase>(p));
  // The host's and the GPU's tracked buffers together, per category (on the
  // CUDA backend the model's buffers are on the device, the data loader's on
  // the host; the prediction counts both).
  for (int c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    mine.current[c] = t.current(cat, Device::cpu) + t.current(cat, Device::cuda);
    mine.peak[c] = t.peak(cat, Device::cpu) + t.peak(cat, Device::cuda);
  }
  mine.process = read_process_memory();
  static_assert(std::is_trivially_copyable_v<RankMemory>);
  // A few hundred bytes per rank: gathered to every rank, kept on rank 0.
  std::vector<RankMemory> all(world.size());
  world.all_gather(&mine, all.data(), sizeof(RankMemory), DType::u8).wait();
  if (world.rank() != 0) all.clear();
  return all;
}

void print_memory_table(const std::vector<RankMemory>& ranks,
                        const std::vector<std::string>& labels) {
  if (ranks.empty()) return;
  const double n = static_cast<double>(ranks.size());
  auto stat = [&](auto get) {
    Stat s{get(ranks[0]), 0, get(ranks[0])};
    for (const RankMemory& r : ranks) {
      const double v = get(r);
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
      s.avg += v / n;
    }
    return s;
  };
  auto b = [](double x) { return x > 0 ? format_bytes(x) : std::string("-"); };
  // Per category over the ranks; the tracked total and the process figures
  // also show what the tracker does not see (MPI, BLAS and HDF5 buffers,
  // code, the C++ heap).
  log::info("# Memory per rank (tracked buffers, host and GPU together): predicted | peak measured by the tracked allocator "
            "(min / avg / max over {} ranks)", ranks.size());
  log::info("# {:<12} {:>11} {:>11} {:>11} | {:>11} {:>11} {:>11}", "category", "pred min",
            "pred avg", "pred max", "peak min", "peak avg", "peak max");
  auto row = [&](const std::string& name, Stat p, Stat k) {
    log::info("  {:<12} {:>11} {:>11} {:>11} | {:>11} {:>11} {:>11}", name, b(p.min), b(p.avg),
              b(p.max), b(k.min), b(k.avg), b(k.max));
  };
  for (int c = 0; c < kNumMemCategories; ++c)
    row(mem_category_name(static_cast<MemCategory>(c)),
        stat([c](const RankMemory& r) { return static_cast<double>(r.predicted[c]); }),
        stat([c](const RankMemory& r) { return static_cast<double>(r.peak[c]); }));
  row("tracked", stat([](const RankMemory& r) { return static_cast<double>(total(r.predicted)); }),
      stat([](const RankMemory& r) { return static_cast<double>(total(r.peak)); }));
  const Stat none{0, 0, 0};
  row("process rss", none, stat([](const RankMemory& r) { return double(r.process.rss_peak); }));
  row("process pss", none, stat([](const RankMemory& r) { return double(r.process.pss); }));

  // The process: what the operating system saw (VmHWM) against the
  // prediction, the runtime's part plus the largest phase.
  log::info("# Process memory per rank: predicted peak = runtime (resident at start-up outside the "
            "tracked buffers) + the largest phase's tracked total (in training, + shared: the "
            "pages of the node's shared base store, held by another rank, that this rank reads); "
            "VmHWM from /proc; MiB, phases predicted / tracked");
  std::string phead = fmt::format("# {:>5} {:>9} {:>9}", "rank", "runtime", "shared");
  for (int p = 0; p < kNumMemPhases; ++p)
    phead += fmt::format(" {:>17}", mem_phase_name(static_cast<MemPhase>(p)));
  log::info("{} {:>10} {:>10} {:>8}", phead, "predicted", "VmHWM", "error");
  constexpr double MiB = 1024.0 * 1024.0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankMemory& m = ranks[r];
    std::string line = fmt::format("  {:>5} {:>9.1f} {:>9.1f}", r, m.expected.runtime / MiB,
                                   m.expected.shared / MiB);
    for (int p = 0; p < kNumMemPhases; ++p)
      line += fmt::format(" {:>8.1f}/{:<8.1f}", m.expected.phases[p] / MiB, m.phase_peak[p] / MiB);
    log::info("{} {:>10.1f} {:>10.1f} {:>+7.1f}%", line, m.expected.peak() / MiB,
              m.process.rss_peak / MiB, 100.0 * m.error());
  }
  // Per node: the predicted peak of its summed PSS, and the sum now (the
  // node's peak needs samples over the run: tests/tools/memprobe.cpp).
  if (ranks[0].expected.runtime_pss > 0) {
    log::info("# Node memory (summed PSS of the node's ranks: shared pages, the base's store "
              "among them, count once): predicted peak = the largest phase's sum of runtime PSS + "
              "tracked total; MiB");
    log::info("# {:>5} {:>6} {:>12} {:>12} {:>12}", "node", "ranks", "runtime", "predicted",
              "PSS at end");
    const std::vector<NodeMemory> nodes = node_memory(ranks);
    for (size_t n = 0; n < nodes.size(); ++n)
      log::info("  {:>5} {:>6} {:>12.1f} {:>12.1f} {:>12.1f}", n, nodes[n].ranks,
                nodes[n].runtime_pss / MiB, nodes[n].predicted / MiB, nodes[n].pss / MiB);
  }

  // One line per rank: measured peak per category, and whether the
  // tracked total matched the prediction.
  std::string head = fmt::format("# {:>5} {:<16}", "rank", "");
  for (int c = 0; c < kNumMemCategories; ++c)
    head += fmt::format(" {:>10}", mem_category_name(static_cast<MemCategory>(c)));
  log::info("{} {:>10} {:>10}", head, "tracked", "predicted");
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string line = fmt::format("  {:>5} {:<16}", r, r < labels.size() ? labels[r] : "");
    for (int c = 0; c < kNumMemCategories; ++c)
      line += fmt::format(" {:>10}", b(static_cast<double>(ranks[r].peak[c])));
    log::info("{} {:>10} {:>10}", line, b(static_cast<double>(total(ranks[r].peak))),
              b(static_cast<double>(total(ranks[r].predicted))));
  }
}

void print_op_timing_table(const ops::TimedKernels& ops, int steps, comm::Communicator& world) {
  constexpr int n = static_cast<int>(ops::KernelOp::count);
  std::vector<double> v(2 * n);  // seconds, then calls
  for (int i = 0; i < n; ++i) {
    v[i] = ops.seconds(static_cast<ops::KernelOp>(i));
    v[n + i] = static_cast<double>(ops.calls(static_cast<ops::KernelOp>(i)));
  }
  const std::vector<Stat> s = reduce_stats(v, world);
  double total = 0;
  for (int i = 0; i < n; ++i) total += s[i].avg;
  log::info("# Time per op (runtime.op_timings: each op waited for; seconds over the run, min / "
            "avg / max over ranks; ms per step and share of the ops' total from the average)");
  log::info("# {:<26} {:>9} {:>10} {:>10} {:>10} {:>10} {:>7}", "op", "calls", "min", "avg", "max",
            "ms/step", "share");
  for (int i = 0; i < n; ++i) {
    if (s[n + i].max == 0) continue;  // never called on any rank
    log::info("  {:<26} {:>9.0f} {:>10.4f} {:>10.4f} {:>10.4f} {:>10.3f} {:>6.1f}%",
              ops::kernel_op_name(static_cast<ops::KernelOp>(i)), s[n + i].avg, s[i].min, s[i].avg,
              s[i].max, 1e3 * s[i].avg / std::max(steps, 1),
              total > 0 ? 100.0 * s[i].avg / total : 0.0);
  }
  log::info("  {:<26} {:>9} {:>10} {:>10.4f} {:>10} {:>10.3f}", "all ops", "", "", total, "",
            1e3 * total / std::max(steps, 1));
}

void print_timing_table(const SectionTimers& timers, double total_seconds,
                        comm::Communicator& world) {
  std::vector<double> v, hidden;
  for (int i = 0; i < static_cast<int>(Section::count); ++i) {
    v.push_back(timers.total(static_cast<Section>(i)));
    hidden.push_back(timers.hidden(static_cast<Section>(i)));
  }
  const std::vector<Stat> s = reduce_stats(v, world), h = reduce_stats(hidden, world);
  log::info("# Time per section (seconds over the run; min / avg / max over ranks; the *-comm "
            "sections are the exposed communication: issuing and waiting)");
  log::info("# {:<14} {:>10} {:>10} {:>10} {:>8} {:>9}", "section", "min", "avg", "max", "%total",
            "imbalance");
  for (int i = 0; i < static_cast<int>(Section::count); ++i) {
    const Stat& st = s[i];
    const double pct = total_seconds > 0 ? 100.0 * st.avg / total_seconds : 0.0;
    const double imb = st.avg > 0 ? 100.0 * (st.max - st.avg) / st.avg : 0.0;
    log::info("  {:<14} {:>10.3f} {:>10.3f} {:>10.3f} {:>7.1f}% {:>8.1f}%",
              section_name(static_cast<Section>(i)), st.min, st.avg, st.max, pct, imb);
  }
  log::info("  {:<14} {:>10.3f}", "total", total_seconds);
  // Communication in flight while the rank computed: not in the total.
  for (int i = 0; i < static_cast<int>(Section::count); ++i) {
    if (!(h[i].max > 0)) continue;
    log::info("  {:<14} {:>10.3f} {:>10.3f} {:>10.3f}   hidden: {} in flight during the "
              "backward, no rank waiting (not in the total)",
              fmt::format("{} hidden", section_name(static_cast<Section>(i))), h[i].min, h[i].avg,
              h[i].max, section_name(static_cast<Section>(i)));
  }
}

}  // namespace meshlm
