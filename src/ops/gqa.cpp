// Grouped-query attention's packing: query heads beside the key/value head
// of their group, in the (N, 3 NH HS) layout the attention ops read.
#include "ops/ops.h"

namespace meshlm::ops {

template <typename T>
void gqa_pack_forward(T* qkv, const T* q, const T* k, const T* v, int N, int NH, int NKV, int HS) {
  const int group = NH / NKV;
  const size_t C = static_cast<size_t>(NH) * HS, Ckv = static_cast<size_t>(NKV) * HS;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = qkv + static_cast<size_t>(n) * 3 * C;
    const T* qr = q + static_cast<size_t>(n) * C;
    const T* kr = k + static_cast<size_t>(n) * Ckv;
    const T* vr = v + static_cast<size_t>(n) * Ckv;
    for (size_t c = 0; c < C; ++c) row[c] = qr[c];
    for (int h = 0; h < NH; ++h) {
      const size_t from = static_cast<size_t>(h / group) * HS, to = static_cast<size_t>(h) * HS;
      for (int d = 0; d < HS; ++d) {
        row[C + to + d] = kr[from + d];
        row[2 * C + to + d] = vr[from + d];
      }
    }
  }
}

template <typename T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int N, int NH, int NKV, int HS) {
  const int group = NH / NKV;
  const size_t C = static_cast<size_t>(NH) * HS, Ckv = static_cast<size_t>(NKV) * HS;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = dqkv + static_cast<size_t>(n) * 3 * C;
    T* dqr = dq + static_cast<size_t>(n) * C;
    T* dkr = dk + static_cast<size_t>(n) * Ckv;
    T* dvr = dv + static_cast<size_t>(n) * Ckv;
    for (size_t c = 0; c < C; ++c) dqr[c] = row[c];
    // Each key/value head: the sum over its group's query heads, in order.
    for (int g = 0; g < NKV; ++g)
      for (int d = 0; d < HS; ++d) {
        T sk = 0, sv = 0;
        for (int h = g * group; h < (g + 1) * group; ++h) {
          sk += row[C + static_cast<size_t>(h) * HS + d];
          sv += row[2 * C + static_cast<size_t>(h) * HS + d];
        }
        dkr[static_cast<size_t>(g) * HS + d] = sk;
        dvr[static_cast<size_t>(g) * HS + d] = sv;
      }
  }
}

template void gqa_pack_forward<float>(float*, const float*, const float*, const float*, int, int, int, int);
template void gqa_pack_forward<double>(double*, const double*, const double*, const double*, int, int, int, int);
template void gqa_pack_backward<float>(float*, float*, float*, const float*, int, int, int, int);
template void gqa_pack_backward<double>(double*, double*, double*, const double*, int, int, int, int);

}  // namespace meshlm::ops
