// The tokenizers of src/text on tokenizers small enough to work out by hand:
// the merge order, added tokens, ignore_merges, the pre-tokenizer's pieces,
// bytes that are not UTF-8, and the errors of malformed files. The real
// GPT-2 / Llama 3 / SentencePiece tokenizers are checked against their
// reference implementations by tests/text/check_tokenize.py.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "expect_error.h"
#include "scratch_dir.h"
#include "text/bpe.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"

using meshlm::text::byte_char;
using meshlm::text::load_tokenizer;
using nlohmann::json;

namespace {

// Byte b has id b; `extra` tokens (in the byte alphabet) follow from 256.
json tiny_tokenizer(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<uint8_t>(b))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  json root;
  root["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  root["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["normalizer"] = nullptr;
  root["added_tokens"] = json::array();
  return root;
}

class TextTest : public ScratchDirTest {
protected:
  std::unique_ptr<meshlm::text::Tokenizer> load(const json& j) {
    const std::string path = file("tokenizer.json");
    std::ofstream(path) << j.dump();
    return load_tokenizer(path);
  }
  std::vector<uint32_t> ids(const meshlm::text::Tokenizer& t, std::string_view s) {
    std::vector<uint32_t> out;
    t.encode(s, out);
    return out;
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(file(name)) << text;
    return file(name);
  }
};

TEST_F(TextTest, LowestRankMergesFirst) {
  // (b, c) has the better rank: "abc" is a + bc, and a + bc is no merge.
  auto t = load(tiny_tokenizer({"bc", "ab"}, {"b c", "a b"}));
  EXPECT_EQ(ids(*t, "abc"), (std::vector<uint32_t>{'a', 256}));
  EXPECT_EQ(ids(*t, "abd"), (std::vector<uint32_t>{257, 'd'}));
}

TEST_F(TextTest, EqualRanksMergeLeftmostFirst) {
  auto t = load(tiny_tokenizer({"aa", "aaaa"}, {"a a", "aa aa"}));
  EXPECT_EQ(ids(*t, "aaa"), (std::vector<uint32_t>{256, 'a'}));
  EXPECT_EQ(ids(*t, "aaaaa"), (std::vector<uint32_t>{257, 'a'}));
}

TEST_F(TextTest, MergesStoredAsPairsGiveTheSameIds) {
  json a = tiny_tokenizer({"bc", "ab", "abc"}, {"b c", "a b", "a bc"});
  json b = a;
  b["model"]["merges"] = json::array({json::array({"b", "c"}), json::array({"a", "b"}),
                                      json::array({"a", "bc"})});
  EXPECT_EQ(ids(*load(a), "abcabc ab"), ids(*load(b), "abcabc ab"));
  EXPECT_EQ(ids(*load(b), "abc"), (std::vector<uint32_t>{258}));
}

TEST_F(TextTest, PreTokenizerPiecesAreMergedApart) {
  // "a b" never merges across the space: " b" is its own piece.
  auto t = load(tiny_tokenizer({"ab", byte_char(' ') + "b"}, {"a b", byte_char(' ') + " b"}));
  EXPECT_EQ(ids(*t, "ab a b"), (std::vector<uint32_t>{256, ' ', 'a', 257}));
}

TEST_F(TextTest, Gpt2PatternSplitsAsOpenAIs) {
  meshlm::text::Regex re(meshlm::text::kGpt2Pattern, "test");
  std::vector<std::string_view> pieces;
  re.split("Hello world's  test\n\n 123 \xC3\xBC\xC3\xA9!?", pieces);
  const std::vector<std::string_view> want = {"Hello", " world", "'s", " ", " test", "\n\n",
                                              " 123", " \xC3\xBC\xC3\xA9", "!?"};
  EXPECT_EQ(pieces, want);
}

TEST_F(TextTest, IgnoreMergesTakesAWholePieceThatIsAToken) {
  json j = tiny_tokenizer({"xyz"}, {});
  EXPECT_EQ(ids(*load(j), "xyz"), (std::vector<uint32_t>{'x', 'y', 'z'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(ids(*load(j), "xyz"), (std::vector<uint32_t>{256}));
}

TEST_F(TextTest, AddedTokensAreSplitOutLongestFirst) {
  json j = tiny_tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|end"}, {"special", true}},
                                   {{"id", 301}, {"content", "<|endoftext|>"}, {"special", true}}});
  auto t = load(j);
  EXPECT_EQ(ids(*t, "a<|endoftext|>b<|end"), (std::vector<uint32_t>{'a', 301, 'b', 300}));
  EXPECT_EQ(t->vocab_size(), 302u);
  EXPECT_EQ(t->eot_id(), 301u);
  EXPECT_EQ(t->token_bytes(301), "<|endoftext|>");
  EXPECT_FALSE(t->bos_id().has_value());
}

TEST_F(TextTest, TemplatePostProcessorGivesTheBos) {
  json j = tiny_tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 256}, {"content", "<|begin_of_text|>"}, {"special", true}}});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}};
  EXPECT_EQ(load(j)->bos_id(), 256u);
}

