// The safetensors reader (header validation, dtype conversions, chunked
// reads) and the base-weight sources: a tiny GPT-2 in Hugging Face layout,
// a meshlm HDF5 round trip, GPT-2 initialisation, and one test per kind of
// malformed file, each checking that the message names the file and tensor.
//
// Every safetensors file here is written by the test itself (write_raw /
// write_safetensors), and every expected float is decoded from its bit
// pattern by f16_ref / bf16_ref below, independently of io/safetensors.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "load/base_source.h"
#include "io/h5.h"
#include "io/safetensors.h"
#include "model/gpt.h"
#include "expect_error.h"
#include "scratch_dir.h"

using namespace meshlm;
using namespace meshlm::io;
using namespace meshlm::load;
using nlohmann::json;

namespace {

using SafetensorsTest = ScratchDirTest;

// ---------------------------------------------------------------------------
// Reference decoders: the value a bit pattern denotes, from the definition
// of each format (sign, biased exponent, mantissa), computed in double.
// ---------------------------------------------------------------------------

float f16_ref(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(m, -24);  // subnormal: m * 2^(1 - 15 - 10)
  else
    v = std::ldexp(1024 + m, e - 25);  // (1 + m/2^10) * 2^(e - 15)
  return static_cast<float>(sign ? -v : v);
}

float bf16_ref(uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0xff)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(m, -133);  // subnormal: m * 2^(1 - 127 - 7)
  else
    v = std::ldexp(128 + m, e - 134);  // (1 + m/2^7) * 2^(e - 127)
  return static_cast<float>(sign ? -v : v);
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bits(v[i]);
  return b;
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// ---------------------------------------------------------------------------
// Writing safetensors files
// ---------------------------------------------------------------------------

// 8-byte length `header_len` (the true length unless a test lies), the
// header text, then `data`.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t header_len) {
  std::string bytes;
  put_le(bytes, header_len, 8);
  bytes += header + data;
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
void write_raw(const std::string& path, const std::string& header, const std::string& data = "") {
  write_raw(path, header, data, header.size());
}

// One tensor as it sits in a file: its bytes, and the float each element
// denotes (for dtypes that are floats).
struct FileTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  std::vector<float> values;  // file layout
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Random contents of the given dtype: any finite F16/BF16 bit pattern
// (subnormals included), normal F32 and F64 values, random I64 bytes.
FileTensor random_tensor(const std::string& name, const std::string& dtype,
                         const std::vector<int64_t>& shape, std::mt19937& rng) {
  FileTensor t{name, dtype, shape, "", {}};
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<uint32_t> u16(0, 0xffff);
  for (int64_t i = 0; i < numel(shape); ++i) {
    if (dtype == "F32") {
      const float f = static_cast<float>(normal(rng));
      put_le(t.bytes, bits(f), 4);
      t.values.push_back(f);
    } else if (dtype == "F64") {
      const double d = normal(rng);
      put_le(t.bytes, std::bit_cast<uint64_t>(d), 8);
      t.values.push_back(static_cast<float>(d));  // round to nearest, as the reader must
    } else if (dtype == "F16" || dtype == "BF16") {
      const bool half = dtype == "F16";
      uint16_t h;
      do h = static_cast<uint16_t>(u16(rng));
      while (half ? ((h >> 10) & 0x1f) == 0x1f : ((h >> 7) & 0xff) == 0xff);  // no inf/NaN
      put_le(t.bytes, h, 2);
      t.values.push_back(half ? f16_ref(h) : bf16_ref(h));
    } else if (dtype == "I64") {
      put_le(t.bytes, (uint64_t(u16(rng)) << 32) | u16(rng), 8);
    } else {
      ADD_FAILURE() << "test helper: dtype " << dtype;
    }
  }
  return t;
}

// The header of `ts` with the data laid out in the given order.
json header_of(const std::vector<FileTensor>& ts) {
  json h = json::object();
  uint64_t offset = 0;
  for (const FileTensor& t : ts) {
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  h["__metadata__"] = {{"format", "pt"}};
  return h;
}

std::string data_of(const std::vector<FileTensor>& ts) {
  std::string d;
  for (const FileTensor& t : ts) d += t.bytes;
  return d;
}

// A valid file; nlohmann::json sorts the header's keys by name, so the
// header order differs from the data order, as in real files.
void write_safetensors(const std::string& path, const std::vector<FileTensor>& ts) {
  write_raw(path, header_of(ts).dump(), data_of(ts));
}

// ---------------------------------------------------------------------------
// A tiny GPT-2 in Hugging Face layout
// ---------------------------------------------------------------------------

GPTConfig tiny_config() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 2;
  c.vocab_size = 50;  // padded to 64
  c.max_seq_len = 8;
  return c;
}

bool is_conv1d(const std::string& name) {
  for (const char* s :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (name.ends_with(s)) return true;
  return false;
}

struct HFModel {
  std::vector<FileTensor> tensors;                     // data-block order
  std::map<std::string, std::vector<float>> expected;  // meshlm name -> meshlm layout
  // The file tensor of meshlm tensor `name` (prefixed or not).
  FileTensor& find(const std::string& name) {
    for (FileTensor& t : tensors)
      if (t.name == name || t.name == "transformer." + name) return t;
    throw std::runtime_error("test helper: no " + name);
  }
  void remove(const std::string& name) {
    std::erase_if(tensors, [&](const FileTensor& t) {
      return t.name == name || t.name == "transformer." + name;
    });
  }
};

// Every tensor of the model with dtypes F32, F16, BF16, F64 in turn, a
// "transformer." prefix on every third name, Conv1D weights stored (in, out),
// wte with vocab_size rows, wpe with `wpe_rows` rows; plus the tensors a Hugging
// Face file also holds (attn.bias, attn.masked_bias, lm_head.weight) and an
// integer one; the data block in shuffled order.
HFModel make_hf_gpt2(const GPTConfig& cfg, int wpe_rows, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  HFModel m;
  const char* dtypes[] = {"F32", "F16", "BF16", "F64"};
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, T = cfg.max_seq_len;
  for (const ParamSpec& p : gpt_param_table(cfg)) {
    const std::vector<int64_t> full(p.full_shape.dims.begin(),
                                    p.full_shape.dims.begin() + p.full_shape.ndim);
    std::vector<int64_t> shape = full;
    if (is_conv1d(p.name)) shape = {full[1], full[0]};
    if (p.name == "wte.weight") shape = {V, C};
    if (p.name == "wpe.weight") shape = {wpe_rows, C};
    const std::string name = (p.index % 3 == 0 ? "transformer." : "") + p.name;
    FileTensor t = random_tensor(name, dtypes[p.index % 4], shape, rng);

    std::vector<float> want(static_cast<size_t>(numel(full)), 0.0f);
    if (is_conv1d(p.name)) {
      const int64_t out = full[0], in = full[1];  // file (in, out)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k) want[o * in + k] = t.values[k * out + o];
    } else if (p.name == "wte.weight") {
      std::copy(t.values.begin(), t.values.end(), want.begin());  // rows V..Vp stay 0
    } else if (p.name == "wpe.weight") {
      const size_t n =
          std::min(t.values.size(), static_cast<size_t>(T * C));  // fewer: an error case
      std::copy(t.values.begin(), t.values.begin() + n, want.begin());
    } else {
      want = t.values;
    }
    m.expected[p.name] = want;
    m.tensors.push_back(std::move(t));
  }
  for (int l = 0; l < cfg.n_layer; ++l)
    m.tensors.push_back(
        random_tensor("h." + std::to_string(l) + ".attn.bias", "F32", {1, 1, T, T}, rng));
  m.tensors.push_back(random_tensor("transformer.h.0.attn.masked_bias", "F32", {}, rng));
  m.tensors.push_back(random_tensor("lm_head.weight", "BF16", {V, C}, rng));
  m.tensors.push_back(random_tensor("position_ids", "I64", {T}, rng));
  std::shuffle(m.tensors.begin(), m.tensors.end(), rng);
  return m;
}

// A header with one tensor 'x' whose entry is `entry`, followed by `data_bytes` bytes.
void write_one(const std::string& path, const json& entry, size_t data_bytes = 64) {
  write_raw(path, json{{"x", entry}}.dump(), std::string(data_bytes, '\0'));
}

}  // namespace

// ---------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------

TEST(Safetensors, F16KnownBitPatterns) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC100), -2.5f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);                  // largest finite
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(bits(f16_to_f32(0x0000)), 0x00000000u);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));  // signalling, payload 1
  EXPECT_TRUE(std::isnan(f16_to_f32(0xFE00)));
}

