// CachingDeviceMemory (cuda/device_memory.h), the allocator behind device
// Buffers: blocks are reused, handed out zeroed, counted, given back by
// empty_cache, and an allocation beyond the device is an error naming the
// buffer. Every test skips, with the reason, where no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device_memory.h"
#include "cuda/ops_cuda.h"
#include "cuda_test.h"

using namespace meshlm;

namespace {

class CudaDeviceMemory : public CudaTest {};

}  // namespace

TEST(CachingDeviceMemoryRounding, BinsAreCoarseAboveOneMiB) {
  EXPECT_EQ(cuda::CachingDeviceMemory::rounded(1), 512u);
  EXPECT_EQ(cuda::CachingDeviceMemory::rounded(513), 1024u);
  EXPECT_EQ(cuda::CachingDeviceMemory::rounded((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(cuda::CachingDeviceMemory::rounded(5u << 20), 6u << 20);
}

// A released block is handed out again for the same bin, zeroed although it
// was written; reserved and cached bytes follow; empty_cache returns them.
TEST_F(CudaDeviceMemory, ReusesZeroesAndCounts) {
  cuda::CachingDeviceMemory m;
  void* a = m.allocate(3000, "a");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(m.reserved_bytes(), 3072u);
  CUDA_CHECK(cudaMemset(a, 0x5A, 3000));
  m.release(a, 3000);
  EXPECT_EQ(m.cached_bytes(), 3072u);
  void* b = m.allocate(2900, "b");  // the same 3072-byte bin
  EXPECT_EQ(b, a);
  EXPECT_EQ(m.cached_bytes(), 0u);
  std::vector<uint8_t> h(3072, 1);
  CUDA_CHECK(cudaMemcpy(h.data(), b, h.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, std::vector<uint8_t>(3072, 0));
  m.release(b, 2900);
  m.empty_cache();
  EXPECT_EQ(m.reserved_bytes(), 0u);
  EXPECT_EQ(m.cached_bytes(), 0u);
}

TEST_F(CudaDeviceMemory, TooLargeIsAnErrorNamingTheBuffer) {
  cuda::CachingDeviceMemory m;
  try {
    m.allocate(size_t(1) << 52, "wte.grads");
    ADD_FAILURE() << "4 PiB allocated";
  } catch (const RankError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of device memory"), std::string::npos) << what;
    EXPECT_NE(what.find("wte.grads"), std::string::npos) << what;
  }
  EXPECT_EQ(m.reserved_bytes(), 0u);
}

// Buffers on Device::cuda through the installed allocator, counted by the
// tracker under the device.
TEST_F(CudaDeviceMemory, DeviceBuffersAreTracked) {
  cuda::CachingDeviceMemory& m = cuda::install_device_memory();
  MemTracker& t = MemTracker::get();
  const size_t before = t.current(MemCategory::activations, Device::cuda);
  {
    Buffer b(1 << 20, MemCategory::activations, "acts", Device::cuda);
    EXPECT_EQ(t.current(MemCategory::activations, Device::cuda), before + (1 << 20));
    cudaPointerAttributes attr{};
    CUDA_CHECK(cudaPointerGetAttributes(&attr, b.data()));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);  // not managed memory
  }
  EXPECT_EQ(t.current(MemCategory::activations, Device::cuda), before);
  EXPECT_GE(m.cached_bytes(), size_t(1) << 20);
  m.empty_cache();
  set_device_memory(nullptr);
}
