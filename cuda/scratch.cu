// The scratch of cuda/scratch.cuh, and the second pass of the column sums.
#include "cuda/scratch.cuh"

#include <map>
#include <utility>

#include "core/alloc.h"
#include "cuda/cuda_check.cuh"

namespace meshlm::cuda {

namespace {

__global__ void add_column_partials_kernel(float* out, const float* partials, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; ++k) acc += partials[size_t(k) * C + c];
  out[c] += acc;
}

}  // namespace

namespace {

enum class Use { column_partials, embedding_index, count };

// This host thread's buffers by stream and use. The map is never destroyed
// (the allocator must not see a release after the process has torn it
// down); release_stream_scratch frees a stream's buffers with its context.
std::map<std::pair<cudaStream_t, Use>, Buffer*>& scratch_by_stream() {
  thread_local auto* by_stream = new std::map<std::pair<cudaStream_t, Use>, Buffer*>;
  return *by_stream;
}

// The buffer of `use` on `stream`, at least `bytes` (as the 16-bit GEMM
// copies of cuda/blas.cu).
void* stream_scratch(cudaStream_t stream, Use use, size_t bytes) {
  static const char* const kNames[] = {"column_sums.partials", "embedding.index"};
  Buffer*& buf = scratch_by_stream()[{stream, use}];
  if (buf == nullptr || buf->bytes() < bytes) {
    CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier kernels may still read the old one
    delete buf;
    buf = new Buffer(bytes, MemCategory::workspace, kNames[static_cast<int>(use)], Device::cuda);
  }
  return buf->data();
}

}  // namespace

void release_stream_scratch(cudaStream_t stream) {
  auto& by_stream = scratch_by_stream();
  for (int u = 0; u < static_cast<int>(Use::count); ++u) {
    const auto it = by_stream.find({stream, static_cast<Use>(u)});
    if (it == by_stream.end()) continue;
    delete it->second;
    by_stream.erase(it);
  }
}

float* column_partials(cudaStream_t stream, size_t floats) {
  return static_cast<float*>(stream_scratch(stream, Use::column_partials, floats * sizeof(float)));
}

int32_t* embedding_index(cudaStream_t stream, size_t ints) {
  return static_cast<int32_t*>(stream_scratch(stream, Use::embedding_index, ints * sizeof(int32_t)));
}

void add_column_partials(float* out, const float* partials, int chunks, int C,
                         cudaStream_t stream) {
  add_column_partials_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(out, partials,
                                                                                   chunks, C);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshlm::cuda