TEST(Safetensors, BF16KnownBitPatterns) {
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC020), -2.5f);
  EXPECT_EQ(bf16_to_f32(0x477F), 65280.0f);  // 65504 itself is not a bfloat16; its neighbour below
  EXPECT_EQ(bf16_to_f32(0x7F7F), std::ldexp(255.0f, 127 - 7));  // largest finite
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));       // smallest subnormal
  EXPECT_EQ(bf16_to_f32(0x0080), std::ldexp(1.0f, -126));       // smallest normal
  EXPECT_EQ(bits(bf16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(bf16_to_f32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_f32(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7FC0)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7F81)));
}

TEST(Safetensors, EveryBitPatternMatchesTheReference) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float a = f16_to_f32(static_cast<uint16_t>(h)), b = bf16_to_f32(static_cast<uint16_t>(h));
    const float ra = f16_ref(static_cast<uint16_t>(h)), rb = bf16_ref(static_cast<uint16_t>(h));
    if (std::isnan(ra)) {
      ASSERT_TRUE(std::isnan(a)) << std::hex << h;
    } else {
      ASSERT_EQ(bits(a), bits(ra)) << "F16 " << std::hex << h;
    }
    if (std::isnan(rb)) {
      ASSERT_TRUE(std::isnan(b)) << std::hex << h;
    } else {
      ASSERT_EQ(bits(b), bits(rb)) << "BF16 " << std::hex << h;
    }
  }
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

