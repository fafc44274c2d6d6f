// cuda::DeviceContext: picking the rank's device, its stream and allocator.
#include "cuda/context.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device_memory.h"
#include "cuda/kernels_cuda.h"
#include "cuda/ops_cuda.h"
#include "cuda/scratch.cuh"

namespace meshlm::cuda {

DeviceContext::DeviceContext(int node_rank, int rank, ops::Precision p) {
  std::string reason;
  count_ = cuda::device_count(&reason);
  if (count_ == 0)
    throw RankError("runtime.backend = cuda: rank " + std::to_string(rank) +
                        " can use no GPU (" + reason + ")",
                    MESHLM_HERE);
  device_ = node_rank % count_;
  CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  name_ = prop.name;
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  install_device_memory();
  kernels_ = make_kernels(s, p);
  dequantizer_ = make_dequantizer(s);
}

DeviceContext::~DeviceContext() {
  kernels_.reset();
  dequantizer_.reset();
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    // The stream's scratch goes with it (a later context may get the same
    // handle, and a process that trains again holds only its new run's).
    release_gemm_copies(static_cast<cudaStream_t>(stream_));
    release_stream_scratch(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

size_t DeviceContext::used_bytes() const {
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total - free_bytes;
}

size_t DeviceContext::total_bytes() const {
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total;
}

size_t DeviceContext::reserved_bytes() const { return install_device_memory().reserved_bytes(); }

}  // namespace meshlm::cuda
