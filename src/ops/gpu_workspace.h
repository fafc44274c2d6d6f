// What the CUDA backend holds besides the model's Buffers, as rules it
// shares with the memory prediction (train/trainer.cpp), so that the two
// cannot drift apart:
//
//   * At bf16 and fp16 every GEMM reads 16-bit copies of the spans of A and
//     B it uses (cuda/blas.cu): one device buffer per stream, grown to the
//     largest pair a GEMM has asked for, booked as workspace.
//   * Host-to-device copies go through two pinned host buffers of
//     kUploadStageBytes (cuda/kernels_cuda.cu), booked as host workspace.
#pragma once

#include <cstddef>
#include <utility>

namespace meshlm::ops {

constexpr size_t kUploadStageBytes = size_t(8) << 20;

// Rows of a frozen quantized matrix a GPU dequantizes per GEMM under LoRA
// (GPTOptions::qtile_rows): 1024 x 3072 floats = 12 MiB for GPT-2 small's
// widest matrix.
constexpr int kGpuQTileRows = 1024;
constexpr size_t kUploadStagingBytes = 2 * kUploadStageBytes;

// Elements from the first element of a row-major operand stored (rows, cols)
// with leading dimension ld, `batch` of them `stride` apart, to its last.
constexpr size_t gemm_span(int rows, int cols, int ld, long long stride = 0, int batch = 1) {
  return size_t(batch - 1) * size_t(stride) + size_t(rows - 1) * size_t(ld) + size_t(cols);
}

// The spans of A and B that C(M,N) = op(A) op(B) reads, as Kernels::gemm
// takes its arguments: op(A) is (M,K), stored (K,M) when transposed; op(B) is
// (K,N), stored (N,K) when transposed.
constexpr std::pair<size_t, size_t> gemm_input_spans(bool ta, bool tb, int M, int N, int K,
                                                     int lda, int ldb, long long strideA = 0,
                                                     long long strideB = 0, int batch = 1) {
  return {gemm_span(ta ? K : M, ta ? M : K, lda, strideA, batch),
          gemm_span(tb ? N : K, tb ? K : N, ldb, strideB, batch)};
}

// Bytes of the 16-bit copies of spans of a and b elements: the first copy
// rounded up to 256 bytes (the second starts aligned), then the second.
constexpr size_t gemm_16bit_copies_bytes(size_t a, size_t b) {
  return (2 * a + 255) / 256 * 256 + 2 * b;
}

}  // namespace meshlm::ops
