// runtime.backend = emulated: the CPU backend's kernels behind the rules of
// a GPU, to run the CUDA backend's code paths on a machine without one:
// trained tensors in device buffers, their initialisation uploaded, the
// checkpoints downloaded, and the device buffers of a layout of many ranks
// moved by host staging (comm/staged_comm.h, comm.device = host).
//
// Buffers on Device::cuda come from one arena of this process's memory that
// the host can neither read nor write between ops: the arena is mapped
// PROT_NONE except while an op of the emulated Kernels or Dequantizer runs
// (an upload and a download are ops). Host code that touches a device
// buffer, or hands one to MPI, therefore stops the rank with SIGSEGV where a
// GPU's pointer would have done the same, instead of passing on the CPU.
//
// The arithmetic is the CPU's (ops::Kernels::cpu at the run's precision);
// the work sizes are the CUDA backend's (BackendCaps). Each op costs two
// mprotect calls over the arena's span besides its own work (the arena is
// backed by transparent huge pages where the kernel gives them, so a call
// changes one page-table entry per 2 MiB): a backend for tests on small
// models, not for training. Its memory is host memory, so the process's
// resident memory includes the emulated device's.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "core/alloc.h"
#include "ops/forwarding_kernels.h"
#include "quant/dequantizer.h"

namespace meshlm {

// The emulated device's memory: a reservation of `capacity` bytes of address
// space, handed out in whole pages (first fit, zeroed), made readable only
// between open() and close(). One thread uses it.
class EmulatedMemory final : public DeviceMemory {
public:
  explicit EmulatedMemory(size_t capacity);
  ~EmulatedMemory() override;
  EmulatedMemory(const EmulatedMemory&) = delete;
  EmulatedMemory& operator=(const EmulatedMemory&) = delete;

  // RankError naming `label` and the bytes when the arena is full.
  void* allocate(size_t bytes, const std::string& label) override;
  void release(void* p, size_t bytes) noexcept override;

  bool contains(const void* p) const;
  // Opens the arena to the host until the matching close(); nests.
  void open() const;
  void close() const;

  size_t capacity() const { return capacity_; }
  size_t in_use() const { return in_use_; }

private:
  void protect(size_t begin, size_t end, bool readable) const;

  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t top_ = 0;     // pages above it have never been handed out
  size_t in_use_ = 0;  // bytes handed out (whole pages)
  std::map<size_t, size_t> free_;  // offset -> bytes of a free run below top_
  mutable int open_depth_ = 0;
};

// The device of one rank: its memory (installed as the process's
// DeviceMemory while this lives) and the CPU's ops on it.
class EmulatedDevice {
public:
  // The CPU's kernels at precision `p`; an arena as large as the machine's
  // memory (address space only until used).
  explicit EmulatedDevice(ops::Precision p);
  ~EmulatedDevice();
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;

  const ops::Kernels& kernels() const { return *kernels_; }
  const quant::Dequantizer& dequantizer() const { return *dequantizer_; }
  const EmulatedMemory& memory() const { return *memory_; }

private:
  std::unique_ptr<EmulatedMemory> memory_;
  std::unique_ptr<ops::Kernels> kernels_;
  std::unique_ptr<quant::Dequantizer> dequantizer_;
};

}  // namespace meshlm