TEST_F(TextTest, AddPrefixSpace) {
  json j = tiny_tokenizer({}, {});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(ids(*load(j), "hi"), (std::vector<uint32_t>{' ', 'h', 'i'}));
  EXPECT_EQ(ids(*load(j), " hi"), (std::vector<uint32_t>{' ', 'h', 'i'}));
}

// Hugging Face's ByteLevel puts the space before each piece the steps before
// it gave (byte_level.rs): after a Split, before each of its pieces; alone
// (GPT-2's), before each stretch between added tokens. A piece that starts
// with a space gets none.
TEST_F(TextTest, AddPrefixSpaceGoesBeforeEachPieceOfTheStepsBefore) {
  json j = tiny_tokenizer({}, {});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}})}};
  // "ab", " ", "cd" -> " ab", " ", " cd".
  EXPECT_EQ(ids(*load(j), "ab cd"), (std::vector<uint32_t>{' ', 'a', 'b', ' ', ' ', 'c', 'd'}));
  // With use_regex: each split piece prefixed, then cut by GPT-2's pattern.
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "\\d"}};
  j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
  EXPECT_EQ(ids(*load(j), "ab1cd"), (std::vector<uint32_t>{' ', 'a', 'b', ' ', '1', ' ', 'c', 'd'}));
  // ByteLevel alone: one space before each stretch between added tokens.
  json g = tiny_tokenizer({}, {});
  g["pre_tokenizer"]["add_prefix_space"] = true;
  g["added_tokens"] = json::array({{{"id", 300}, {"content", "<x>"}, {"special", true}}});
  EXPECT_EQ(ids(*load(g), "a b<x>c<x> d"),
            (std::vector<uint32_t>{' ', 'a', ' ', 'b', 300, ' ', 'c', 300, ' ', 'd'}));
}

// Hugging Face splits out the added tokens with normalized = false first,
// on the whole text, then those with normalized = true in what is left
// (AddedVocabulary::extract_and_normalize): "a>" wins over "<a" that
// starts before it.
TEST_F(TextTest, AddedTokensNotNormalizedAreSplitOutFirst) {
  json j = tiny_tokenizer({}, {});
  j["added_tokens"] = json::array(
      {{{"id", 300}, {"content", "<a"}, {"special", false}, {"normalized", true}},
       {{"id", 301}, {"content", "a>"}, {"special", true}, {"normalized", false}}});
  auto t = load(j);
  EXPECT_EQ(ids(*t, "x<a>y"), (std::vector<uint32_t>{'x', '<', 301, 'y'}));
  EXPECT_EQ(ids(*t, "x<ab<a"), (std::vector<uint32_t>{'x', 300, 'b', 300}));
  EXPECT_EQ(ids(*t, "<a<a>"), (std::vector<uint32_t>{300, '<', 301}));
  // Without "normalized", a special token is not normalized and another is
  // (Hugging Face's AddedToken::from).
  j["added_tokens"][0].erase("normalized");
  j["added_tokens"][1].erase("normalized");
  EXPECT_EQ(ids(*load(j), "x<a>y"), (std::vector<uint32_t>{'x', '<', 301, 'y'}));
}

// A Split's String is a literal: every character of it matches itself,
// "\E" (which ends PCRE2's \Q...\E quoting) and "+" included.
TEST_F(TextTest, SplitStringIsALiteral) {
  json j = tiny_tokenizer({"xa", "aa", "a+"}, {"x a", "a a", "a +"});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"String", "a\\Eb"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  // "x", "a\Eb", "y": "x a" is not merged across the split.
  EXPECT_EQ(ids(*load(j), "xa\\Eby"), (std::vector<uint32_t>{'x', 'a', '\\', 'E', 'b', 'y'}));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["String"] = "a+";
  // "aa", "a+" (as a regex, a+ would take "aaa").
  EXPECT_EQ(ids(*load(j), "aaa+"), (std::vector<uint32_t>{257, 258}));
}

