#include "train/emulated_device.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "train/report.h"

namespace meshlm {

// ---- the arena ---------------------------------------------------------------

EmulatedMemory::EmulatedMemory(size_t capacity) {
  const size_t page = page_bytes();
  capacity_ = (capacity + page - 1) / page * page;
  // Address space only: PROT_NONE and MAP_NORESERVE commit nothing until a
  // page is handed out and written.
  void* p = ::mmap(nullptr, capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (p == MAP_FAILED)
    throw RankError("runtime.backend = emulated: cannot reserve " +
                        format_bytes(static_cast<double>(capacity_)) +
                        " of address space for the emulated device (" + std::strerror(errno) + ")",
                    MESHLM_HERE);
  base_ = static_cast<char*>(p);
}

EmulatedMemory::~EmulatedMemory() { ::munmap(base_, capacity_); }

bool EmulatedMemory::contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + capacity_;
}

void EmulatedMemory::protect(size_t begin, size_t end, bool readable) const {
  if (end <= begin) return;
  if (::mprotect(base_ + begin, end - begin, readable ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    throw RankError(std::string("runtime.backend = emulated: mprotect of the emulated device failed (") +
                        std::strerror(errno) + ")",
                    MESHLM_HERE);
}

void EmulatedMemory::open() const {
  if (open_depth_++ == 0) protect(0, top_, true);
}

void EmulatedMemory::close() const {
  // Called from destructors: a failure leaves the arena readable (the
  // checks weaker), never a throw.
  if (--open_depth_ == 0 && top_ > 0) ::mprotect(base_, top_, PROT_NONE);
}

void* EmulatedMemory::allocate(size_t bytes, const std::string& label) {
  const size_t page = page_bytes();
  const size_t n = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const size_t at = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_[at + n] = left;
    in_use_ += n;
    return base_ + at;
  }
  if (n > capacity_ - top_)
    throw RankError("out of memory on the emulated device allocating " +
                        format_bytes(static_cast<double>(bytes)) + " for " + label + " (" +
                        format_bytes(static_cast<double>(in_use_)) + " in use of " +
                        format_bytes(static_cast<double>(capacity_)) + ")",
                    MESHLM_HERE);
  const size_t at = top_;
  top_ += n;
  if (open_depth_ > 0) protect(at, top_, true);
  in_use_ += n;
  return base_ + at;
}

void EmulatedMemory::release(void* p, size_t bytes) noexcept {
  const size_t page = page_bytes();
  const size_t n = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const size_t at = static_cast<size_t>(static_cast<char*>(p) - base_);
  // A private anonymous page given back reads as zeros when next touched:
  // allocate() hands out zeroed memory, as DeviceMemory promises.
  ::madvise(base_ + at, n, MADV_DONTNEED);
  in_use_ -= n;
  auto [it, inserted] = free_.emplace(at, n);
  // Merged with the free runs on either side.
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
      it = prev;
    }
  }
  (void)inserted;
}

// ---- the ops -----------------------------------------------------------------

namespace {

// Opens the arena for the duration of a scope (an op).
class Opened {
public:
  explicit Opened(const EmulatedMemory& m) : m_(m) { m_.open(); }
  ~Opened() { m_.close(); }
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;

private:
  const EmulatedMemory& m_;
};

class EmulatedKernels final : public ops::ForwardingKernels {
public:
  EmulatedKernels(const ops::Kernels& cpu, const EmulatedMemory& memory)
      : ForwardingKernels(cpu), memory_(memory) {}
  Device device() const override { return Device::cuda; }
  bool holds(const void* p) const override { return memory_.contains(p); }

protected:
  void around(ops::KernelOp, const ops::OpWork&, const ops::GemmShape*,
              const ops::OpBody& body) const override {
    const Opened open(memory_);
    body();
  }

private:
  const EmulatedMemory& memory_;
};

class EmulatedDequantizer final : public quant::Dequantizer {
public:
  explicit EmulatedDequantizer(const EmulatedMemory& memory) : memory_(memory) {}
  Device device() const override { return Device::cuda; }
  void rows(const quant::QSlice& w, int64_t i0, int64_t n, float* out) const override {
    const Opened open(memory_);
    quant::Dequantizer::cpu().rows(w, i0, n, out);
  }
  void lookup(float* out, const int32_t* ids, int N, const quant::QSlice& w,
              int64_t first) const override {
    const Opened open(memory_);
    quant::Dequantizer::cpu().lookup(out, ids, N, w, first);
  }

private:
  const EmulatedMemory& memory_;
};

}  // namespace

EmulatedDevice::EmulatedDevice(ops::Precision p)
    : memory_(std::make_unique<EmulatedMemory>(physical_memory_bytes())),
      kernels_(std::make_unique<EmulatedKernels>(ops::Kernels::cpu(p), *memory_)),
      dequantizer_(std::make_unique<EmulatedDequantizer>(*memory_)) {
  set_device_memory(memory_.get());
}

EmulatedDevice::~EmulatedDevice() {
  if (device_memory() == memory_.get()) set_device_memory(nullptr);
}

}  // namespace meshlm
