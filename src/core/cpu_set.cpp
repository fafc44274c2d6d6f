#include "core/cpu_set.h"

#include <omp.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <bit>

namespace meshlm {

int CpuSet::count() const {
  int n = 0;
  for (uint64_t w : bits) n += std::popcount(w);
  return n;
}

bool CpuSet::overlaps(const CpuSet& o) const {
  for (size_t i = 0; i < bits.size(); ++i)
    if (bits[i] & o.bits[i]) return true;
  return false;
}

std::string CpuSet::text() const {
  std::string s;
  for (int c = 0; c < kMaxCpus; ++c) {
    if (!has(c)) continue;
    int last = c;
    while (last + 1 < kMaxCpus && has(last + 1)) ++last;
    if (!s.empty()) s += ',';
    s += std::to_string(c);
    if (last > c) {
      s += '-';
      s += std::to_string(last);
    }
    c = last;
  }
  return s.empty() ? "none" : s;
}

CpuSet current_cpu_set() {
  CpuSet set;
#if defined(__linux__)
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    for (int c = 0; c < CpuSet::kMaxCpus && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) set.add(c);
    if (set.count() > 0) return set;
  }
#endif
  const int n = omp_get_num_procs();
  for (int c = 0; c < n && c < CpuSet::kMaxCpus; ++c) set.add(c);
  return set;
}

}  // namespace meshlm