// A step after ByteLevel would see its byte-mapped text, which meshlm's
// steps on the raw bytes do not: refused by its path.
TEST_F(TextTest, AStepAfterByteLevelIsRefused) {
  json j = tiny_tokenizer({}, {});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                    {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}}})}};
  expect_error([&] { load(j); }, {"pre_tokenizer.pretokenizers[1]", "after ByteLevel"});
}

// A tokenizer.json's ids may leave gaps: an id below vocab_size() that no
// token has is not a token, and says so.
TEST_F(TextTest, IdsLeftUnassignedAreNotTokens) {
  json j = tiny_tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}}});
  auto t = load(j);
  EXPECT_EQ(t->vocab_size(), 301u);
  const std::string msg = expect_error([&] { t->token_bytes(256); }, {"token id 256", "no token"});
  EXPECT_EQ(msg.find("not in the tokenizer's vocabulary"), std::string::npos) << msg;
  expect_error([&] { t->token_bytes(301); }, {"token id 301", "size 301"});
}

TEST_F(TextTest, BytesThatAreNotUtf8AreBytes) {
  auto t = load(tiny_tokenizer({"ab", "abc"}, {"a b", "ab c"}));
  std::mt19937 rng(7);
  for (int k = 0; k < 300; ++k) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? 'a' + rng() % 3 : rng() % 256);
    const auto v = ids(*t, s);
    EXPECT_EQ(t->decode(v), s) << "case " << k;
  }
  // A lone continuation byte between letters: the letters still merge.
  EXPECT_EQ(ids(*t, "abc\x80" "abc"), (std::vector<uint32_t>{257, 0x80, 257}));
}

TEST_F(TextTest, ValidUtf8Prefix) {
  using meshlm::text::valid_utf8_prefix;
  EXPECT_EQ(valid_utf8_prefix("abc"), 3u);
  EXPECT_EQ(valid_utf8_prefix("a\xC3\xA9z"), 4u);
  EXPECT_EQ(valid_utf8_prefix("a\xC3"), 1u);                  // truncated
  EXPECT_EQ(valid_utf8_prefix("a\xC0\x80"), 1u);              // overlong
  EXPECT_EQ(valid_utf8_prefix("a\xED\xA0\x80"), 1u);          // surrogate
  EXPECT_EQ(valid_utf8_prefix("a\xF4\x90\x80\x80"), 1u);      // above U+10FFFF
  EXPECT_EQ(valid_utf8_prefix("\xF0\x9F\x98\x80!"), 5u);      // emoji
}

TEST_F(TextTest, ByteTokenizer) {
  auto t = load_tokenizer("byte");
  EXPECT_EQ(ids(*t, "A\xFF"), (std::vector<uint32_t>{65, 255}));
  EXPECT_EQ(t->vocab_size(), 256u);
  EXPECT_FALSE(t->eot_id().has_value());
}

TEST_F(TextTest, Gpt2FilePair) {
  json vocab = tiny_tokenizer({"ab"}, {})["model"]["vocab"];
  vocab["<|endoftext|>"] = 257;
  const std::string enc = write("encoder.json", vocab.dump());
  write("vocab.bpe", "#version: 0.2\na b\n");
  auto t = load_tokenizer(enc);  // the merges beside it
  EXPECT_EQ(ids(*t, "abab"), (std::vector<uint32_t>{256, 256}));
  EXPECT_EQ(t->eot_id(), 257u);
  EXPECT_EQ(t->files.size(), 2u);
  // OpenAI's encoder reads "<|endoftext|>" in a text as text.
  EXPECT_EQ(ids(*t, "<|endoftext|>").size(), 13u);  // "<|", "endoftext", "|>" byte by byte
}

TEST_F(TextTest, UnsupportedModelTypesAreRefusedByName) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    json j = tiny_tokenizer({}, {});
    j["model"]["type"] = type;
    expect_error([&] { load(j); }, {"tokenizer.json", std::string("model type '") + type + "'"});
  }
}

