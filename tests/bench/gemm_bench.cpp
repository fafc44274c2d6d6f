// meshlm_gemm_bench: time of the CUDA backend's GEMM (ops::Kernels::gemm at
// bf16: both inputs rounded into 16-bit copies, then cuBLAS with fp32
// accumulation and output), one shape at a time, to see which GEMMs of a step
// are far from the GPU's rate.
//
//   meshlm_gemm_bench [--reps 20] SHAPE...      SHAPE = ta,tb,M,N,K (ta, tb: 0 or 1)
//
// Row-major C(M,N) = op(A) op(B) + C, as ops::gemm. Inputs are random. Each
// shape is timed over `reps` calls after 3 untimed ones;
// their mean is reported (host time of all, one wait at the end: launches
// included, as in a step) with its TFLOP/s (2 M N K) and the bytes the
// rounding and the product must move (A and B read in fp32 and written and
// read in 16 bits, C read and written in fp32) over the time. One JSON line
// per shape.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "core/timer.h"
#include "cuda/context.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"

using namespace meshlm;

namespace {

Buffer random_device(size_t n, uint64_t seed) {
  std::vector<float> host(n);
  Rng rng(seed);
  for (float& x : host) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
  Buffer buf(n * sizeof(float), MemCategory::other, "bench", Device::cuda);
  CUDA_CHECK(cudaMemcpy(buf.data(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::vector<std::string> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else if (std::count(a.begin(), a.end(), ',') == 4) {
      shapes.push_back(a);
    } else {
      std::fprintf(stderr, "meshlm_gemm_bench: unknown argument %s (SHAPE = ta,tb,M,N,K)\n", a.c_str());
      return 2;
    }
  }
  std::string reason;
  if (cuda::device_count(&reason) == 0) {
    std::fprintf(stderr, "meshlm_gemm_bench: no GPU (%s)\n", reason.c_str());
    return 1;
  }
  try {
    const cuda::DeviceContext gpu(0, 0, ops::Precision::bf16);
    const ops::Kernels& k = gpu.kernels();
    for (const std::string& shape : shapes) {
      int ta = 0, tb = 0, M = 0, N = 0, K = 0;
      if (std::sscanf(shape.c_str(), "%d,%d,%d,%d,%d", &ta, &tb, &M, &N, &K) != 5 || M <= 0 ||
          N <= 0 || K <= 0) {
        std::fprintf(stderr, "meshlm_gemm_bench: bad shape %s\n", shape.c_str());
        return 2;
      }
      const int lda = ta ? M : K, ldb = tb ? K : N;
      Buffer A = random_device(size_t(M) * K, 1), B = random_device(size_t(K) * N, 2);
      Buffer C = random_device(size_t(M) * N, 3);
      auto call = [&] {
        k.gemm(ta != 0, tb != 0, M, N, K, 1.0f, A.as<float>(), lda, B.as<float>(), ldb, 1.0f,
               C.as<float>(), N);
      };
      for (int i = 0; i < 3; ++i) call();
      k.synchronize();
      const double t0 = now_seconds();
      for (int i = 0; i < reps; ++i) call();
      k.synchronize();
      const double t = (now_seconds() - t0) / reps;
      const double in = double(M) * K + double(K) * N, out = double(M) * N;
      std::printf("{\"op\": \"gemm\", \"device\": \"%s\", \"ta\": %d, \"tb\": %d, \"M\": %d, "
                  "\"N\": %d, \"K\": %d, \"ms\": %.4f, \"tflops\": %.1f, \"gbps\": %.0f}\n",
                  gpu.name().c_str(), ta, tb, M, N, K, 1e3 * t, 2.0 * M * N * K / t / 1e12,
                  (in * (4 + 2 + 2) + out * 8) / t / 1e9);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshlm_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
