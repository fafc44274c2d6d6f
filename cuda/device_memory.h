// The device allocator behind Buffers on Device::cuda (core/alloc.h): a
// caching allocator over cudaMalloc for the current device, no managed
// memory. Freed blocks are kept in bins by their rounded size and handed out
// again (after the device has finished the work queued before); when cudaMalloc fails, the cached blocks are returned to the driver
// and the allocation is tried once more before it fails, naming the buffer,
// its bytes and the device's free and total memory.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "core/alloc.h"

namespace meshlm::cuda {

class CachingDeviceMemory final : public DeviceMemory {
public:
  CachingDeviceMemory() = default;
  ~CachingDeviceMemory() override;  // returns the cached blocks to the driver
  CachingDeviceMemory(const CachingDeviceMemory&) = delete;
  CachingDeviceMemory& operator=(const CachingDeviceMemory&) = delete;

  // Zeroed (cudaMemset, synchronous), at least `bytes`, 256-byte aligned.
  void* allocate(size_t bytes, const std::string& label) override;
  void release(void* p, size_t bytes) noexcept override;

  // Returns every cached (free) block to the driver.
  void empty_cache() noexcept;
  // Bytes obtained from cudaMalloc and not yet given back (in use + cached).
  size_t reserved_bytes() const { return reserved_; }
  size_t cached_bytes() const { return cached_; }

  // Blocks are rounded up to a multiple of this (and to 512 bytes at least).
  static size_t rounded(size_t bytes);

private:
  std::map<size_t, std::vector<void*>> free_;  // rounded size -> free blocks
  size_t reserved_ = 0, cached_ = 0;
};

// Installs one CachingDeviceMemory for the process (set_device_memory) and
// returns it; later calls return the same one.
CachingDeviceMemory& install_device_memory();

}  // namespace meshlm::cuda
