#include "core/alloc.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include <malloc.h>
#include <unistd.h>

namespace meshlm {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::params: return "params";
    case MemCategory::grads: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::quantized: return "quantized";
    case MemCategory::comm: return "comm";
    case MemCategory::workspace: return "workspace";
    case MemCategory::checkpoint: return "checkpoint";
    case MemCategory::other: return "other";
    case MemCategory::count: break;
  }
  return "?";
}

const char* mem_phase_name(MemPhase p) {
  switch (p) {
    case MemPhase::startup: return "start-up";
    case MemPhase::base_loading: return "base loading";
    case MemPhase::initialisation: return "initialisation";
    case MemPhase::training: return "training";
    case MemPhase::count: break;
  }
  return "?";
}

void MemTracker::enter(MemPhase p) {
  phase_ = p;
  phase_peak_[idx(p)] = std::max(phase_peak_[idx(p)], total_cur_[idx(Device::cpu)]);
}

MemTracker& MemTracker::get() {
  static MemTracker tracker = [] {
    // Every host allocation of 1 MiB or more is mapped and unmapped on its
    // own, so a freed buffer leaves the resident set at once. Left alone,
    // glibc raises this threshold to the size of each mapped block freed (up
    // to 32 MiB), after which such buffers come from the heap and may stay
    // resident when freed: what /proc shows would then depend on the order
    // of frees, not on what is live.
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    // Fixing the threshold also fixes the heap's trim threshold at glibc's
    // 128 KiB: every free leaving more than that at the top of the heap
    // gave it back, and the next allocation faulted it in again, page by
    // page. OpenBLAS allocates and frees a 512 KiB table on every GEMM (its
    // threads' job array): 496 page faults a step of GPT-2 L=6 C=384 on the
    // CPU (docs/PERFORMANCE.md). Up to 2 MiB of free heap stays mapped.
    mallopt(M_TRIM_THRESHOLD, 2 << 20);
    return MemTracker();
  }();
  return tracker;
}

void MemTracker::on_alloc(MemCategory c, Device d, size_t bytes) {
  auto& cur = cur_[idx(d)][idx(c)];
  cur += bytes;
  peak_[idx(d)][idx(c)] = std::max(peak_[idx(d)][idx(c)], cur);
  total_cur_[idx(d)] += bytes;
  total_peak_[idx(d)] = std::max(total_peak_[idx(d)], total_cur_[idx(d)]);
  if (d == Device::cpu)
    phase_peak_[idx(phase_)] = std::max(phase_peak_[idx(phase_)], total_cur_[idx(d)]);
}

void MemTracker::on_free(MemCategory c, Device d, size_t bytes) {
  cur_[idx(d)][idx(c)] -= bytes;
  total_cur_[idx(d)] -= bytes;
}

void MemTracker::reset_peaks() {
  peak_ = cur_;
  total_peak_ = total_cur_;
  phase_peak_ = {};
  phase_peak_[idx(phase_)] = total_cur_[idx(Device::cpu)];
}

namespace {
DeviceMemory* g_device_memory = nullptr;
}

void set_device_memory(DeviceMemory* m) { g_device_memory = m; }
DeviceMemory* device_memory() { return g_device_memory; }

Buffer::Buffer(size_t bytes, MemCategory category, std::string label, Device device)
    : bytes_(bytes), category_(category), device_(device), label_(std::move(label)) {
  if (bytes == 0) return;
  if (device == Device::cuda) {
    if (g_device_memory == nullptr)
      throw RankError("Buffer '" + label_ + "': device memory needs the CUDA backend, which "
                          "has not been started on this rank",
                      MESHLM_HERE);
    data_ = g_device_memory->allocate(bytes, label_);
  } else {
    constexpr size_t kAlign = 64;  // one cache line; also AVX-512 aligned
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    data_ = std::aligned_alloc(kAlign, rounded);
    if (!data_)
      throw RankError("out of host memory allocating " + std::to_string(bytes) + " bytes for '" +
                          label_ + "' (" + mem_category_name(category) + ")",
                      MESHLM_HERE);
    std::memset(data_, 0, rounded);
  }
  MemTracker::get().on_alloc(category_, device_, bytes_);
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (data_) {
    if (device_ == Device::cuda)
      g_device_memory->release(data_, bytes_);
    else
      std::free(data_);
    MemTracker::get().on_free(category_, device_, bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), category_(o.category_), device_(o.device_),
      label_(std::move(o.label_)) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    category_ = o.category_;
    device_ = o.device_;
    label_ = std::move(o.label_);
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

namespace {
// Reads "Key:   1234 kB" from a /proc file; returns bytes or 0.
size_t proc_kb(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':') {
      std::istringstream s(line.substr(klen + 1));
      size_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return 0;
}
}  // namespace

size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

size_t page_bytes() {
  const long page = sysconf(_SC_PAGE_SIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
}

ProcessMemory read_process_memory() {
  ProcessMemory m;
  m.rss = proc_kb("/proc/self/status", "VmRSS");
  m.rss_peak = proc_kb("/proc/self/status", "VmHWM");
  m.pss = proc_kb("/proc/self/smaps_rollup", "Pss");
  return m;
}

}  // namespace meshlm
