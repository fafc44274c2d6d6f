// DeviceArray<T>: an array of n elements of T in device memory for the CUDA
// tests, from cudaMalloc, freed in the destructor. upload() and download()
// copy with cudaMemcpy, which waits for the work queued on the legacy
// default stream (and nothing else: synchronise other streams first).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_check.cuh"

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
