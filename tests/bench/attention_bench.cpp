// meshlm_attention_bench: time of the GPU's fused causal attention
// (cuda::flash_attention_forward / _backward, train.attention = flash), for
// comparison with PyTorch's scaled_dot_product_attention on the same GPU
// (tests/bench/torch_attention.py).
//
//   meshlm_attention_bench --batch 16 --seq_len 1024 --n_embd 768 --n_head 12
//                          [--fp16 1] [--reps 20] [--warmup 3]
//
// Inputs are random (never zeros: a product of zeros runs faster than real
// data). Each direction is timed with CUDA events around `reps` calls, after
// `warmup` untimed ones, and the median call is reported. The forward
// includes the rounding of qkv to 16 bits; the backward the rounding of qkv
// and dout and the row sums D = dout . out, as a training step pays them.
//
// FLOPs (the convention of FlashAttention's benchmarks, which PyTorch's
// peer uses too): forward 4 B NH T^2 HS / 2 (two GEMMs, causal half),
// backward 2.5 times the forward. Prints one JSON line.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "cuda/context.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"

using namespace meshlm;

namespace {

// Median of `reps` timed calls of f, each between two events on `stream`.
template <typename F>
double median_ms(cudaStream_t stream, int warmup, int reps, F f) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    f();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Buffer random_device(size_t n, uint64_t seed, float scale) {
  std::vector<float> host(n);
  Rng rng(seed);
  for (float& x : host) x = scale * static_cast<float>(2.0 * rng.uniform() - 1.0);
  Buffer buf(n * sizeof(float), MemCategory::other, "bench", Device::cuda);
  CUDA_CHECK(cudaMemcpy(buf.data(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, long> f = {{"batch", 16}, {"seq_len", 1024}, {"n_embd", 768},
                                   {"n_head", 12}, {"fp16", 0},      {"reps", 20},
                                   {"warmup", 3}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || !f.count(k.substr(2))) {
      std::fprintf(stderr, "meshlm_attention_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
    f[k.substr(2)] = std::stol(argv[i + 1]);
  }
  const int B = static_cast<int>(f["batch"]), T = static_cast<int>(f["seq_len"]);
  const int C = static_cast<int>(f["n_embd"]), NH = static_cast<int>(f["n_head"]);
  const ops::Precision p = f["fp16"] != 0 ? ops::Precision::fp16 : ops::Precision::bf16;
  std::string reason;
  if (cuda::device_count(&reason) == 0) {
    std::fprintf(stderr, "meshlm_attention_bench: no GPU (%s)\n", reason.c_str());
    return 1;
  }
  try {
    // The CUDA backend of this process: its device and the allocator of
    // device Buffers.
    const cuda::DeviceContext gpu(0, 0, p);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const size_t N = size_t(B) * T;
    // Scores of unit spread: q and k of spread 1 / HS^(1/4) each.
    const float qk = 1.0f / std::pow(static_cast<float>(C / NH), 0.25f);
    Buffer qkv = random_device(N * 3 * C, 1, qk * std::sqrt(3.0f));
    Buffer dout = random_device(N * C, 2, 1.0f);
    Buffer out(N * C * sizeof(float), MemCategory::other, "bench", Device::cuda);
    Buffer lse(size_t(B) * NH * T * sizeof(float), MemCategory::other, "bench", Device::cuda);
    Buffer delta(size_t(B) * NH * T * sizeof(float), MemCategory::other, "bench", Device::cuda);
    Buffer dqkv(N * 3 * C * sizeof(float), MemCategory::other, "bench", Device::cuda);
    CUDA_CHECK(cudaMemsetAsync(dqkv.data(), 0, dqkv.bytes(), stream));
    const int warmup = static_cast<int>(f["warmup"]), reps = static_cast<int>(f["reps"]);
    const double fwd = median_ms(stream, warmup, reps, [&] {
      cuda::flash_attention_forward(out.as<float>(), lse.as<float>(), qkv.as<float>(), B, T, C,
                                    NH, stream, p);
    });
    const double bwd = median_ms(stream, warmup, reps, [&] {
      cuda::flash_attention_backward(dqkv.as<float>(), delta.as<float>(), dout.as<float>(),
                                     out.as<float>(), qkv.as<float>(), lse.as<float>(), B, T, C,
                                     NH, stream, p);
    });
    CUDA_CHECK(cudaStreamSynchronize(stream));
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const double fwd_flops = 4.0 * B * NH * double(T) * T * (C / NH) / 2.0;
    std::printf(
        "{\"impl\": \"meshlm\", \"op\": \"attention\", \"device\": \"%s\", \"precision\": \"%s\", "
        "\"batch\": %d, \"seq_len\": %d, \"n_embd\": %d, \"n_head\": %d, \"fwd_ms\": %.4f, "
        "\"bwd_ms\": %.4f, \"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f}\n",
        prop.name, name_of(p), B, T, C, NH, fwd, bwd, fwd_flops / fwd / 1e9,
        2.5 * fwd_flops / bwd / 1e9);
    CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshlm_attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
