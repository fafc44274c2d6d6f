// Token + position embedding, vocabulary-parallel: each tensor-parallel rank
// looks up the rows of wte it holds (zeros for the other tokens), the group
// sums the parts, and the position embedding is added once to the sum.
#include "ops/ops.h"
#include "ops/parallel.h"

namespace meshlm::ops {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte_part, int N, int C, int v0,
                       int Vl) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* o = out + static_cast<size_t>(n) * C;
    const int row = tokens[n] - v0;
    if (row >= 0 && row < Vl) {
      const T* te = wte_part + static_cast<size_t>(row) * C;
      for (int c = 0; c < C; ++c) o[c] = te[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = 0;
    }
  }
}

template <typename T>
void embedding_backward(T* dwte_part, const T* dout, const int32_t* tokens, int N, int C, int v0,
                        int Vl) {
  // Rows of dwte are shared between positions holding the same token: each
  // thread owns a slice of the channels (private writes, fixed order).
#pragma omp parallel
  {
    auto [c0, c1] = thread_range(C);
    for (int n = 0; n < N; ++n) {
      const int row = tokens[n] - v0;
      if (row < 0 || row >= Vl) continue;
      const T* d = dout + static_cast<size_t>(n) * C;
      T* te = dwte_part + static_cast<size_t>(row) * C;
      for (int c = c0; c < c1; ++c) te[c] += d[c];
    }
  }
}

template <typename T>
void position_forward(T* out, const T* wpe, int B, int Tn, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      T* o = out + (static_cast<size_t>(b) * Tn + t) * C;
      const T* pe = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] += pe[c];
    }
  }
}

template <typename T>
void position_backward(T* dwpe, const T* dout, int B, int Tn, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < Tn; ++t) {
    T* pe = dwpe + static_cast<size_t>(t) * C;
    for (int b = 0; b < B; ++b) {
      const T* d = dout + (static_cast<size_t>(b) * Tn + t) * C;
      for (int c = 0; c < C; ++c) pe[c] += d[c];
    }
  }
}

#define MESHLM_EMBEDDING(T)                                                                    \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, int, int);        \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int, int, int, int);       \
  template void position_forward<T>(T*, const T*, int, int, int);                              \
  template void position_backward<T>(T*, const T*, int, int, int);
MESHLM_EMBEDDING(float)
MESHLM_EMBEDDING(double)
#undef MESHLM_EMBEDDING

}  // namespace meshlm::ops
