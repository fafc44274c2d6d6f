#include "train/report.h"

#include <fmt/core.h>

#include <algorithm>
#include <string>
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
std::vector<Stat> reduce_stats(const std::vector<double>& v, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int n = static_cast<int>(v.size());
  std::vector<double> mn(n), mx(n), sum(n);
  MPI_Allreduce(v.data(), mn.data(), n, MPI_DOUBLE, MPI_MIN, comm);
  MPI_Allreduce(v.data(), mx.data(), n, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(v.data(), sum.data(), n, MPI_DOUBLE, MPI_SUM, comm);
  std::vector<Stat> out(n);
  for (int i = 0; i < n; ++i) out[i] = {mn[i], sum[i] / size, mx[i]};
  return out;
}
}  // namespace

void print_memory_table(const MemoryByCategory& predicted, MPI_Comm comm) {
  // Per category: predicted, current, peak; then the tracked total and the
  // process figures, which also show what the tracker does not see (MPI,
  // BLAS and HDF5 buffers, code, the C++ heap).
  const MemTracker& t = MemTracker::get();
  std::vector<double> v;
  for (int c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    v.push_back(static_cast<double>(at(predicted, cat)));
    v.push_back(static_cast<double>(t.current(cat)));
    v.push_back(static_cast<double>(t.peak(cat)));
  }
  const ProcessMemory pm = read_process_memory();
  v.push_back(static_cast<double>(total(predicted)));
  v.push_back(static_cast<double>(t.current_total()));
  v.push_back(static_cast<double>(t.peak_total()));
  v.push_back(0.0);
  v.push_back(static_cast<double>(pm.rss));
  v.push_back(static_cast<double>(pm.rss_peak));
  v.push_back(0.0);
  v.push_back(static_cast<double>(pm.pss));
  v.push_back(0.0);
  const std::vector<Stat> s = reduce_stats(v, comm);

  log::info("# Memory per rank, host (predicted | measured by the tracked allocator; peak min / avg / max over ranks)");
  log::info("# {:<12} {:>11} {:>11} {:>11} {:>11} {:>11}", "category", "predicted", "current",
            "peak min", "peak avg", "peak max");
  auto row = [&](const char* name, size_t i, bool has_peak = true) {
    const Stat &pred = s[3 * i], &cur = s[3 * i + 1], &pk = s[3 * i + 2];
    auto cell = [](double b) { return b > 0 ? format_bytes(b) : std::string("-"); };
    auto peak = [&](double b) { return has_peak ? format_bytes(b) : std::string("-"); };
    log::info("  {:<12} {:>11} {:>11} {:>11} {:>11} {:>11}", name, cell(pred.max), cell(cur.avg),
              peak(pk.min), peak(pk.avg), peak(pk.max));
  };
  for (int c = 0; c < kNumMemCategories; ++c) row(mem_category_name(static_cast<MemCategory>(c)), c);
  row("tracked", kNumMemCategories);
  row("process rss", kNumMemCategories + 1);  // current = VmRSS, peak = VmHWM
  row("process pss", kNumMemCategories + 2, false);  // Pss: shared pages split between sharers
}

void print_timing_table(const SectionTimers& timers, double total_seconds, MPI_Comm comm) {
  std::vector<double> v;
  for (int i = 0; i < static_cast<int>(Section::count); ++i)
    v.push_back(timers.total(static_cast<Section>(i)));
  const std::vector<Stat> s = reduce_stats(v, comm);
  log::info("# Time per section (seconds over the run; min / avg / max over ranks)");
  log::info("# {:<12} {:>10} {:>10} {:>10} {:>8} {:>9}", "section", "min", "avg", "max", "%total",
            "imbalance");
  for (int i = 0; i < static_cast<int>(Section::count); ++i) {
    const Stat& st = s[i];
    const double pct = total_seconds > 0 ? 100.0 * st.avg / total_seconds : 0.0;
    const double imb = st.avg > 0 ? 100.0 * (st.max - st.avg) / st.avg : 0.0;
    log::info("  {:<12} {:>10.3f} {:>10.3f} {:>10.3f} {:>7.1f}% {:>8.1f}%",
              section_name(static_cast<Section>(i)), st.min, st.avg, st.max, pct, imb);
  }
  log::info("  {:<12} {:>10.3f}", "total", total_seconds);
}

}  // namespace meshlm
