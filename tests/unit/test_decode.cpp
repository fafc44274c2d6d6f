// Inference with a key/value cache (model/decode.h) and sampling
// (model/sampling.h): the decoder's logits give the training model's loss
// (model/gpt.h, itself checked against PyTorch), the cached decode one
// token at a time (and a prefill cut into chunks) gives the logits of one
// forward over the whole sequence, for GPT-2 and for Llama (grouped-query
// heads, Llama 3 rope scaling, tied and untied classifier); the sampler's
// rules and its determinism. The whole command against independent PyTorch
// models: tests/torch/check_generate.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/generate_text.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/decode.h"
#include "model/gpt.h"
#include "model/sampling.h"
#include "text/bpe.h"
#include "decode_cases.h"
#include "train/emulated_device.h"

using namespace meshlm;

namespace {

// Mean cross-entropy of logits rows (n, Vp) against targets, over [0, V).
double mean_xent(const std::vector<float>& logits, int Vp, int V, const std::vector<int32_t>& y) {
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float* row = logits.data() + i * Vp;
    const double mx = *std::max_element(row, row + V);
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(row[v] - mx);
    sum += std::log(s) + mx - row[y[i]];
  }
  return sum / static_cast<double>(y.size());
}

}  // namespace

// The decoder's logits over a whole sequence give the training model's
// loss: the same function of the same weights.
TEST(Decoder, LogitsGiveTheTrainingModelsLoss) {
  for (const DecodeCase& c : decode_cases()) {
    SCOPED_TRACE(c.name);
    const int T = 30;
    GPT gpt(c.cfg);
    random_weights(c.cfg, gpt.table(), gpt.params(), 7);
    const std::vector<int32_t> seq = random_tokens(T + 1, c.cfg.vocab_size, 11);
    const std::vector<int32_t> x(seq.begin(), seq.end() - 1), y(seq.begin() + 1, seq.end());
    const double loss = gpt.forward(x.data(), y.data(), 1, T);

    Decoder dec(c.cfg, T);
    ASSERT_EQ(table_numel(dec.table()), gpt.num_params());
    std::copy(gpt.params(), gpt.params() + gpt.num_params(), dec.params());
    const int Vp = c.cfg.padded_vocab_size();
    std::vector<float> logits(static_cast<size_t>(T) * Vp);
    dec.forward(x.data(), T, logits.data(), /*all_rows=*/true);
    const double got = mean_xent(logits, Vp, c.cfg.vocab_size, y);
    EXPECT_NEAR(got, loss, 1e-5 * loss);
    // Far from a uniform prediction: the test could tell a wrong attention.
    EXPECT_GT(std::abs(loss - std::log(c.cfg.vocab_size)), 0.5);
  }
}

// Prefill of 7 tokens (in chunks of 3 rows), then one token at a time
// against the cache: every position's logits those of one forward of the
// whole sequence (without cache, one chunk), within float rounding.
TEST(Decoder, CachedDecodeEqualsTheWholeForward) {
  expect_decode_matches_whole_forward(ops::Kernels::cpu(), 1e-5);
}

// The same on the emulated device: the parameters, the cache and the
// scratch in device memory the host cannot touch (a host access would stop
// the test with SIGSEGV), the tokens uploaded and the logits downloaded.
TEST(Decoder, RunsOnTheEmulatedDevice) {
  const EmulatedDevice device(ops::Precision::fp32);
  const MemTracker& mem = MemTracker::get();
  const size_t before = mem.current_total(Device::cuda);
  {
    Decoder dec(gpt2_config(), 8, 3, device.kernels());
    EXPECT_TRUE(device.kernels().holds(dec.params()));
    EXPECT_GT(mem.current(MemCategory::params, Device::cuda), 0u);
    EXPECT_GT(mem.current(MemCategory::activations, Device::cuda), 0u);
  }
  EXPECT_EQ(mem.current_total(Device::cuda), before);
  expect_decode_matches_whole_forward(device.kernels(), 1e-5);
}

