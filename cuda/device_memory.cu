// CachingDeviceMemory: see cuda/device_memory.h.
#include "cuda/device_memory.h"

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"

namespace meshlm::cuda {

size_t CachingDeviceMemory::rounded(size_t bytes) {
  // 512-byte steps below 1 MiB, 2 MiB steps above: few bins, little waste.
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20;
  const size_t step = bytes < (size_t(1) << 20) ? kSmall : kLarge;
  return (bytes + step - 1) / step * step;
}

void* CachingDeviceMemory::allocate(size_t bytes, const std::string& label) {
  const size_t size = rounded(bytes);
  void* p = nullptr;
  auto bin = free_.find(size);
  if (bin != free_.end() && !bin->second.empty()) {
    // A freed block may still be in use by work queued on any stream before
    // its Buffer went away: wait for the device before handing it out again
    // (allocations happen at set-up, not per step, so this costs little).
    CUDA_CHECK(cudaDeviceSynchronize());
    p = bin->second.back();
    bin->second.pop_back();
    cached_ -= size;
  } else {
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      empty_cache();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      // Any other error (a sticky one left by a faulting kernel) is named as such.
      const std::string what =
          err == cudaErrorMemoryAllocation ? "out of device memory" : "cudaMalloc failed";
      throw RankError(what + " allocating " + std::to_string(bytes) + " bytes for '" +
                          label + "' (" + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) +
                          "); the device has " + std::to_string(free_bytes) + " of " +
                          std::to_string(total_bytes) + " bytes free, this rank holds " +
                          std::to_string(reserved_),
                      MESHLM_HERE);
    }
    reserved_ += size;
  }
  // cudaMemset runs on the legacy default stream, asynchronously to the host:
  // wait for it, so that no kernel on another (non-blocking) stream reads the
  // block before it is zeroed.
  CUDA_CHECK(cudaMemset(p, 0, size));
  CUDA_CHECK(cudaDeviceSynchronize());
  return p;
}

void CachingDeviceMemory::release(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  const size_t size = rounded(bytes);
  free_[size].push_back(p);
  cached_ += size;
}

void CachingDeviceMemory::empty_cache() noexcept {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      cudaFree(p);
      reserved_ -= size;
      cached_ -= size;
    }
    blocks.clear();
  }
}

CachingDeviceMemory::~CachingDeviceMemory() { empty_cache(); }

CachingDeviceMemory& install_device_memory() {
  static CachingDeviceMemory memory;
  set_device_memory(&memory);
  return memory;
}

}  // namespace meshlm::cuda
