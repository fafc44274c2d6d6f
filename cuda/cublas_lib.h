// cuBLAS, loaded when the CUDA backend first needs it.
//
// libcublas (with libcublasLt, which it pulls in) maps hundreds of
// megabytes: linked into meshlm, it would cost every process about a second
// at start, GPU or not, and make a CPU-only node need the library to run
// meshlm at all. So meshlm links only the CUDA runtime, and the first GEMM
// (or the first cuBLAS error message) opens libcublas.so.<major> with
// dlopen: from the dynamic linker's usual places (LD_LIBRARY_PATH, ld.so
// cache), else from the CUDA toolkit meshlm was built against. A library
// that cannot be opened, or lacks a function, is a RankError naming it.
//
// The table holds the few functions cuda/blas.cu calls, typed from
// <cublas_v2.h> (whose names such as cublasCreate are macros for the
// versioned symbols cublasCreate_v2 the library exports).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace meshlm::cuda {

// The C++ overloads <cublas_api.h> adds for the old cudaDataType compute
// type make these two ambiguous: the library's own (C) signatures.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void*, const void*, cudaDataType, int,
                                        const void*, cudaDataType, int, const void*, void*,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long, const void*, cudaDataType, int, long long, const void*, void*,
    cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&::cublasCreate) create;
  decltype(&::cublasDestroy) destroy;
  decltype(&::cublasSetStream) set_stream;
  decltype(&::cublasSetMathMode) set_math_mode;
  decltype(&::cublasSgemm) sgemm;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched;
  CublasGemmEx gemm_ex;
  CublasGemmStridedBatchedEx gemm_strided_batched_ex;
  decltype(&::cublasGetStatusName) status_name;
  decltype(&::cublasGetStatusString) status_string;
};

// Opens the library at the first call (thread-safe); the table lives for
// the process. Throws RankError when it cannot be opened.
const CublasApi& cublas();

// cuBLASLt (libcublasLt.so.<major>, which libcublas itself loads), for the
// GEMMs whose epilogue adds the bias (cuda/blas.cu), opened the same way.
struct CublasLtApi {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtMatmulDescCreate) desc_create;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&::cublasLtMatmul) matmul;
};
const CublasLtApi& cublaslt();

}  // namespace meshlm::cuda
