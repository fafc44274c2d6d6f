// part_boxes (model/param_table.h): the boxes of the logical tensor that a
// range of a tensor-parallel rank's part covers, checked against
// shard_from_full by enumeration, for every tensor of a GPT-2 table, every
// TP size and rank, and ranges that start and end mid-row.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "model/gpt.h"
#include "model/param_table.h"

using namespace meshlm;

namespace {

// The logical (flat, row-major) indices of the elements of `boxes`, in the
// logical tensor's row-major order; fails on overlapping boxes.
std::vector<float> indices_of(const ParamSpec& p, const std::vector<TensorBox>& boxes) {
  const int nd = std::max(p.full_shape.ndim, 1);
  std::vector<int64_t> dims(static_cast<size_t>(nd), 1);
  for (int d = 0; d < p.full_shape.ndim; ++d) dims[d] = p.full_shape.dims[d];
  std::vector<float> out;
  for (const TensorBox& b : boxes) {
    EXPECT_EQ(static_cast<int>(b.start.size()), nd);
    std::vector<int64_t> i(b.start);
    const int64_t n = b.numel();
    for (int64_t k = 0; k < n; ++k) {
      int64_t flat = 0;
      for (int d = 0; d < nd; ++d) flat = flat * dims[d] + i[d];
      out.push_back(static_cast<float>(flat));
      for (int d = nd - 1; d >= 0; --d) {  // next index of the box, row-major
        if (++i[d] < b.start[d] + b.count[d]) break;
        i[d] = b.start[d];
      }
    }
  }
  std::sort(out.begin(), out.end());
  EXPECT_TRUE(std::adjacent_find(out.begin(), out.end()) == out.end()) << p.name << ": overlap";
  return out;
}

TEST(PartBoxes, CoverTheRangeOfThePartInOrder) {
  // C = 48: c_attn's q, k and v parts (3 x 48 rows) split 1, 2, 4 ways;
  // Vp = 64 rows of wte; the MLP's 192 columns of c_proj split by columns.
  const GPTConfig cfg{1, 4, 48, 60, 8};
  std::mt19937 rng(7);
  int checked = 0;
  for (int tp : {1, 2, 4}) {
    for (int r = 0; r < tp; ++r) {
      ModelShard shard;
      shard.tp_rank = r;
      shard.tp_size = tp;
      for (const ParamSpec& p : gpt_param_table(cfg, shard)) {
        std::vector<float> full(p.full_shape.numel()), part(p.numel());
        std::iota(full.begin(), full.end(), 0.0f);  // each element holds its logical index
        shard_from_full(p, full.data(), part.data(), r, tp);
        const size_t n = p.numel();
        std::vector<std::pair<size_t, size_t>> ranges = {{0, n}, {0, 1}, {n - 1, n}};
        for (int k = 0; k < 6; ++k) {
          size_t a = rng() % n, b = rng() % (n + 1);
          if (a > b) std::swap(a, b);
          ranges.emplace_back(a, b);
        }
        for (const auto& [a, b] : ranges) {
          const std::vector<TensorBox> boxes = part_boxes(p, r, tp, a, b);
          const std::vector<float> want(part.begin() + static_cast<long>(a),
                                        part.begin() + static_cast<long>(b));
          ASSERT_EQ(indices_of(p, boxes), want)
              << p.name << " tp " << tp << " rank " << r << " [" << a << ", " << b << ")";
          EXPECT_LE(boxes.size(), static_cast<size_t>((2 * std::max(p.full_shape.ndim, 1) - 1) *
                                                      p.tp_parts))
              << p.name;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

}  // namespace
