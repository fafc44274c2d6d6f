// Error checks for CUDA runtime, cuBLAS and NCCL calls.
//
// A failed call is this rank's failure (its device, its driver), so every
// check throws meshlm::RankError, which the top level answers with
// fatal_one(): the rank prints its number and the message and the job aborts.
// The message names the library, the error code's name and text, and the
// call as written; the file:line of the call site travels in the exception.
//
//   CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
//   CUDA_CHECK(cudaGetLastError());   // after a kernel launch
//   CUBLAS_CHECK(cublasSgemm(handle, ...));
//   NCCL_CHECK(ncclAllReduce(...));
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "core/error.h"

namespace meshlm::cuda {

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw RankError(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                      cudaGetErrorString(err) + ") in " + call,
                  file, line);
}

// cuBLAS is opened on demand (cuda/cublas_lib.h), which also names its codes.
void cublas_check(cublasStatus_t status, const char* call, const char* file, int line);

// ncclGetLastError(nullptr) adds NCCL's own detail (which peer, which
// transport) to the short text of the result code; it is empty when NCCL has
// nothing to add.
inline void nccl_check(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  std::string msg = std::string("NCCL error ") + std::to_string(static_cast<int>(result)) + " (" +
                    ncclGetErrorString(result) + ") in " + call;
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') msg += std::string(": ") + detail;
  throw RankError(msg, file, line);
}

}  // namespace meshlm::cuda

#define CUDA_CHECK(call) ::meshlm::cuda::cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::meshlm::cuda::cublas_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) ::meshlm::cuda::nccl_check((call), #call, __FILE__, __LINE__)
