// What the CUDA backend holds besides the model's Buffers, as rules it
// shares with the memory prediction (plan/memory.cpp, device_workspace_bytes,
// on the step model/step_declaration.h declares), so that the two
// cannot drift apart:
//
//   * At bf16 and fp16 every GEMM reads 16-bit copies of the spans of A and
//     B it uses (cuda/blas.cu): one device buffer per stream, grown to the
//     largest pair a GEMM has asked for, booked as workspace. A linear
//     layer's backward rounds dout once for its two GEMMs: a triple. The
//     fused attention (cuda/flash_attention.cu) rounds qkv into the same
//     buffer, and dout beside it in its backward: a pair. An operand held
//     rounded (Kernels::hold_rounded: the classifier's weight for its
//     chunks, a LoRA layer's input and dout for its backward) is not
//     copied again by the GEMMs that read it: its copy lives in a buffer of
//     its own, one per depth of nesting, as large as the largest span held
//     at that depth.
//   * Host-to-device copies go through two pinned host buffers of
//     kUploadStageBytes (cuda/kernels_cuda.cu), booked as host workspace.
//   * Sums over the N rows of a column (the bias gradients, LayerNorm's dw
//     and db) run in two passes (cuda/scratch.cu): column_sum_chunks(N)
//     chunks of rows, each giving one partial sum per column, then the
//     partials added in chunk order. The partials live in one device buffer
//     per stream, grown to the largest call, booked as workspace.
//   * The embedding's backward groups the positions of each token row on the
//     host and uploads the index (embedding_index_bytes), likewise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace meshlm::ops {

constexpr size_t kUploadStageBytes = size_t(8) << 20;

// Rows of a frozen quantized matrix a GPU dequantizes per GEMM under LoRA
// (GPTOptions::qtile_rows): every block matrix of GPT-2 small and 1.5B in
// one tile, the tied classifier in 7 tiles (8192 x 768 floats = 24 MiB at
// 124M, 8192 x 1600 = 50 MiB at 1.5B). Each tile is a GEMM of its own, and
// each GEMM rounds its whole input again: with 1024 rows the classifier's
// 50 tiles per chunk of rows made GPT-2 small's LoRA step 3.2x full
// training's on an H200 (225 ms against 70.5).
constexpr int kGpuQTileRows = 8192;

// Logits a GPU computes per classifier chunk (GPTOptions::classifier_rows =
// this / the vocabulary): 256 MiB, four times the CPU's chunk. Each chunk
// rounds all of wte to 16 bits for two of its GEMMs, so fewer chunks mean
// fewer such passes (GPT-2 small, B = 16, T = 1024: 13 chunks instead of 50).
constexpr size_t kGpuClassifierChunkFloats = size_t(1) << 26;
constexpr size_t kUploadStagingBytes = 2 * kUploadStageBytes;

// Chunks of rows of a GPU column sum over N rows: about kColumnChunkRows rows
// each, at most kMaxColumnChunks, so that even 768 columns give the GPU
// 24 x 64 blocks; a function of N alone, so the sum is the same bits every run.
constexpr long long kColumnChunkRows = 256;
constexpr long long kMaxColumnChunks = 64;
constexpr int column_sum_chunks(long long N) {
  const long long c = (N + kColumnChunkRows - 1) / kColumnChunkRows;
  return static_cast<int>(c < 1 ? 1 : (c > kMaxColumnChunks ? kMaxColumnChunks : c));
}
// Bytes of the partial sums of `columns` float columns (all quantities of
// one call together) over N rows.
constexpr size_t column_partials_bytes(long long N, size_t columns) {
  return size_t(column_sum_chunks(N)) * columns * sizeof(float);
}

// Bytes of embedding_backward's index for N positions at most: rows[U],
// starts[U + 1] and the positions, U <= N distinct rows.
constexpr size_t embedding_index_bytes(long long N) { return size_t(3 * N + 1) * sizeof(int32_t); }

// Elements from the first element of a row-major operand stored (rows, cols)
// with leading dimension ld, `batch` of them `stride` apart, to its last;
// 0 for an operand of no elements (a GEMM with a dimension of 0 reads none).
constexpr size_t gemm_span(int rows, int cols, int ld, long long stride = 0, int batch = 1) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
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
// rounded up to 256 bytes (the second starts aligned), then the second. With
// c, a third copy after the second, rounded up likewise: a linear layer's
// backward rounds dout once for its two GEMMs (dout, w, inp).
constexpr size_t gemm_16bit_copies_bytes(size_t a, size_t b, size_t c = 0) {
  return (2 * a + 255) / 256 * 256 + (c == 0 ? 2 * b : (2 * b + 255) / 256 * 256 + 2 * c);
}

}  // namespace meshlm::ops