TEST(Decoder, RefusesIdsOutsideTheVocabularyAndPositionsPastTheContext) {
  const GPTConfig cfg = gpt2_config();
  Decoder dec(cfg, 8);
  std::vector<float> logits(cfg.padded_vocab_size());
  const int32_t bad[] = {1, cfg.vocab_size};
  EXPECT_THROW(dec.forward(bad, 2, logits.data()), RankError);
  const int32_t neg = -1;
  EXPECT_THROW(dec.forward(&neg, 1, logits.data()), RankError);
  const std::vector<int32_t> x(9, 1);
  EXPECT_THROW(dec.forward(x.data(), 9, logits.data()), RankError);
  dec.forward(x.data(), 8, logits.data());
  EXPECT_THROW(dec.forward(x.data(), 1, logits.data()), RankError);
  EXPECT_THROW(Decoder(cfg, cfg.max_seq_len + 1), Error);
}

// ---------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------

TEST(Sampling, GreedyAndTopK1AreTheArgmaxLowestIdFirst) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(argmax(l), 1u);
  Rng rng(1);
  for (double temp : {0.0, 0.7, 1.0, 5.0}) {
    Sampler greedy({.temperature = temp, .top_k = 1});
    for (int i = 0; i < 20; ++i) EXPECT_EQ(greedy.next(l, rng), 1u);
  }
  Sampler zero({.temperature = 0, .top_k = 3, .top_p = 0.1});
  EXPECT_EQ(zero.next(l, rng), 1u);
}

TEST(Sampling, SameSeedSameTokensOtherSeedOthers) {
  std::vector<float> l(200);
  Rng init(3);
  for (float& x : l) x = static_cast<float>(init.normal());
  auto draw = [&](uint64_t seed) {
    Sampler s({.temperature = 1.3, .top_k = 50, .top_p = 0.9});
    Rng rng(seed);
    std::vector<uint32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.next(l, rng));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

// Frequencies of 200000 draws against the distribution the rules define.
void expect_frequencies(const std::vector<float>& l, const SamplingOptions& o,
                        const std::vector<double>& want) {
  Sampler s(o);
  Rng rng(11);
  std::vector<double> n(l.size());
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) n[s.next(l, rng)] += 1;
  for (size_t v = 0; v < l.size(); ++v) EXPECT_NEAR(n[v] / draws, want[v], 0.005) << "id " << v;
}

TEST(Sampling, TemperatureTopKAndTopPShapeTheDistribution) {
  // p = softmax(l) = 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1).
  const std::vector<float> l = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  expect_frequencies(l, {.temperature = 1}, {0.3, 0.05, 0.5, 0.15});
  // T = 2: p^(1/2) renormalised.
  double z = std::sqrt(0.3) + std::sqrt(0.05) + std::sqrt(0.5) + std::sqrt(0.15);
  expect_frequencies(l, {.temperature = 2},
                     {std::sqrt(0.3) / z, std::sqrt(0.05) / z, std::sqrt(0.5) / z, std::sqrt(0.15) / z});
  // top-k 2: ids 2 and 0, renormalised.
  expect_frequencies(l, {.temperature = 1, .top_k = 2}, {0.375, 0, 0.625, 0});
  // top-p 0.7: 0.5 < 0.7 <= 0.5 + 0.3: ids 2 and 0.
  expect_frequencies(l, {.temperature = 1, .top_p = 0.7}, {0.375, 0, 0.625, 0});
  // top-p 0.5: id 2 alone holds it.
  expect_frequencies(l, {.temperature = 1, .top_p = 0.5}, {0, 0, 1, 0});
  // top-k 3 then top-p 0.85 of what it kept (0.95): 0.5 + 0.3 = 0.8 < 0.8075.
  expect_frequencies(l, {.temperature = 1, .top_k = 3, .top_p = 0.85},
                     {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95});
}

