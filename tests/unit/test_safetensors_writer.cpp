// The safetensors writer (io/safetensors_writer.h): the 16-bit roundings
// against a brute-force nearest-value search, a file written a block at a
// time and read back by the reader, and the refusals (an incomplete tensor,
// bytes past the end, a foreign file at the path), each leaving no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "expect_error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "scratch_dir.h"

using namespace meshlm;
using namespace meshlm::io;

namespace {

using SafetensorsWriterTest = ScratchDirTest;

// Round to nearest, ties to even, by search: the two representable values
// around |x| (`values`: every finite non-negative value of the format in
// increasing order, its index its bit pattern) compared in double.
uint16_t nearest_even(float x, const std::vector<double>& values, uint16_t inf_bits) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const auto hi = std::lower_bound(values.begin(), values.end(), a);
  if (hi == values.end()) {
    // Past the largest finite: infinity once at least half a step past it.
    const double top = values.back(), step = top - values[values.size() - 2];
    return static_cast<uint16_t>(sign | (a >= top + step / 2 ? inf_bits : values.size() - 1));
  }
  const size_t h = static_cast<size_t>(hi - values.begin());
  if (*hi == a || h == 0) return static_cast<uint16_t>(sign | h);
  const double dl = a - values[h - 1], dh = *hi - a;
  const size_t pick = dl < dh ? h - 1 : dh < dl ? h : ((h - 1) % 2 == 0 ? h - 1 : h);
  return static_cast<uint16_t>(sign | pick);
}

std::vector<double> finite_values(float (*decode)(uint16_t), uint16_t inf_bits) {
  std::vector<double> v;
  for (uint32_t b = 0; b < inf_bits; ++b) v.push_back(decode(static_cast<uint16_t>(b)));
  return v;
}

// Floats that exercise the rounding: random bit patterns (every exponent),
// values on and halfway between neighbours of the format, its extremes.
std::vector<float> test_floats(float (*decode)(uint16_t), uint16_t inf_bits) {
  std::vector<float> xs;
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isfinite(x)) xs.push_back(x);
  }
  for (uint32_t b = 0; b + 1 < inf_bits; b += 7) {
    const double lo = decode(static_cast<uint16_t>(b)), hi = decode(static_cast<uint16_t>(b + 1));
    for (double x : {lo, (lo + hi) / 2, std::nextafter((lo + hi) / 2, 0.0),
                     std::nextafter((lo + hi) / 2, 1e300)}) {
      xs.push_back(static_cast<float>(x));
      xs.push_back(-static_cast<float>(x));
    }
  }
  for (float x : {0.0f, -0.0f, 65504.0f, 65519.0f, 65519.996f, 65520.0f, 1e-8f, 2.98e-8f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()})
    xs.push_back(x);
  return xs;
}

TEST(SafetensorsRounding, Bf16IsRoundToNearestEven) {
  const std::vector<double> values = finite_values(bf16_to_f32, 0x7f80);
  for (float x : test_floats(bf16_to_f32, 0x7f80)) {
    // bfloat16 holds float32's whole range: nothing finite rounds past it
    // except within half a step of FLT_MAX.
    const uint16_t want = nearest_even(x, values, 0x7f80);
    ASSERT_EQ(f32_to_bf16(x), want) << x;
  }
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(SafetensorsRounding, F16IsRoundToNearestEvenWithSubnormals) {
  const std::vector<double> values = finite_values(f16_to_f32, 0x7c00);
  for (float x : test_floats(f16_to_f32, 0x7c00)) {
    const uint16_t want = nearest_even(x, values, 0x7c00);
    ASSERT_EQ(f32_to_f16(x), want) << x;
  }
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // a tie: to zero (even)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_F(SafetensorsWriterTest, WritesWhatTheReaderReads) {
  const std::string path = file("out.safetensors");
  std::vector<float> a(3 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 1.0f;
  const std::vector<float> b = {1.5f, -2.0f, 3.0f};
  {
    SafetensorsWriter w(path, {{"a", "F32", {3, 5}}, {"b.bias", "BF16", {3}}},
                        {{"format", "pt"}, {"meshlm.step", "12"}});
    // a in two blocks of rows, b converted.
    w.write(a.data(), 2 * 5 * sizeof(float));
    w.write(a.data() + 10, 5 * sizeof(float));
    for (float x : b) {
      const uint16_t h = f32_to_bf16(x);
      const unsigned char le[2] = {static_cast<unsigned char>(h), static_cast<unsigned char>(h >> 8)};
      w.write(le, 2);
    }
    w.commit();
  }
  SafetensorsFile f(path);
  EXPECT_EQ(f.data_start() % 8, 0u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("meshlm.step"), "12");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // file order is the order given
  EXPECT_EQ(f.info("a").shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(f.info("b.bias").dtype, "BF16");
  EXPECT_EQ(f.file_size(), f.data_start() + a.size() * 4 + b.size() * 2);
  std::vector<float> ra(a.size()), rb(b.size());
  f.read_f32("a", ra.data());
  f.read_f32("b.bias", rb.data());
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(listing(), std::vector<std::string>{"out.safetensors"});

  // A safetensors file is replaced.
  {
    SafetensorsWriter w(path, {{"x", "F32", {1}}}, {});
    const float x = 7;
    w.write(&x, 4);
    w.commit();
  }
  EXPECT_TRUE(SafetensorsFile(path).has("x"));
}

TEST_F(SafetensorsWriterTest, IncompleteOrOverlongWritesLeaveNothing) {
  const std::string path = file("out.safetensors");
  {
    SafetensorsWriter w(path, {{"a", "F32", {4}}, {"b", "F32", {2}}}, {});
    const float x[4] = {1, 2, 3, 4};
    w.write(x, sizeof x);
    expect_error([&] { w.commit(); }, {"'b' incomplete"});
    expect_error([&] { w.write(x, sizeof x); }, {"data block of 24"});
  }
  EXPECT_TRUE(listing().empty());  // the temporary file went with the writer
}

TEST_F(SafetensorsWriterTest, RefusesToReplaceAForeignFile) {
  const std::string path = file("notes.txt");
  std::ofstream(path) << "not a safetensors file\n";
  expect_error([&] { SafetensorsWriter(path, {{"a", "F32", {1}}}, {}); }, {"not a safetensors file"});
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "not a safetensors file");
  EXPECT_EQ(listing(), std::vector<std::string>{"notes.txt"});
  expect_error([&] { SafetensorsWriter(dir_.string(), {{"a", "F32", {1}}}, {}); }, {"a directory"});
  EXPECT_FALSE(is_safetensors_file(path));
}

}  // namespace
