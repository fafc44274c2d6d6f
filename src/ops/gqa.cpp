// Grouped-query attention's packing: query heads beside the key/value head
// they read, in the (N, 3 NH HS) layout the attention ops read.
#include "core/error.h"
#include "ops/ops.h"

namespace meshlm::ops {

namespace {

int group_of(int NH, int NKV, GqaMap m) {
  const int group = m.group > 0 ? m.group : NH / NKV;
  MESHLM_CHECK(NKV > 0 && group > 0 && m.q_head0 >= 0, "gqa: bad head counts");
  MESHLM_CHECK(m.q_head0 / group >= 0 && (m.q_head0 + NH - 1) / group < NKV,
               "gqa: a query head reads a key/value head that is not held");
  return group;
}

}  // namespace

template <typename T>
void gqa_pack_forward(T* qkv, const T* q, const T* k, const T* v, int N, int NH, int NKV, int HS,
                      GqaMap m) {
  const int group = group_of(NH, NKV, m);
  const size_t C = static_cast<size_t>(NH) * HS, Ckv = static_cast<size_t>(NKV) * HS;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = qkv + static_cast<size_t>(n) * 3 * C;
    const T* qr = q + static_cast<size_t>(n) * C;
    const T* kr = k + static_cast<size_t>(n) * Ckv;
    const T* vr = v + static_cast<size_t>(n) * Ckv;
    for (size_t c = 0; c < C; ++c) row[c] = qr[c];
    for (int h = 0; h < NH; ++h) {
      const size_t from = static_cast<size_t>((m.q_head0 + h) / group) * HS,
                   to = static_cast<size_t>(h) * HS;
      for (int d = 0; d < HS; ++d) {
        row[C + to + d] = kr[from + d];
        row[2 * C + to + d] = vr[from + d];
      }
    }
  }
}

template <typename T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int N, int NH, int NKV, int HS,
                       GqaMap m) {
  const int group = group_of(NH, NKV, m);
  const size_t C = static_cast<size_t>(NH) * HS, Ckv = static_cast<size_t>(NKV) * HS;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = dqkv + static_cast<size_t>(n) * 3 * C;
    T* dqr = dq + static_cast<size_t>(n) * C;
    T* dkr = dk + static_cast<size_t>(n) * Ckv;
    T* dvr = dv + static_cast<size_t>(n) * Ckv;
    for (size_t c = 0; c < C; ++c) dqr[c] = row[c];
    // Each key/value head: the sum over the query heads that read it, in order.
    for (int g = 0; g < NKV; ++g) {
      const int h0 = std::max(0, g * group - m.q_head0), h1 = std::min(NH, (g + 1) * group - m.q_head0);
      for (int d = 0; d < HS; ++d) {
        T sk = 0, sv = 0;
        for (int h = h0; h < h1; ++h) {
          sk += row[C + static_cast<size_t>(h) * HS + d];
          sv += row[2 * C + static_cast<size_t>(h) * HS + d];
        }
        dkr[static_cast<size_t>(g) * HS + d] = sk;
        dvr[static_cast<size_t>(g) * HS + d] = sv;
      }
    }
  }
}

template void gqa_pack_forward<float>(float*, const float*, const float*, const float*, int, int, int, int, GqaMap);
template void gqa_pack_forward<double>(double*, const double*, const double*, const double*, int, int, int, int, GqaMap);
template void gqa_pack_backward<float>(float*, float*, float*, const float*, int, int, int, int, GqaMap);
template void gqa_pack_backward<double>(double*, double*, double*, const double*, int, int, int, int, GqaMap);

}  // namespace meshlm::ops
