// The processors a rank may run on: its CPU affinity mask as the launcher
// left it (mpiexec --bind-to, srun --cpu-bind, taskset, a cgroup's cpuset).
// Threads per rank are derived from it (train/threads.h), so a rank bound
// to one core never starts two busy threads there.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace meshlm {

// A set of processor ids below kMaxCpus, as a plain bit array (it travels
// between ranks as bytes).
struct CpuSet {
  static constexpr int kMaxCpus = 1024;  // glibc's CPU_SETSIZE
  std::array<uint64_t, kMaxCpus / 64> bits{};

  void add(int cpu) { bits[cpu / 64] |= uint64_t{1} << (cpu % 64); }
  bool has(int cpu) const { return (bits[cpu / 64] >> (cpu % 64)) & 1; }
  int count() const;
  bool overlaps(const CpuSet& o) const;
  // "0-3,8,10-11"; "none" when empty.
  std::string text() const;
};

// This process's affinity mask (sched_getaffinity). Where there is none to
// read (not Linux), every processor the OpenMP runtime reports.
CpuSet current_cpu_set();

}  // namespace meshlm