TEST_F(TextTest, MalformedFilesAreRefusedNamingTheFile) {
  expect_error([&] { load_tokenizer(write("bad.json", "{\"model\": {\"type\": ")); },
               {"bad.json", "not valid JSON"});
  expect_error([&] { load(tiny_tokenizer({}, {"a zz"})); }, {"tokenizer.json", "merge 1", "'zz'"});
  expect_error([&] { load(tiny_tokenizer({}, {"abc"})); }, {"merge 1", "two tokens"});
  json big = tiny_tokenizer({}, {});
  big["model"]["vocab"]["huge"] = 4294967296ull;
  expect_error([&] { load(big); }, {"'huge'", "4294967296", "32 bits"});
  json nobyte = tiny_tokenizer({}, {});
  nobyte["model"]["vocab"].erase(byte_char('q'));
  expect_error([&] { load(nobyte); }, {"byte 0x71"});
  json norm = tiny_tokenizer({}, {});
  norm["normalizer"] = {{"type", "NFC"}};
  expect_error([&] { load(norm); }, {"normalizer 'NFC'"});
  json meta = tiny_tokenizer({}, {});
  meta["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error([&] { load(meta); }, {"pre-tokenizer 'Metaspace'"});
  json dup = tiny_tokenizer({}, {});
  dup["model"]["vocab"]["zz"] = 5;
  expect_error([&] { load(dup); }, {"the same id 5"});
  expect_error([&] { load_tokenizer(write("garbage.model", "not a model")); },
               {"garbage.model", "SentencePiece"});
  expect_error([&] { load_tokenizer(file("missing.json")); }, {"missing.json", "does not exist"});
  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0600), 0);
  expect_error([&] { load_tokenizer(file("fifo")); }, {"fifo", "FIFO"});
}

// A value of the wrong JSON type is named by the file, its key's path and
// the type meshlm reads there.
TEST_F(TextTest, ValuesOfTheWrongTypeAreNamedByTheirKey) {
  auto edited = [&](const std::function<void(json&)>& edit) {
    json j = tiny_tokenizer({}, {});
    j["added_tokens"] = json::array({{{"id", 300}, {"content", "<x>"}, {"special", true}}});
    edit(j);
    return j;
  };
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[](json& j) { j["normalizer"] = "NFC"; }, {"'normalizer'", "string", "object"}},
      {[](json& j) { j["pre_tokenizer"]["add_prefix_space"] = nullptr; },
       {"'pre_tokenizer.add_prefix_space'", "null", "boolean"}},
      {[](json& j) { j["added_tokens"][0]["lstrip"] = nullptr; },
       {"'added_tokens[0].lstrip'", "null", "boolean"}},
      {[](json& j) { j["added_tokens"][0]["normalized"] = "no"; },
       {"'added_tokens[0].normalized'", "string", "boolean"}},
      {[](json& j) { j["model"]["ignore_merges"] = nullptr; },
       {"'model.ignore_merges'", "null", "boolean"}},
      {[](json& j) { j["model"]["type"] = 5; }, {"'model.type'", "number", "string"}},
      {[](json& j) { j["model"]["dropout"] = "0.1"; }, {"'model.dropout'", "string", "number"}},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({{{"type", "Split"},
                                                                {"pattern", {{"Regex", 7}}}},
                                                               j["pre_tokenizer"]})}};
       },
       {"'pre_tokenizer.pretokenizers[0].pattern.Regex'", "number", "string"}},
      {[](json& j) { j["pre_tokenizer"]["use_regex"] = "yes"; },
       {"'pre_tokenizer.use_regex'", "string", "boolean"}},
      {[](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", json::array({{{"SpecialToken", {{"id", 3}}}}})}};
       },
       {"'post_processor.single[0].SpecialToken.id'", "number", "string"}},
  };
  for (const auto& [edit, parts] : cases) {
    std::vector<std::string> want = parts;
    want.push_back("tokenizer.json");
    const std::string msg = expect_error([&] { load(edited(edit)); }, want);
    EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
  }
}

TEST_F(TextTest, EncoderJsonWithoutMergesNamesTheOption) {
  std::filesystem::create_directory(file("d"));
  std::ofstream(file("d/vocab.json")) << tiny_tokenizer({}, {})["model"]["vocab"].dump();
  expect_error([&] { load_tokenizer(file("d/vocab.json")); }, {"vocab.json", "--merges"});
}

}  // namespace
