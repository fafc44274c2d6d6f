// The tracked allocator. Every sizeable allocation of meshlm goes through a
// Buffer with one memory category, so that the memory of every rank can be
// accounted by category (current and peak bytes) and set beside the
// planner's prediction and the process figures from /proc.
//
// Categories are fixed by docs/DESIGN (params, grads, optimizer, activations,
// quantized, comm, workspace, checkpoint, other); adding one means adding it
// here only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace meshlm {

enum class MemCategory : int {
  params, grads, optimizer, activations, quantized, comm, workspace, checkpoint, other, count
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::count);
constexpr int kNumDevices = 2;  // Device::cpu, Device::cuda
const char* mem_category_name(MemCategory c);

// Bytes per category (a prediction, or a snapshot of the tracker).
using MemoryByCategory = std::array<size_t, kNumMemCategories>;
inline size_t& at(MemoryByCategory& m, MemCategory c) { return m[static_cast<int>(c)]; }
inline size_t at(const MemoryByCategory& m, MemCategory c) { return m[static_cast<int>(c)]; }
inline size_t total(const MemoryByCategory& m) {
  size_t t = 0;
  for (size_t b : m) t += b;
  return t;
}

// The phases of a run, in order: what is live in memory changes between
// them (docs/DESIGN.md, "Memory"). The tracker keeps each phase's peak of
// the host's tracked total, which the planner predicts phase by phase.
enum class MemPhase : int { startup, base_loading, initialisation, training, count };
constexpr int kNumMemPhases = static_cast<int>(MemPhase::count);
const char* mem_phase_name(MemPhase p);

// Process-wide byte counters (one process = one rank). Not thread-safe by
// design: buffers are made and freed by the rank's main thread only.
class MemTracker {
public:
  static MemTracker& get();
  // From now on the host's tracked total counts toward phase `p`'s peak
  // (which starts at the total of now).
  void enter(MemPhase p);
  MemPhase phase() const { return phase_; }
  // The largest host total tracked while `p` was the phase (0: never entered).
  size_t phase_peak(MemPhase p) const { return phase_peak_[idx(p)]; }
  void on_alloc(MemCategory c, Device d, size_t bytes);
  void on_free(MemCategory c, Device d, size_t bytes);
  size_t current(MemCategory c, Device d = Device::cpu) const { return cur_[idx(d)][idx(c)]; }
  size_t peak(MemCategory c, Device d = Device::cpu) const { return peak_[idx(d)][idx(c)]; }
  size_t current_total(Device d = Device::cpu) const { return total_cur_[idx(d)]; }
  size_t peak_total(Device d = Device::cpu) const { return total_peak_[idx(d)]; }
  void reset_peaks();

private:
  template <typename E>
  static int idx(E e) { return static_cast<int>(e); }
  std::array<std::array<size_t, kNumMemCategories>, kNumDevices> cur_{}, peak_{};
  std::array<size_t, kNumDevices> total_cur_{}, total_peak_{};
  MemPhase phase_ = MemPhase::startup;
  std::array<size_t, kNumMemPhases> phase_peak_{};
};

// Where Buffers on Device::cuda come from. core knows no CUDA: the CUDA
// backend installs its allocator (cuda/device_memory.h) before the first
// device Buffer is made. allocate() returns zeroed memory of at least
// `bytes`, or throws RankError naming `label` and the bytes; release() takes
// back what allocate() gave, with the same byte count.
class DeviceMemory {
public:
  virtual ~DeviceMemory() = default;
  virtual void* allocate(size_t bytes, const std::string& label) = 0;
  virtual void release(void* p, size_t bytes) noexcept = 0;
};
// The installed allocator (null: none; device Buffers are then an error).
// It must outlive every device Buffer.
void set_device_memory(DeviceMemory* m);
DeviceMemory* device_memory();

// An owning, zero-initialised block of memory with a label and a category:
// on the host 64-byte aligned, on a GPU from the installed DeviceMemory.
// Move-only.
class Buffer {
public:
  Buffer() = default;
  Buffer(size_t bytes, MemCategory category, std::string label, Device device = Device::cpu);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  Device device() const { return device_; }
  const std::string& label() const { return label_; }

private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::other;
  Device device_ = Device::cpu;
  std::string label_;
};

// Process memory from /proc/self/status and smaps_rollup (bytes; 0 when the
// file is not there, e.g. not Linux).
struct ProcessMemory {
  size_t rss = 0;       // VmRSS: resident now
  size_t rss_peak = 0;  // VmHWM: resident high-water mark
  size_t pss = 0;       // Pss: proportional share (shared pages split between sharers)
};
ProcessMemory read_process_memory();
// The machine's physical memory (sysconf), in bytes.
size_t physical_memory_bytes();
// The size of a memory page (sysconf), in bytes.
size_t page_bytes();

}  // namespace meshlm