TEST_F(SafetensorsTest, ReadsEveryFloatDtypeAndSpecialValues) {
  std::vector<uint16_t> h16 = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x7C00, 0xFC00, 0x7E00, 0x8000};
  std::vector<uint16_t> hbf = {0x3F80, 0xC020, 0x477F, 0x0001, 0x7F80, 0xFF80, 0x7FC0, 0x8000};
  FileTensor a{"half", "F16", {2, 4}, "", {}}, b{"brain", "BF16", {8}, "", {}};
  for (uint16_t h : h16) put_le(a.bytes, h, 2);
  for (uint16_t h : hbf) put_le(b.bytes, h, 2);
  FileTensor c{"single", "F32", {3}, "", {}}, d{"double", "F64", {3}, "", {}};
  for (float f : {1.5f, -0.0f, 3.0e38f}) put_le(c.bytes, bits(f), 4);
  for (double x : {0.1, -1e-50, 1.0 + 1e-12}) put_le(d.bytes, std::bit_cast<uint64_t>(x), 8);
  write_safetensors(file("m.safetensors"), {a, b, c, d});

  SafetensorsFile f(file("m.safetensors"));
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "half");  // file order = data order, not header order
  EXPECT_EQ(f.tensors()[3].name, "double");
  EXPECT_EQ(f.info("half").shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(f.info("half").begin, 0u);
  EXPECT_EQ(f.info("half").end, 16u);
  EXPECT_EQ(f.info("single").dtype, "F32");
  EXPECT_TRUE(f.has("brain"));
  EXPECT_FALSE(f.has("__metadata__"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.data_start() + 16 + 16 + 12 + 24, f.file_size());

  std::vector<float> out(8);
  f.read_f32("half", out.data());
  for (size_t i = 0; i < h16.size(); ++i) {
    if (std::isnan(f16_ref(h16[i])))
      EXPECT_TRUE(std::isnan(out[i]));
    else
      EXPECT_EQ(bits(out[i]), bits(f16_ref(h16[i]))) << i;
  }
  EXPECT_EQ(out[2], 65504.0f);
  f.read_f32("brain", out.data());
  for (size_t i = 0; i < hbf.size(); ++i) {
    if (std::isnan(bf16_ref(hbf[i])))
      EXPECT_TRUE(std::isnan(out[i]));
    else
      EXPECT_EQ(bits(out[i]), bits(bf16_ref(hbf[i]))) << i;
  }
  f.read_f32("single", out.data());
  EXPECT_EQ(bits(out[1]), bits(-0.0f));
  EXPECT_EQ(out[2], 3.0e38f);
  f.read_f32("double", out.data());
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_EQ(bits(out[1]), bits(-0.0f));  // below the smallest float: rounds to -0
  EXPECT_EQ(out[2], 1.0f);
  // A range of a tensor.
  f.read_f32("half", out.data(), 2, 3);
  EXPECT_EQ(out[0], 65504.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -24));
  expect_error([&] { f.read_f32("half", out.data(), 6, 3); },
               {file("m.safetensors"), "tensor 'half'", "out of range"});
  expect_error([&] { f.info("nope"); }, {file("m.safetensors"), "no tensor 'nope'"});
}

TEST_F(SafetensorsTest, ReadsTensorsLargerThanOneChunk) {
  // 3.5 chunks of F16 plus one element: several preads, a short last one.
  std::mt19937 rng(3);
  const int64_t n = static_cast<int64_t>(kSafetensorsChunkBytes / 2 * 7 / 2 + 1);
  FileTensor small = random_tensor("small", "F32", {5}, rng);
  FileTensor big = random_tensor("big", "F16", {n}, rng);
  write_safetensors(file("big.safetensors"), {small, big});
  SafetensorsFile f(file("big.safetensors"));
  std::vector<float> out(static_cast<size_t>(n));
  f.read_f32("big", out.data());
  EXPECT_EQ(bits(out), bits(big.values));
  f.read_f32("big", out.data(), static_cast<uint64_t>(n) - 600000, 600000);
  EXPECT_EQ(bits(std::vector<float>(out.begin(), out.begin() + 600000)),
            bits(std::vector<float>(big.values.end() - 600000, big.values.end())));
}

TEST_F(SafetensorsTest, EmptyAndScalarTensors) {
  FileTensor e{"empty", "F32", {0, 4}, "", {}}, s{"scalar", "F16", {}, "", {}};
  put_le(s.bytes, 0xC100, 2);
  write_safetensors(file("s.safetensors"), {e, s});
  SafetensorsFile f(file("s.safetensors"));
  EXPECT_EQ(f.info("empty").numel(), 0u);
  EXPECT_EQ(f.info("scalar").numel(), 1u);
  float x = 0;
  f.read_f32("empty", &x);
  f.read_f32("scalar", &x);
  EXPECT_EQ(x, -2.5f);
}