// What --print text may write of the bytes so far: all but an incomplete
// UTF-8 character at the end (app/generate_text.h).
TEST(GenerateText, HoldsBackAnIncompleteUtf8Character) {
  const std::string euro = "\xE2\x82\xAC", emoji = "\xF0\x9F\x98\x80";
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a" + euro), 4u);
  EXPECT_EQ(utf8_complete_prefix("a" + euro.substr(0, 1)), 1u);
  EXPECT_EQ(utf8_complete_prefix("a" + euro.substr(0, 2)), 1u);
  EXPECT_EQ(utf8_complete_prefix("ab" + emoji.substr(0, 3)), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab" + emoji), 6u);
  EXPECT_EQ(utf8_complete_prefix("\xC3"), 0u);
  EXPECT_EQ(utf8_complete_prefix("\xC3\xA9"), 2u);
  // Bytes that can never complete a character go out as they are.
  EXPECT_EQ(utf8_complete_prefix("a\x80\x80"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xFF"), 2u);
  EXPECT_EQ(utf8_complete_prefix("\x80\x80\x80\x80"), 4u);
}

// --print text of an id the tokenizer leaves unassigned (a tokenizer.json
// whose ids have gaps), below its vocabulary size as above it: a warning
// naming the id, no text for it, and the text of the others.
TEST(GenerateText, AnIdWithoutATokenIsSkippedWithAWarning) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[text::byte_char(static_cast<uint8_t>(b))] = b;
  nlohmann::json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                       {"pre_tokenizer", {{"type", "ByteLevel"}}},
                       {"added_tokens", nlohmann::json::array({{{"id", 300},
                                                                {"content", "<|endoftext|>"},
                                                                {"special", true}}})}};
  const std::string path = ::testing::TempDir() + "/gaps_tokenizer.json";
  std::ofstream(path) << tj.dump();
  auto codec = open_text_codec(path, "", true, "");
  std::filesystem::remove(path);
  auto sink = codec->sink({}, {*codec->eot()});
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  for (uint32_t id : {uint32_t{'h'}, 256u, uint32_t{'i'}, 301u}) sink->put(id);
  sink->finish();
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "hi\n");
  EXPECT_NE(err.find("WARNING: generated id 256 "), std::string::npos) << err;
  EXPECT_NE(err.find("WARNING: generated id 301 "), std::string::npos) << err;
  EXPECT_EQ(err.find("id 256 is not in"), std::string::npos) << err;
}

// The ids that end generation (the tokenizer's end-of-text id, the model's
// eos_token_id) have no text; the others' is written.
TEST(GenerateText, TheIdsThatEndGenerationHaveNoText) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[text::byte_char(static_cast<uint8_t>(b))] = b;
  nlohmann::json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                       {"pre_tokenizer", {{"type", "ByteLevel"}}},
                       {"added_tokens", nlohmann::json::array({{{"id", 256}, {"content", "<|endoftext|>"},
                                                                {"special", true}},
                                                               {{"id", 257}, {"content", "<|eot_id|>"},
                                                                {"special", true}}})}};
  const std::string path = ::testing::TempDir() + "/stops_tokenizer.json";
  std::ofstream(path) << tj.dump();
  auto codec = open_text_codec(path, "", true, "");
  std::filesystem::remove(path);
  for (const bool stop : {false, true}) {
    auto sink = codec->sink({}, stop ? std::vector<uint32_t>{256, 257} : std::vector<uint32_t>{});
    ::testing::internal::CaptureStdout();
    for (uint32_t id : {uint32_t{'o'}, uint32_t{'k'}, 257u}) sink->put(id);
    sink->finish();
    EXPECT_EQ(::testing::internal::GetCapturedStdout(), stop ? "ok\n" : "ok<|eot_id|>\n");
  }
}
