// grad_buckets (plan/memory.h): the buckets in which ZeRO 0/1 reduce the
// layers' gradients during the backward under comm.overlap. Checked against
// the table's own ranges of each layer, worked out here: the buckets are
// contiguous from the last layer down, cover every layer's gradients once,
// reach the bucket size (all but the lowest) and do not overshoot it by a
// whole layer; a bucket of one byte is one layer each, a huge one is one.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "model/gpt_config.h"
#include "model/param_table.h"
#include "plan/memory.h"

using namespace meshlm;

namespace {

// Each layer's [first, last) element in the flat buffer, from the table.
std::vector<std::pair<size_t, size_t>> layer_spans(const std::vector<ParamSpec>& t) {
  std::vector<std::pair<size_t, size_t>> s;
  for (const ParamSpec& p : t) {
    if (p.layer < 0) continue;
    if (s.size() <= size_t(p.layer)) s.resize(p.layer + 1, {SIZE_MAX, 0});
    s[p.layer].first = std::min(s[p.layer].first, p.offset);
    s[p.layer].second = std::max(s[p.layer].second, p.offset + p.numel());
  }
  return s;
}

TEST(GradBuckets, WholeLayersFromTheTopReachingTheBucketSize) {
  GPTConfig c;
  c.n_layer = 6;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 256;
  c.max_seq_len = 32;
  const std::vector<ParamSpec> t = model_param_table(c);
  const auto spans = layer_spans(t);
  const size_t layer_bytes = (spans[0].second - spans[0].first) * sizeof(float);
  for (const size_t bucket : {size_t(1), layer_bytes + 1, 2 * layer_bytes, 5 * layer_bytes / 2,
                              size_t(1) << 30}) {
    SCOPED_TRACE(bucket);
    const std::vector<GradBucket> b = grad_buckets(t, bucket);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.front().end, spans.back().second);
    EXPECT_EQ(b.back().begin, spans.front().first);
    EXPECT_EQ(b.back().layer, 0);
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b[i].begin, spans[b[i].layer].first);  // starts at its lowest layer
      if (i + 1 < b.size()) {
        EXPECT_EQ(b[i + 1].end, b[i].begin);  // contiguous, top down
        EXPECT_GE((b[i].end - b[i].begin) * sizeof(float), bucket);
        // Without its lowest layer it would not have reached the size.
        EXPECT_LT((b[i].end - spans[b[i].layer].second) * sizeof(float), bucket);
      }
    }
    if (bucket == 1) EXPECT_EQ(b.size(), size_t(c.n_layer));
    if (bucket == (size_t(1) << 30)) EXPECT_EQ(b.size(), 1u);
    if (bucket == 2 * layer_bytes) EXPECT_EQ(b.size(), 3u);
  }
}

}  // namespace
