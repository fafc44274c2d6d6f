// The pages of the node's quantized store a rank reads (load::
// store_pages_read, what the memory prediction adds for a rank that does
// not hold the store) against a reference that marks, for every run of
// logical elements the rank's part holds (param_table's for_each_part_run,
// not the quantized slice's indexing), the bytes of each array of the
// tensor those elements need, element by element. GPT-2 and Llama shapes,
// whole and split over tensor parallelism (rows and columns) and pipeline
// stages, int8 and NF4, pages of 4 KiB and 64 KiB.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "load/base_loader.h"
#include "model/param_table.h"

using namespace meshlm;

namespace {

size_t reference_pages(const load::StoreManifest& m, const GPTConfig& cfg, const ModelShard& shard,
                       int seq_len, size_t page) {
  std::vector<bool> read((m.bytes + page - 1) / page, false);
  for (const ParamSpec& p : model_param_table(cfg, shard)) {
    const load::StoreEntry& e = m.at(p.name);
    // The logical elements this rank reads: its part, or wpe's first rows.
    std::vector<std::pair<size_t, size_t>> runs;  // [a, b)
    if (p.role == ParamRole::position_embedding) {
      runs.push_back({0, size_t(std::min<int64_t>(p.full_shape[0], seq_len)) * row_floats(p)});
    } else {
      for_each_part_run(p, 0, p.full_shape[0], shard.tp_rank, shard.tp_size,
                        [&](size_t from, size_t, size_t n) { runs.push_back({from, from + n}); });
    }
    // Each array's logical elements per entry and entry size, then every
    // element of the runs (the arrays' order does not matter to the marks).
    for (int k = 0; k < e.layout.narrays; ++k) {
      const quant::QArray& arr = e.layout.arrays[k];
      if (arr.count == 0) continue;
      const std::string name = arr.name;
      const size_t per = name == "data"      ? (e.layout.type == quant::QuantType::nf4 ? 2 : 1)
                         : name == "absmax"  ? size_t(e.layout.type == quant::QuantType::nf4
                                                          ? quant::kNF4Block
                                                          : quant::kQ8Block)
                         : name == "absmax2" ? size_t(quant::kNF4Block) * quant::kNF4AbsmaxBlock
                                             : e.layout.n;
      const size_t elem = dtype_size(arr.elem);
      for (const auto& [a, b] : runs)
        for (size_t x = a; x < b; ++x) {
          const size_t i = std::min(x / per, arr.count - 1);
          for (size_t byte = i * elem; byte < (i + 1) * elem; ++byte)
            read[(e.offset + arr.offset + byte) / page] = true;
        }
    }
  }
  return static_cast<size_t>(std::count(read.begin(), read.end(), true)) * page;
}

GPTConfig llama() {
  GPTConfig c{.n_layer = 3, .n_head = 4, .n_embd = 64, .vocab_size = 300, .max_seq_len = 32};
  c.arch = ModelArch::llama;
  c.n_kv_head = 2;
  c.intermediate_size = 96;
  c.tie_word_embeddings = false;
  return c;
}

}  // namespace

TEST(StorePages, EveryRankReadsThePagesOfItsPart) {
  const GPTConfig gpt2{.n_layer = 3, .n_head = 4, .n_embd = 64, .vocab_size = 300, .max_seq_len = 40};
  int cases = 0;
  for (const GPTConfig& cfg : {gpt2, llama()})
    for (const quant::QuantType q : {quant::QuantType::int8, quant::QuantType::nf4}) {
      const load::StoreManifest m = load::make_manifest(cfg, q);
      // tp 4: Llama's two key/value heads replicated on every rank.
      for (const int tp : {1, 2, 4})
        for (const int stage : {0, 1, 2}) {
          // Stages: [0, 1), [1, 3), or the whole model.
          ModelShard s{.tp_size = tp};
          if (stage == 0) s.layer_end = 1, s.last_stage = false;
          if (stage == 1) s.layer_begin = 1, s.first_stage = false;
          for (int r = 0; r < tp; ++r)
            for (const size_t page : {size_t(4096), size_t(65536)}) {
              s.tp_rank = r;
              SCOPED_TRACE(std::string(name_of(cfg.arch)) + " " + name_of(q) + " tp " +
                           std::to_string(tp) + " rank " + std::to_string(r) + " stage " +
                           std::to_string(stage) + " page " + std::to_string(page));
              const size_t got = load::store_pages_read(m, cfg, s, 24, page);
              EXPECT_EQ(got, reference_pages(m, cfg, s, 24, page));
              EXPECT_GT(got, 0u);
              ++cases;
            }
        }
    }
  EXPECT_EQ(cases, 2 * 2 * 3 * (1 + 2 + 4) * 2);
}