TEST_F(SafetensorsTest, IntegerTensorsOpenButAreNotReadAsFloat) {
  std::mt19937 rng(1);
  write_safetensors(file("i.safetensors"), {random_tensor("ids", "I64", {4}, rng)});
  SafetensorsFile f(file("i.safetensors"));
  std::vector<float> out(4);
  expect_error([&] { f.read_f32("ids", out.data()); },
               {file("i.safetensors"), "tensor 'ids' has dtype 'I64'", "cannot read as float"});
}

// ---------------------------------------------------------------------------
// Malformed files: one test per kind, each message names the file (and the tensor)
// ---------------------------------------------------------------------------

TEST_F(SafetensorsTest, ErrorMissingFile) {
  expect_error([&] { SafetensorsFile f(file("none.safetensors")); },
               {"safetensors file '" + file("none.safetensors") + "'", "cannot open"});
}

TEST_F(SafetensorsTest, ErrorShorterThanEightBytes) {
  std::ofstream(file("s.safetensors"), std::ios::binary) << "abcde";
  expect_error([&] { SafetensorsFile f(file("s.safetensors")); },
               {"safetensors file '" + file("s.safetensors") + "'", "file has 5 bytes", "8-byte"});
}

TEST_F(SafetensorsTest, ErrorTruncatedHeader) {
  const std::string header =
      json{{"x", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}.dump();
  write_raw(file("t.safetensors"), header.substr(0, 20), "", header.size());
  expect_error([&] { SafetensorsFile f(file("t.safetensors")); },
               {file("t.safetensors"), "truncated header",
                "says " + std::to_string(header.size()) + " bytes but only 20 follow"});
}

TEST_F(SafetensorsTest, ErrorAbsurdHeaderLength) {
  write_raw(file("a.safetensors"), "{}", "", kSafetensorsMaxHeaderBytes + 1);
  expect_error([&] { SafetensorsFile f(file("a.safetensors")); },
               {file("a.safetensors"), "header length 104857601 bytes is absurd"});
  // An HDF5 or text file read as safetensors: its first 8 bytes make a huge length.
  std::ofstream(file("b.safetensors"), std::ios::binary) << "\x89HDF\r\n\x1a\n and more";
  expect_error([&] { SafetensorsFile f(file("b.safetensors")); },
               {file("b.safetensors"), "absurd"});
}

TEST_F(SafetensorsTest, ErrorHeaderNotJson) {
  write_raw(file("j.safetensors"), "{\"x\": {\"dtype\": \"F32\",");
  expect_error([&] { SafetensorsFile f(file("j.safetensors")); },
               {file("j.safetensors"), "header is not valid JSON"});
  write_raw(file("u.safetensors"), "{\"\xff\": 1}");  // not UTF-8
  expect_error([&] { SafetensorsFile f(file("u.safetensors")); },
               {file("u.safetensors"), "header is not valid JSON"});
}

TEST_F(SafetensorsTest, ErrorHeaderNotAnObject) {
  write_raw(file("o.safetensors"), "[1, 2, 3]");
  expect_error([&] { SafetensorsFile f(file("o.safetensors")); },
               {file("o.safetensors"), "header is not a JSON object (it is array)"});
}

TEST_F(SafetensorsTest, ErrorEntryMissingKey) {
  const std::string p = file("k.safetensors");
  write_one(p, {{"dtype", "F32"}, {"shape", {1}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x' has no \"data_offsets\""});
  write_one(p, {{"shape", {1}}, {"data_offsets", {0, 4}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x' has no \"dtype\""});
  write_one(p, {{"dtype", "F32"}, {"data_offsets", {0, 4}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x' has no \"shape\""});
}

TEST_F(SafetensorsTest, ErrorEntryWrongJsonTypes) {
  const std::string p = file("w.safetensors");
  write_one(p, 42);
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x': entry is not a JSON object"});
  write_one(p, {{"dtype", 32}, {"shape", {1}}, {"data_offsets", {0, 4}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x': \"dtype\" must be a string"});
  write_one(p, {{"dtype", "F32"}, {"shape", "1"}, {"data_offsets", {0, 4}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x': \"shape\" must be an array"});
  write_one(p, {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"data_offsets\" must be [begin, end]"});
  write_one(p, {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, "4"}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"data_offsets\" must be [begin, end]"});
  write_one(p, {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"data_offsets\" must be [begin, end]"});
  write_raw(p, "{\"__metadata__\": [1]}");
  expect_error([&] { SafetensorsFile f(p); }, {p, "\"__metadata__\" is not a JSON object"});
}

TEST_F(SafetensorsTest, ErrorUnknownDtype) {
  const std::string p = file("d.safetensors");
  write_one(p, {{"dtype", "Q7"}, {"shape", {1}}, {"data_offsets", {0, 1}}});
  expect_error(
      [&] { SafetensorsFile f(p); },
      {"safetensors file '" + p + "': tensor 'x' has dtype 'Q7' which meshlm cannot read"});
}

TEST_F(SafetensorsTest, ErrorNegativeShape) {
  const std::string p = file("n.safetensors");
  write_one(p, {{"dtype", "F32"}, {"shape", {2, -1}}, {"data_offsets", {0, 8}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"shape\" must be an array of non-negative integers (got [2,-1])"});
}

TEST_F(SafetensorsTest, ErrorNonIntegerShape) {
  const std::string p = file("f.safetensors");
  write_one(p, {{"dtype", "F32"}, {"shape", {2.5}}, {"data_offsets", {0, 8}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"shape\" must be an array of non-negative integers"});
  write_one(p, {{"dtype", "F32"}, {"shape", {2.0}}, {"data_offsets", {0, 8}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"shape\" must be an array of non-negative integers"});
  write_one(p, {{"dtype", "F32"}, {"shape", {true}}, {"data_offsets", {0, 4}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"shape\" must be an array of non-negative integers"});
  // Larger than int64.
  write_raw(p,
            R"({"x": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
            std::string(4, '\0'));
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': \"shape\" must be an array of non-negative integers"});
}

TEST_F(SafetensorsTest, ErrorShapeProductOverflows) {
  const std::string p = file("o.safetensors");
  // 2^31 * 2^31 elements fit in uint64, times 4 bytes do not.
  write_one(p, {{"dtype", "F32"}, {"shape", {1ll << 31, 1ll << 31}}, {"data_offsets", {0, 4}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x': shape", "larger than 2^64 bytes"});
  // A product that wraps to exactly the right byte count must not pass: 2^62 * 4 = 2^64 = 0 mod
  // 2^64.
  write_one(p, {{"dtype", "F32"}, {"shape", {1ll << 62}}, {"data_offsets", {0, 0}}});
  expect_error([&] { SafetensorsFile f(p); }, {p, "tensor 'x': shape", "larger than 2^64 bytes"});
}

TEST_F(SafetensorsTest, ErrorOffsetsBeginAfterEnd) {
  const std::string p = file("b.safetensors");
  write_one(p, {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 4}}});
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': data_offsets [8, 4) end before they begin"});
}

TEST_F(SafetensorsTest, ErrorOffsetsPastTheEnd) {
  const std::string p = file("e.safetensors");
  write_raw(p,
            json{{"h.0.mlp.c_fc.weight",
                  {{"dtype", "F32"}, {"shape", {8, 8}}, {"data_offsets", {0, 256}}}}}
                .dump(),
            std::string(100, '\0'));
  expect_error([&] { SafetensorsFile f(p); },
               {"safetensors file '" + p +
                "': tensor 'h.0.mlp.c_fc.weight': data_offsets [0, 256) run past the end of the "
                "file (data block is 100 bytes)"});
  // Offsets near 2^64 do not wrap around.
  write_raw(
      p,
      R"({"x": {"dtype": "U8", "shape": [4], "data_offsets": [18446744073709551612, 18446744073709551615]}})",
      std::string(4, '\0'));
  expect_error([&] { SafetensorsFile f(p); },
               {p, "tensor 'x': data_offsets", "run past the end of the file"});
}

TEST_F(SafetensorsTest, ErrorByteSizeDoesNotMatchShape) {
  const std::string p = file("z.safetensors");
  write_one(p, {{"dtype", "F16"}, {"shape", {3, 2}}, {"data_offsets", {0, 8}}});
  expect_error(
      [&] { SafetensorsFile f(p); },
      {p, "tensor 'x': data_offsets [0, 8) hold 8 bytes but shape [3, 2] of dtype F16 needs 12"});
}

TEST_F(SafetensorsTest, ErrorFileTruncatedInTheDataBlock) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, cfg.max_seq_len);
  const std::string p = file("cut.safetensors");
  write_safetensors(p, m.tensors);
  const uintmax_t full = std::filesystem::file_size(p);
  std::filesystem::resize_file(p, full - data_of(m.tensors).size() / 2);
  expect_error(
      [&] { open_base_source(p, cfg, 0); },
      {"safetensors file '" + p + "': tensor '", "run past the end of the file (data block is"});
  // Cut after the file was opened, in the middle of a tensor: its read names it.
  write_safetensors(p, m.tensors);
  SafetensorsFile f(p);
  const SafetensorsTensor& t = f.info(m.find("h.1.mlp.c_fc.weight").name);
  std::filesystem::resize_file(p, f.data_start() + (t.begin + t.end) / 2);
  std::vector<float> out(t.numel());
  expect_error([&] { f.read_f32(t.name, out.data()); },
               {p, "tensor '" + t.name + "'", "unexpected end of file"});
}

// ---------------------------------------------------------------------------
// Base sources
// ---------------------------------------------------------------------------

TEST_F(SafetensorsTest, HuggingFaceGpt2ReadsEveryTensorExactly) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, /*wpe_rows=*/12);  // more positions than max_seq_len: first 8 used
  const std::string p = file("gpt2.safetensors");
  write_safetensors(p, m.tensors);

  std::unique_ptr<BaseSource> src = open_base_source(p, cfg, 0);
  EXPECT_EQ(src->describe(), "safetensors file '" + p + "'");
  EXPECT_EQ(src->files(), std::vector<std::string>{p});
  for (const ParamSpec& spec : gpt_param_table(cfg)) {
    std::vector<float> got(static_cast<size_t>(spec.full_shape.numel()), -1.0f);
    src->read(spec, got.data());
    EXPECT_EQ(bits(got), bits(m.expected.at(spec.name))) << spec.name;
  }
  // A spec from a sharded table (tensor parallelism, second stage) reads the same logical tensor.
  ModelShard shard;
  shard.tp_size = 2;
  shard.tp_rank = 1;
  shard.layer_begin = 1;
  shard.first_stage = false;
  for (const ParamSpec& spec : gpt_param_table(cfg, shard)) {
    std::vector<float> got(static_cast<size_t>(spec.full_shape.numel()));
    src->read(spec, got.data());
    EXPECT_EQ(bits(got), bits(m.expected.at(spec.name))) << spec.name;
  }
  // A tensor of another model.
  ParamSpec foreign = gpt_param_table(cfg)[0];
  foreign.name = "h.7.ln_1.weight";
  std::vector<float> buf(foreign.full_shape.numel());
  expect_error([&] { src->read(foreign, buf.data()); },
               {p, "tensor 'h.7.ln_1.weight' is not part of"});
}

TEST_F(SafetensorsTest, BaseErrorMissingTensor) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, cfg.max_seq_len);
  m.remove("h.1.ln_2.bias");
  const std::string p = file("miss.safetensors");
  write_safetensors(p, m.tensors);
  expect_error([&] { open_base_source(p, cfg, 0); },
               {"safetensors file '" + p +
                "': no tensor 'h.1.ln_2.bias' (nor 'transformer.h.1.ln_2.bias')"});
}

TEST_F(SafetensorsTest, BaseErrorWteWrongRows) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, cfg.max_seq_len);
  std::mt19937 rng(5);
  FileTensor& wte = m.find("wte.weight");
  wte = random_tensor(wte.name, "F32", {49, cfg.n_embd}, rng);
  const std::string p = file("wte.safetensors");
  write_safetensors(p, m.tensors);
  expect_error([&] { open_base_source(p, cfg, 0); },
               {p, "tensor '" + wte.name + "' has shape [49, 16]; meshlm expects [50, 16]"});
  // The padded size is not accepted either: Hugging Face files hold vocab_size rows.
  wte = random_tensor(wte.name, "F32", {cfg.padded_vocab_size(), cfg.n_embd}, rng);
  write_safetensors(p, m.tensors);
  expect_error([&] { open_base_source(p, cfg, 0); },
               {p, "tensor '" + wte.name + "' has shape [64, 16]; meshlm expects [50, 16]"});
}

TEST_F(SafetensorsTest, BaseErrorWpeTooFewRows) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, cfg.max_seq_len - 1);
  const std::string p = file("wpe.safetensors");
  write_safetensors(p, m.tensors);
  expect_error([&] { open_base_source(p, cfg, 0); },
               {p, "wpe.weight' has shape [7, 16]; meshlm expects [8, 16]"});
}

TEST_F(SafetensorsTest, BaseErrorConv1DWithSwappedDims) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, cfg.max_seq_len);
  std::mt19937 rng(5);
  FileTensor& fc = m.find("h.0.mlp.c_fc.weight");
  fc = random_tensor(fc.name, "F32", {4 * cfg.n_embd, cfg.n_embd}, rng);  // meshlm's (out, in)
  const std::string p = file("fc.safetensors");
  write_safetensors(p, m.tensors);
  expect_error(
      [&] { open_base_source(p, cfg, 0); },
      {p, "tensor '" + fc.name + "' has shape [64, 16]; meshlm expects [16, 64]", "(in, out)"});
}

TEST_F(SafetensorsTest, BaseErrorNeededTensorNotFloat) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, cfg.max_seq_len);
  std::mt19937 rng(5);
  FileTensor& b = m.find("ln_f.bias");
  b = random_tensor(b.name, "I64", {cfg.n_embd}, rng);
  const std::string p = file("int.safetensors");
  write_safetensors(p, m.tensors);
  expect_error([&] { open_base_source(p, cfg, 0); },
               {p, "tensor '" + b.name + "' has dtype 'I64' which meshlm cannot read as float"});
}

TEST_F(SafetensorsTest, BaseErrorUnknownExtension) {
  const GPTConfig cfg = tiny_config();
  expect_error([&] { open_base_source(file("gpt2.bin"), cfg, 0); },
               {"base weights '" + file("gpt2.bin") + "'", "*.safetensors", "*.h5", "init"});
}

TEST_F(SafetensorsTest, MeshlmHdf5RoundTrip) {
  const GPTConfig cfg = tiny_config();
  const std::vector<ParamSpec> table = gpt_param_table(cfg);
  std::vector<float> params(table_numel(table));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : params) x = normal(rng);
  write_params_h5(file("base.h5"), cfg, params);
  EXPECT_EQ(listing(), std::vector<std::string>{"base.h5"});  // no temporary left behind

  {
    h5::File f = h5::open_file(file("base.h5"));
    EXPECT_EQ(h5::read_scalar_attr<int32_t>(f, "format_version"), kParamsFormatVersion);
    EXPECT_EQ(h5::read_scalar_attr<int32_t>(f, "n_layer"), cfg.n_layer);
    EXPECT_EQ(h5::read_scalar_attr<int32_t>(f, "vocab_size"), cfg.vocab_size);
    std::vector<hsize_t> dims;
    h5::read_dataset<float>(f, "params/wte.weight", &dims);
    EXPECT_EQ(dims, (std::vector<hsize_t>{64, 16}));
  }

  for (const std::string name : {"base.h5", "copy.HDF5"}) {
    if (name != "base.h5") std::filesystem::copy_file(file("base.h5"), file(name));
    std::unique_ptr<BaseSource> src = open_base_source(file(name), cfg, 0);
    EXPECT_EQ(src->describe(), "meshlm HDF5 file '" + file(name) + "'");
    EXPECT_EQ(src->files(), std::vector<std::string>{file(name)});
    for (const ParamSpec& spec : table) {
      std::vector<float> got(spec.numel());
      src->read(spec, got.data());
      EXPECT_EQ(bits(got), bits(std::vector<float>(params.begin() + spec.offset,
                                                   params.begin() + spec.offset + spec.numel())))
          << spec.name;
    }
  }

  expect_error([&] { write_params_h5(file("short.h5"), cfg, std::vector<float>(10)); },
               {file("short.h5"), "10 parameters given"});
}

TEST_F(SafetensorsTest, MeshlmHdf5Errors) {
  const GPTConfig cfg = tiny_config();
  write_params_h5(file("base.h5"), cfg,
                  std::vector<float>(table_numel(gpt_param_table(cfg)), 0.5f));
  // Another width: the first tensor's shape differs.
  GPTConfig wide = cfg;
  wide.n_embd = 32;
  expect_error([&] { open_base_source(file("base.h5"), wide, 0); },
               {"meshlm HDF5 file '" + file("base.h5") + "'",
                "dataset '/params/wte.weight' has shape [64, 16]; meshlm expects [64, 32]"});
  // More layers: a missing dataset.
  GPTConfig deep = cfg;
  deep.n_layer = 3;
  expect_error([&] { open_base_source(file("base.h5"), deep, 0); },
               {file("base.h5"), "no dataset '/params/h.2.ln_1.weight'"});
  // Another vocabulary with the same padded size: only the attribute tells.
  GPTConfig vocab = cfg;
  vocab.vocab_size = 60;
  expect_error([&] { open_base_source(file("base.h5"), vocab, 0); },
               {file("base.h5"), "written for vocab_size 50, the model has 60"});
  expect_error([&] { open_base_source(file("none.h5"), cfg, 0); },
               {"meshlm HDF5 file '" + file("none.h5") + "': no such file"});
  expect_error([&] { open_base_source(file("none.safetensors"), cfg, 0); },
               {"safetensors file '" + file("none.safetensors") + "': cannot open"});
}

TEST_F(SafetensorsTest, InitSourceEqualsInitWeights) {
  const GPTConfig cfg = tiny_config();
  GPT model(cfg);
  model.init_weights(1337);
  for (const std::string spec : {"init", ""}) {
    std::unique_ptr<BaseSource> src = open_base_source(spec, cfg, 1337);
    EXPECT_EQ(src->describe(), "GPT-2 initialisation, seed 1337");
    EXPECT_TRUE(src->files().empty());
    for (const ParamSpec& p : model.table()) {
      std::vector<float> got(p.numel());
      src->read(p, got.data());
      std::span<float> want = model.param(p.name);
      EXPECT_EQ(bits(got), bits(std::vector<float>(want.begin(), want.end()))) << p.name;
    }
  }
}

// What a caller that holds one block of rows at a time gets (quantizing the
// base, a tensor-parallel rank's part): the same rows as the whole tensor,
// from every kind of source, the padded vocabulary rows included.
TEST_F(SafetensorsTest, RowsOfEveryKindOfSourceAreThoseOfTheWholeTensor) {
  const GPTConfig cfg = tiny_config();
  const std::vector<ParamSpec> table = gpt_param_table(cfg);
  HFModel m = make_hf_gpt2(cfg, /*wpe_rows=*/12);
  write_safetensors(file("gpt2.safetensors"), m.tensors);
  std::vector<float> flat;
  for (const ParamSpec& p : table) {
    const std::vector<float>& v = m.expected.at(p.name);
    flat.insert(flat.end(), v.begin(), v.end());
  }
  write_params_h5(file("base.h5"), cfg, flat);
  for (const std::string spec_string : {file("gpt2.safetensors"), file("base.h5"), std::string("init")}) {
    SCOPED_TRACE(spec_string);
    std::unique_ptr<BaseSource> src = open_base_source(spec_string, cfg, 5);
    for (const ParamSpec& p : table) {
      const int64_t rows = p.full_shape[0];
      const size_t rf = row_floats(p);
      std::vector<float> whole(static_cast<size_t>(p.full_shape.numel()));
      src->read(p, whole.data());
      for (auto [r0, nr] : std::vector<std::pair<int64_t, int64_t>>{
               {0, rows}, {0, 1}, {rows - 1, 1}, {rows / 3, rows / 2}, {rows / 2, rows - rows / 2},
               {cfg.vocab_size - 2, 6}, {3, 0}}) {
        if (r0 + nr > rows) continue;
        std::vector<float> got(static_cast<size_t>(nr) * rf + 1, -5.0f);
        src->read_rows(p, r0, nr, got.data());
        ASSERT_EQ(bits(std::vector<float>(got.begin(), got.end() - 1)),
                  bits(std::vector<float>(whole.begin() + r0 * static_cast<int64_t>(rf),
                                          whole.begin() + (r0 + nr) * static_cast<int64_t>(rf))))
            << p.name << " rows [" << r0 << ", " << r0 + nr << ")";
        ASSERT_EQ(got.back(), -5.0f) << p.name << ": wrote past the rows";
      }
      std::vector<float> buf(2 * rf);
      expect_error([&] { src->read_rows(p, rows - 1, 2, buf.data()); },
                   {"tensor '" + p.name + "': rows [" + std::to_string(rows - 1) + ", " +
                    std::to_string(rows + 1) + ") asked for; it has " + std::to_string(rows)});
    }
  }
}

// A value that is not finite is found in whichever block holds it, and named
// by its place in the whole tensor.
TEST_F(SafetensorsTest, NonFiniteValueInABlockOfRowsIsNamedByItsRow) {
  const GPTConfig cfg = tiny_config();
  HFModel m = make_hf_gpt2(cfg, /*wpe_rows=*/8);
  // c_fc is stored (in, out) = (16, 64): file element [3][41] is meshlm's row 41, column 3.
  std::mt19937 rng(9);
  FileTensor& t = m.find("h.1.mlp.c_fc.weight");
  t = random_tensor(t.name, "F32", {cfg.n_embd, 4 * cfg.n_embd}, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const size_t at = 3 * 64 + 41;
  std::memcpy(t.bytes.data() + 4 * at, &nan, 4);
  write_safetensors(file("nan.safetensors"), m.tensors);
  std::unique_ptr<BaseSource> src = open_base_source(file("nan.safetensors"), cfg, 0);
  const ParamSpec* p = nullptr;
  const std::vector<ParamSpec> table = gpt_param_table(cfg);
  for (const ParamSpec& q : table)
    if (q.name == "h.1.mlp.c_fc.weight") p = &q;
  ASSERT_NE(p, nullptr);
  std::vector<float> buf(64 * 16);
  EXPECT_NO_THROW(src->read_rows(*p, 0, 40, buf.data()));
  EXPECT_NO_THROW(src->read_rows(*p, 42, 22, buf.data()));
  expect_error([&] { src->read_rows(*p, 40, 8, buf.data()); },
               {"tensor 'h.1.mlp.c_fc.weight' holds NaN at index " + std::to_string(41 * 16 + 3) +
                " (row 41, column 3)"});
}

// Large Conv1D weights, read whole, are transposed column by column of the
// file: C = 520 makes c_fc (2080, 520) and c_proj (520, 2080).
TEST_F(SafetensorsTest, LargeConv1DWeightsTransposeInSteps) {
  GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.n_embd = 520;  // 2080 rows of c_fc: 262144 / 2080 = 126 file rows per step, 520 = 4 * 126 + 16
  cfg.n_head = 4;
  cfg.vocab_size = 64;
  cfg.max_seq_len = 8;
  HFModel m = make_hf_gpt2(cfg, /*wpe_rows=*/8);
  const std::string p = file("wide.safetensors");
  write_safetensors(p, m.tensors);
  std::unique_ptr<BaseSource> src = open_base_source(p, cfg, 0);
  for (const ParamSpec& spec : gpt_param_table(cfg)) {
    if (!is_conv1d(spec.name)) continue;
    std::vector<float> got(static_cast<size_t>(spec.full_shape.numel()), -1.0f);
    src->read(spec, got.data());
    EXPECT_EQ(bits(got), bits(m.expected.at(spec.name))) << spec.name;
  }
}
