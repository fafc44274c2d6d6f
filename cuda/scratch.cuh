// Scratch of the CUDA ops that need device memory of their own (booked as
// workspace, one buffer per use and stream, grown to the largest call; the
// rules are in ops/gpu_workspace.h, which the memory prediction shares).
//
// Column sums over rows in two passes: a kernel gives
// one partial sum per column for each of column_sum_chunks(N) chunks of
// rows, launched on a grid of (column blocks of kWarp) x (chunks); then
// add_column_partials adds the chunks' partials in order. The same bits every
// run for the same N and C.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/launch.cuh"
#include "ops/gpu_workspace.h"

namespace meshlm::cuda {

// Room for `floats` partial sums on `stream`, valid until the next call on
// the same stream (a later kernel on the stream runs after the one reading them).
float* column_partials(cudaStream_t stream, size_t floats);
// Room for `ints` int32 of embedding_backward's index on `stream`, likewise.
int32_t* embedding_index(cudaStream_t stream, size_t ints);

// Frees this host thread's scratch of `stream`, whose work has ended: a
// stream's buffers live as long as its device context (cuda/context.h), so
// that a process that trains many runs (the layout tests) holds, and books,
// only the current run's.
void release_stream_scratch(cudaStream_t stream);

// out[c] += sum over chunks k in order of partials[k * C + c], c < C.
void add_column_partials(float* out, const float* partials, int chunks, int C,
                         cudaStream_t stream);

// The grid of a partial-sums kernel over N rows and C columns.
inline dim3 column_partials_grid(long long N, int C) {
  return dim3(static_cast<unsigned>((C + kWarp - 1) / kWarp),
              static_cast<unsigned>(ops::column_sum_chunks(N)));
}

// The rows [begin, end) of chunk blockIdx.y of N rows.
__device__ __forceinline__ void chunk_rows(int N, int& begin, int& end) {
  const int per = (N + gridDim.y - 1) / gridDim.y;
  begin = blockIdx.y * per;
  end = min(N, begin + per);
}

}  // namespace meshlm::cuda
