// What the CUDA tests share: CudaTest, the fixture that skips (with the
// reason) where no CUDA device can be used; DeviceArray<T>, an array in
// device memory; uniform_floats, fresh random inputs.
//
// DeviceArray<T>: n elements of T from cudaMalloc, freed in the destructor.
// upload() returns once the data is on the device (cudaMemcpy from pageable
// memory may return before its DMA ends and does not order other streams,
// so it waits for the device); download() waits for the work queued on the
// legacy default stream (and nothing else: synchronise other streams first).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"

template <typename T>
class DeviceArray {
public:
  // offset > 0 shifts the pointer get() returns by that many elements past
  // the start of the allocation (which cudaMalloc aligns to 256 bytes), to
  // make it misaligned for vector loads.
  explicit DeviceArray(size_t n, size_t offset = 0) : n_(n), offset_(offset) {
    CUDA_CHECK(cudaMalloc(&base_, (n + offset) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return static_cast<T*>(base_) + offset_; }
  const T* get() const { return static_cast<const T*>(base_) + offset_; }
  size_t size() const { return n_; }

  // Copies h to the first h.size() elements.
  void upload(const std::vector<T>& h) {
    check_count(h.size(), "upload");
    CUDA_CHECK(cudaMemcpy(get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The first n elements.
  std::vector<T> download(size_t n) const {
    check_count(n, "download");
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<T> download() const { return download(n_); }

private:
  void check_count(size_t n, const char* what) const {
    if (n > n_)
      throw std::length_error(std::string("DeviceArray::") + what + " of " + std::to_string(n) +
                              " elements into an array of " + std::to_string(n_));
  }

  void* base_ = nullptr;
  size_t n_;
  size_t offset_;
};

// Skips every test of a fixture derived from it where no CUDA device can be
// used. A derived SetUp calls CudaTest::SetUp() first and returns when
// IsSkipped().
class CudaTest : public testing::Test {
protected:
  void SetUp() override {
    std::string reason;
    if (meshlm::cuda::device_count(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  }
};

// n floats uniform in [lo, hi), from meshlm's Rng with `seed`.
inline std::vector<float> uniform_floats(size_t n, uint64_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  meshlm::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return v;
}
