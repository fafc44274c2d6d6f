// One rank's GPU: the device it computes on, a non-blocking stream, the
// caching device allocator behind Buffers on Device::cuda, and the ops of the
// CUDA backend on that stream (ops::Kernels, quant::Dequantizer).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ops/kernels.h"
#include "quant/dequantizer.h"

namespace meshlm::cuda {

class DeviceContext {
public:
  // Takes device `node_rank` modulo the node's device count; its kernels
  // compute at precision `p`. RankError naming `rank` (the world rank) and
  // CUDA's reason when this process can use no device.
  DeviceContext(int node_rank, int rank, ops::Precision p = ops::Precision::fp32);
  ~DeviceContext();  // waits for the stream, then destroys it
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  const ops::Kernels& kernels() const { return *kernels_; }
  const quant::Dequantizer& dequantizer() const { return *dequantizer_; }
  int device() const { return device_; }
  int device_count() const { return count_; }
  // The cudaStream_t the kernels run on.
  void* stream() const { return stream_; }
  // "NVIDIA H100 80GB HBM3", as the driver names it.
  const std::string& name() const { return name_; }
  // The device's memory as the driver sees it (cudaMemGetInfo): in use by
  // every process on the device, and in all.
  size_t used_bytes() const;
  size_t total_bytes() const;
  // Bytes this process holds through the caching allocator (in use + cached).
  size_t reserved_bytes() const;

private:
  int device_ = 0, count_ = 0;
  std::string name_;
  void* stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<ops::Kernels> kernels_;
  std::unique_ptr<quant::Dequantizer> dequantizer_;
};

}  // namespace meshlm::cuda
