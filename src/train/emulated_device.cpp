#include "train/emulated_device.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "train/report.h"

namespace meshlm {

// ---- the arena ---------------------------------------------------------------

namespace {

// The span each open() and close() changes is rounded to transparent huge
// pages: an mprotect over a whole huge page changes one page-table entry
// where it changed 512 of the base pages, which made the two calls of each
// op most of an emulated run's time.
constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

EmulatedMemory::EmulatedMemory(size_t capacity) {
  capacity_ = round_up(capacity, kHugePage);
  // Address space only: PROT_NONE and MAP_NORESERVE commit nothing until a
  // page is handed out and written. One huge page more than the capacity,
  // so that the arena can start on a huge page's boundary.
  const size_t reserved = capacity_ + kHugePage;
  void* p = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw RankError("runtime.backend = emulated: cannot reserve " +
                        format_bytes(static_cast<double>(capacity_)) +
                        " of address space for the emulated device (" + std::strerror(errno) + ")",
                    MESHLM_HERE);
  char* const raw = static_cast<char*>(p);
  base_ = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(raw), kHugePage));
  if (base_ > raw) ::munmap(raw, static_cast<size_t>(base_ - raw));
  if (const size_t tail = static_cast<size_t>(raw + reserved - (base_ + capacity_)); tail > 0)
    ::munmap(base_ + capacity_, tail);
  // A hint: where the kernel gives no huge pages the arena works the same,
  // only slower.
  ::madvise(base_, capacity_, MADV_HUGEPAGE);
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

// The arena opens and closes up to top_ rounded to a huge page: the pages
// between top_ and that boundary hold no buffer yet.
void EmulatedMemory::open() const {
  if (open_depth_++ == 0) protect(0, round_up(top_, kHugePage), true);
}

void EmulatedMemory::close() const {
  // Called from destructors: a failure leaves the arena readable (the
  // checks weaker), never a throw.
  if (--open_depth_ == 0 && top_ > 0) ::mprotect(base_, round_up(top_, kHugePage), PROT_NONE);
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
    // Given back before: zeroed here (release() leaves the parts of huge
    // pages it holds as they were).
    open();
    std::memset(base_ + at, 0, n);
    close();
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
  if (open_depth_ > 0) protect(round_up(at, kHugePage), round_up(top_, kHugePage), true);
  in_use_ += n;
  return base_ + at;
}

void EmulatedMemory::release(void* p, size_t bytes) noexcept {
  const size_t page = page_bytes();
  const size_t n = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const size_t at = static_cast<size_t>(static_cast<char*>(p) - base_);
  // The whole huge pages of the run go back to the system (a private
  // anonymous page given back reads as zeros when next touched); the parts
  // of huge pages at its ends stay, as dropping them would split their huge
  // pages into base pages. allocate() zeroes what it hands out again.
  if (const size_t h0 = round_up(at, kHugePage), h1 = (at + n) / kHugePage * kHugePage; h1 > h0)
    ::madvise(base_ + h0, h1 - h0, MADV_DONTNEED);
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
