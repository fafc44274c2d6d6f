#include "cuda/cublas_lib.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"

// The name a <cublas_v2.h> function is exported under, after its macro.
#define MESHLM_CUBLAS_STR2(x) #x
#define MESHLM_CUBLAS_STR(x) MESHLM_CUBLAS_STR2(x)

namespace meshlm::cuda {

namespace {

const std::string kLibrary = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
const std::string kLtLibrary = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);

void* open_library(const std::string& library) {
  std::string errors;
  for (const std::string& path : {library,
#ifdef MESHLM_CUBLAS_DIR
                                  std::string(MESHLM_CUBLAS_DIR) + "/" + library
#endif
       }) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    errors += std::string(errors.empty() ? "" : "; ") + (e ? e : path);
  }
  throw RankError("runtime.backend = cuda: cannot load " + library + " (" + errors + ")",
                  MESHLM_HERE);
}

template <class F>
void resolve(void* lib, const std::string& library, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr)
    throw RankError("runtime.backend = cuda: " + library + " has no " + name +
                        " (a cuBLAS older than the one meshlm was built against?)",
                    MESHLM_HERE);
}

CublasApi load() {
  void* lib = open_library(kLibrary);
  CublasApi a{};
#define MESHLM_RESOLVE(field, fn) resolve(lib, kLibrary, a.field, MESHLM_CUBLAS_STR(fn))
  MESHLM_RESOLVE(create, cublasCreate);
  MESHLM_RESOLVE(destroy, cublasDestroy);
  MESHLM_RESOLVE(set_stream, cublasSetStream);
  MESHLM_RESOLVE(set_math_mode, cublasSetMathMode);
  MESHLM_RESOLVE(sgemm, cublasSgemm);
  MESHLM_RESOLVE(sgemm_strided_batched, cublasSgemmStridedBatched);
  MESHLM_RESOLVE(gemm_ex, cublasGemmEx);
  MESHLM_RESOLVE(gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
  MESHLM_RESOLVE(status_name, cublasGetStatusName);
  MESHLM_RESOLVE(status_string, cublasGetStatusString);
#undef MESHLM_RESOLVE
  return a;  // the library stays open for the life of the process
}

CublasLtApi load_lt() {
  void* lib = open_library(kLtLibrary);
  CublasLtApi a{};
#define MESHLM_RESOLVE(field, fn) resolve(lib, kLtLibrary, a.field, #fn)
  MESHLM_RESOLVE(create, cublasLtCreate);
  MESHLM_RESOLVE(destroy, cublasLtDestroy);
  MESHLM_RESOLVE(desc_create, cublasLtMatmulDescCreate);
  MESHLM_RESOLVE(desc_destroy, cublasLtMatmulDescDestroy);
  MESHLM_RESOLVE(desc_set, cublasLtMatmulDescSetAttribute);
  MESHLM_RESOLVE(layout_create, cublasLtMatrixLayoutCreate);
  MESHLM_RESOLVE(layout_destroy, cublasLtMatrixLayoutDestroy);
  MESHLM_RESOLVE(pref_create, cublasLtMatmulPreferenceCreate);
  MESHLM_RESOLVE(pref_destroy, cublasLtMatmulPreferenceDestroy);
  MESHLM_RESOLVE(pref_set, cublasLtMatmulPreferenceSetAttribute);
  MESHLM_RESOLVE(heuristic, cublasLtMatmulAlgoGetHeuristic);
  MESHLM_RESOLVE(matmul, cublasLtMatmul);
#undef MESHLM_RESOLVE
  return a;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static std::once_flag once;
  static CublasLtApi api{};
  std::call_once(once, [] { api = load_lt(); });
  return api;
}

const CublasApi& cublas() {
  static std::once_flag once;
  static CublasApi api{};
  std::call_once(once, [] { api = load(); });
  return api;
}

void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const CublasApi& a = cublas();
  throw RankError(std::string("cuBLAS error ") + a.status_name(status) + " (" +
                      a.status_string(status) + ") in " + call,
                  file, line);
}

}  // namespace meshlm::cuda
