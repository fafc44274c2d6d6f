// Token files (HDF5 and raw), the batch loader's order (sequential,
// shuffled, DP split, resume) and the error messages for bad inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/h5.h"
#include "io/tokens.h"
#include "expect_error.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using namespace meshlm;
using namespace meshlm::io;

namespace {

using TokensTest = ScratchDirTest;

std::vector<uint32_t> iota_ids(size_t n, uint32_t first = 0) {
  std::vector<uint32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = first + static_cast<uint32_t>(i);
  return ids;
}

std::vector<int32_t> read_all(const TokenReader& r) {
  std::vector<int32_t> out(r.size());
  r.read(0, r.size(), out.data());
  return out;
}

// First token of each window of one step (B windows), as the loader hands it out.
std::vector<int32_t> step_starts(BatchLoader& loader, int B, int T) {
  std::vector<int32_t> in(B * T), tg(B * T);
  loader.next(in.data(), tg.data());
  std::vector<int32_t> starts(B);
  for (int b = 0; b < B; ++b) starts[b] = in[b * T];
  return starts;
}

}  // namespace

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

TEST_F(TokensTest, Hdf5RoundTripUint16) {
  std::vector<uint32_t> ids = {0, 1, 65535, 42, 7, 65534, 3};
  write_tokens_h5(file("t.h5"), ids, 65536);
  TokenReader r = TokenReader::open(file("t.h5"));
  EXPECT_TRUE(r.is_hdf5());
  EXPECT_EQ(r.bytes_per_token(), 2);
  EXPECT_EQ(r.vocab_size_attr(), 65536);
  EXPECT_EQ(r.size(), ids.size());
  EXPECT_EQ(r.path(), file("t.h5"));
  std::vector<int32_t> got = read_all(r);
  EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.end()), ids);
  // A slice in the middle.
  int32_t mid[3];
  r.read(2, 3, mid);
  EXPECT_EQ(mid[0], 65535);
  EXPECT_EQ(mid[1], 42);
  EXPECT_EQ(mid[2], 7);
  EXPECT_EQ(listing(), std::vector<std::string>{"t.h5"});
}

// uint16 ids are read as uint32 through HDF5's type conversion, which goes
// in strips of its buffer (64 KiB, io/h5.cpp): reads of many strips, and
// slices that start and end inside one, get every id.
TEST_F(TokensTest, Hdf5Uint16ReadsAcrossConversionStrips) {
  std::vector<uint32_t> ids(100000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7919) % 65536);
  write_tokens_h5(file("t.h5"), ids, 65536);
  TokenReader r = TokenReader::open(file("t.h5"));
  ASSERT_EQ(r.bytes_per_token(), 2);
  std::vector<int32_t> got = read_all(r);
  EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.end()), ids);
  for (const auto& [start, count] : {std::pair<uint64_t, uint64_t>{16383, 2}, {12345, 54321},
                                     {99999, 1}, {1, 99998}}) {
    std::vector<int32_t> part(count, -1);
    r.read(start, count, part.data());
    for (uint64_t i = 0; i < count; ++i)
      ASSERT_EQ(static_cast<uint32_t>(part[i]), ids[start + i]) << "id " << start + i;
  }
}

TEST_F(TokensTest, Hdf5RoundTripUint32) {
  std::vector<uint32_t> ids = {0, 65536, 100000, 5, 99999};
  write_tokens_h5(file("t.h5"), ids, 100001);
  TokenReader r = TokenReader::open(file("t.h5"));
  EXPECT_EQ(r.bytes_per_token(), 4);
  EXPECT_EQ(r.vocab_size_attr(), 100001);
  std::vector<int32_t> got = read_all(r);
  EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.end()), ids);
  h5::File f = h5::open_file(file("t.h5"));
  EXPECT_EQ(h5::read_scalar_attr<int32_t>(f, "format_version"), 1);
}

TEST_F(TokensTest, RawRoundTripUint16AndUint32) {
  std::vector<uint32_t> ids16 = {0, 1, 65535, 256, 513};
  write_tokens_raw(file("t16.bin"), ids16, 2);
  EXPECT_EQ(fs::file_size(file("t16.bin")), 24u + 2 * ids16.size());
  TokenReader r16 = TokenReader::open(file("t16.bin"));
  EXPECT_FALSE(r16.is_hdf5());
  EXPECT_EQ(r16.bytes_per_token(), 2);
  std::vector<int32_t> got16 = read_all(r16);
  EXPECT_EQ(std::vector<uint32_t>(got16.begin(), got16.end()), ids16);

  std::vector<uint32_t> ids32 = {0, 70000, 0x7fffffffu, 1u << 24, 3};
  write_tokens_raw(file("t32.bin"), ids32, 4);
  EXPECT_EQ(fs::file_size(file("t32.bin")), 24u + 4 * ids32.size());
  TokenReader r32 = TokenReader::open(file("t32.bin"));
  EXPECT_EQ(r32.bytes_per_token(), 4);
  std::vector<int32_t> got32 = read_all(r32);
  EXPECT_EQ(std::vector<uint32_t>(got32.begin(), got32.end()), ids32);
  int32_t one;
  r32.read(1, 1, &one);
  EXPECT_EQ(one, 70000);
}

TEST_F(TokensTest, RawHeaderIsLittleEndian) {
  write_tokens_raw(file("t.bin"), {0x0102, 0x0304}, 2);
  std::ifstream in(file("t.bin"), std::ios::binary);
  std::vector<unsigned char> b((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(b.size(), 28u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "MESHTOK1");
  EXPECT_EQ(b[8], 1);   // format_version
  EXPECT_EQ(b[12], 2);  // bytes_per_token
  EXPECT_EQ(b[16], 2);  // n_tokens
  EXPECT_EQ(b[24], 0x02);
  EXPECT_EQ(b[25], 0x01);
  EXPECT_EQ(b[26], 0x04);
  EXPECT_EQ(b[27], 0x03);
}

TEST_F(TokensTest, ReadPastTheEndIsAnError) {
  write_tokens_raw(file("t.bin"), iota_ids(10), 2);
  TokenReader r = TokenReader::open(file("t.bin"));
  std::vector<int32_t> out(10);
  expect_error([&] { r.read(5, 6, out.data()); }, {file("t.bin"), "past the end"});
}

// ---------------------------------------------------------------------------
// Windows and order
// ---------------------------------------------------------------------------

TEST_F(TokensTest, SequentialOrderTargetsAndWrapAround) {
  const int T = 4, B = 2;
  write_tokens_h5(file("t.h5"), iota_ids(23), 1000);  // (23 - 1) / 4 = 5 windows
  TokenReader r = TokenReader::open(file("t.h5"));
  BatchLoader loader(r, B, T, /*shuffle=*/false, 0, 1000);
  ASSERT_EQ(loader.windows_per_epoch(), 5u);

  // Windows 0,1 | 2,3 | 4,0 (wrap) | 1,2
  const std::vector<std::vector<int>> expected = {{0, 1}, {2, 3}, {4, 0}, {1, 2}};
  std::vector<int32_t> in(B * T), tg(B * T);
  for (const auto& step : expected) {
    loader.next(in.data(), tg.data());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        EXPECT_EQ(in[b * T + t], step[b] * T + t);
        EXPECT_EQ(tg[b * T + t], step[b] * T + t + 1);  // targets = inputs shifted by one
      }
  }
  EXPECT_EQ(loader.cursor(), (DataCursor{1, 3}));
}

TEST_F(TokensTest, LastWindowEndsAtTheLastToken) {
  const int T = 4;
  write_tokens_raw(file("t.bin"), iota_ids(9), 2);  // exactly 2 windows, no token unused
  TokenReader r = TokenReader::open(file("t.bin"));
  BatchLoader loader(r, 1, T, false, 0, 100);
  ASSERT_EQ(loader.windows_per_epoch(), 2u);
  std::vector<int32_t> in(T), tg(T);
  loader.next(in.data(), tg.data());
  loader.next(in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(tg, (std::vector<int32_t>{5, 6, 7, 8}));
}

TEST(ShuffledOrder, IsAPermutationAndDependsOnSeedAndEpoch) {
  const uint64_t n = 1000;
  std::vector<uint32_t> a(n), b(n), c(n), d(n);
  shuffled_order(7, 0, n, a.data());
  shuffled_order(7, 0, n, b.data());
  shuffled_order(8, 0, n, c.data());
  shuffled_order(7, 1, n, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  std::vector<uint32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
}

TEST(ShuffledOrder, IsTheSameOnEveryPlatform) {
  // Pinned values (also reproduced by a few lines of Python big-integer
  // arithmetic): the order must not change between compilers, standard
  // libraries or meshlm versions, or a resumed run would see other data.
  std::vector<uint32_t> p(10);
  shuffled_order(1234, 0, 10, p.data());
  EXPECT_EQ(p, (std::vector<uint32_t>{4, 5, 0, 8, 3, 6, 7, 9, 1, 2}));
}

TEST_F(TokensTest, ShuffledEachWindowOncePerEpochDeterministic) {
  const int T = 3, B = 1;
  const uint64_t n_windows = 50;
  write_tokens_h5(file("t.h5"), iota_ids(n_windows * T + 1), 1000);
  TokenReader r = TokenReader::open(file("t.h5"));

  auto epochs = [&](uint64_t seed, int n_epochs) {
    BatchLoader loader(r, B, T, /*shuffle=*/true, seed, 1000);
    EXPECT_EQ(loader.windows_per_epoch(), n_windows);
    std::vector<std::vector<int>> order(n_epochs);
    for (int e = 0; e < n_epochs; ++e)
      for (uint64_t i = 0; i < n_windows; ++i)
        order[e].push_back(step_starts(loader, B, T)[0] / T);
    return order;
  };
  auto a = epochs(42, 3);
  auto b = epochs(42, 3);
  auto c = epochs(43, 1);
  EXPECT_EQ(a, b);          // same seed, same order
  EXPECT_NE(a[0], c[0]);    // other seed, other order
  EXPECT_NE(a[0], a[1]);    // each epoch its own order
  std::vector<int> seq(n_windows);
  for (uint64_t i = 0; i < n_windows; ++i) seq[i] = static_cast<int>(i);
  EXPECT_NE(a[0], seq);     // really shuffled
  for (auto epoch : a) {
    std::sort(epoch.begin(), epoch.end());
    EXPECT_EQ(epoch, seq);  // every window exactly once per epoch
  }
}

TEST_F(TokensTest, DataParallelRanksSplitTheSingleRankStream) {
  const int T = 4, B = 3, steps = 9;
  write_tokens_raw(file("t.bin"), iota_ids(17 * T + 1), 2);  // 17 windows: steps cross epochs
  TokenReader r = TokenReader::open(file("t.bin"));
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "sequential");
    BatchLoader single(r, B, T, shuffle, 5, 1000);
    BatchLoader rank0(r, B, T, shuffle, 5, 1000, 0, 2);
    BatchLoader rank1(r, B, T, shuffle, 5, 1000, 1, 2);
    std::vector<int32_t> in1(B * T), tg1(B * T), in0(B * T), tg0(B * T);
    std::vector<int32_t> want_in(B * T), want_tg(B * T);
    for (int s = 0; s < steps; ++s) {
      rank0.next(in0.data(), tg0.data());
      rank1.next(in1.data(), tg1.data());
      // DP step s = single-rank steps 2s (rank 0's block) and 2s+1 (rank 1's).
      single.next(want_in.data(), want_tg.data());
      EXPECT_EQ(in0, want_in);
      EXPECT_EQ(tg0, want_tg);
      single.next(want_in.data(), want_tg.data());
      EXPECT_EQ(in1, want_in);
      EXPECT_EQ(tg1, want_tg);
      EXPECT_NE(in0, in1);
    }
    EXPECT_EQ(rank0.cursor(), rank1.cursor());
    EXPECT_EQ(rank0.cursor(), single.cursor());
  }
}

TEST_F(TokensTest, ResumeFromCursorGivesTheSameBatches) {
  const int T = 2, B = 4;
  write_tokens_h5(file("t.h5"), iota_ids(41), 100);  // 20 windows
  TokenReader r = TokenReader::open(file("t.h5"));
  BatchLoader a(r, B, T, true, 9, 100);
  std::vector<int32_t> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  for (int i = 0; i < 7; ++i) a.next(in.data(), tg.data());
  DataCursor saved = a.cursor();
  BatchLoader b(r, B, T, true, 9, 100);
  b.set_cursor(saved);
  for (int i = 0; i < 10; ++i) {
    a.next(in.data(), tg.data());
    b.next(in2.data(), tg2.data());
    EXPECT_EQ(in, in2);
    EXPECT_EQ(tg, tg2);
  }
  expect_error([&] { b.set_cursor({0, 20}); }, {file("t.h5"), "out of range"});
}

// ---------------------------------------------------------------------------
// Bad inputs: every message names the file
// ---------------------------------------------------------------------------

TEST_F(TokensTest, NonexistentPath) {
  expect_error([&] { TokenReader::open(file("nope.h5")); }, {file("nope.h5"), "cannot open"});
}

TEST_F(TokensTest, WrongMagic) {
  std::ofstream(file("junk.bin"), std::ios::binary) << "NOTATOKENFILE at all, just some text";
  expect_error([&] { TokenReader::open(file("junk.bin")); },
               {file("junk.bin"), "not an HDF5 token file nor a meshlm raw token file"});
  std::ofstream(file("tiny.bin"), std::ios::binary) << "abc";
  expect_error([&] { TokenReader::open(file("tiny.bin")); }, {file("tiny.bin"), "not an HDF5"});
}

TEST_F(TokensTest, TruncatedRawFile) {
  write_tokens_raw(file("t.bin"), iota_ids(100), 4);
  fs::resize_file(file("t.bin"), 24 + 4 * 100 - 6);
  expect_error([&] { TokenReader::open(file("t.bin")); },
               {file("t.bin"), "truncated", "418", "expected 424"});
  fs::resize_file(file("t.bin"), 20);
  expect_error([&] { TokenReader::open(file("t.bin")); }, {file("t.bin"), "truncated header"});
}

TEST_F(TokensTest, BadRawHeaderFields) {
  write_tokens_raw(file("v.bin"), iota_ids(4), 2);
  {
    std::fstream f(file("v.bin"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8);
    f.put(2);  // format_version 2
  }
  expect_error([&] { TokenReader::open(file("v.bin")); }, {file("v.bin"), "format_version 2"});
  write_tokens_raw(file("b.bin"), iota_ids(4), 2);
  {
    std::fstream f(file("b.bin"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(12);
    f.put(3);  // bytes_per_token 3
  }
  expect_error([&] { TokenReader::open(file("b.bin")); }, {file("b.bin"), "bytes_per_token is 3"});
}

TEST_F(TokensTest, Hdf5MissingDataset) {
  {
    h5::File f = h5::create_file(file("m.h5"));
    h5::write_dataset(f, "ids", std::vector<uint16_t>{1, 2, 3});
  }
  expect_error([&] { TokenReader::open(file("m.h5")); }, {file("m.h5"), "no dataset 'tokens'"});
}

TEST_F(TokensTest, Hdf5TwoDimensionalDataset) {
  {
    h5::File f = h5::create_file(file("2d.h5"));
    std::vector<uint16_t> v(6, 1);
    h5::write_dataset(f, "tokens", v.data(), {2, 3});
  }
  expect_error([&] { TokenReader::open(file("2d.h5")); }, {file("2d.h5"), "(2, 3)", "1-D"});
}

TEST_F(TokensTest, Hdf5FloatAndWrongWidthDatasets) {
  {
    h5::File f = h5::create_file(file("f.h5"));
    h5::write_dataset(f, "tokens", std::vector<float>{1, 2, 3});
  }
  expect_error([&] { TokenReader::open(file("f.h5")); }, {file("f.h5"), "float32"});
  {
    h5::File f = h5::create_file(file("i64.h5"));
    h5::write_dataset(f, "tokens", std::vector<int64_t>{1, 2, 3});
  }
  expect_error([&] { TokenReader::open(file("i64.h5")); }, {file("i64.h5"), "int64"});
}

TEST_F(TokensTest, Hdf5SignedIdsAreReadAndNegativeOnesRejected) {
  {
    h5::File f = h5::create_file(file("s.h5"));
    h5::write_dataset(f, "tokens", std::vector<int32_t>{4, 5, -1, 6});
  }
  TokenReader r = TokenReader::open(file("s.h5"));
  int32_t buf[4];
  r.read(0, 2, buf);
  EXPECT_EQ(buf[1], 5);
  expect_error([&] { r.read(1, 3, buf); }, {file("s.h5"), "position 2", "-1"});
}

TEST_F(TokensTest, IdAtOrAboveVocabIsAnError) {
  std::vector<uint32_t> ids = iota_ids(20);
  ids[13] = 300;
  write_tokens_raw(file("t.bin"), ids, 2);
  TokenReader r = TokenReader::open(file("t.bin"));
  BatchLoader loader(r, 1, 4, false, 0, 256);
  std::vector<int32_t> in(4), tg(4);
  loader.next(in.data(), tg.data());  // window 0: tokens 0..4
  loader.next(in.data(), tg.data());  // window 1: tokens 4..8
  loader.next(in.data(), tg.data());  // window 2: tokens 8..12
  expect_error([&] { loader.next(in.data(), tg.data()); },
               {file("t.bin"), "position 13", "300", "vocab_size 256"});
}

// The whole-file id scans read in chunks of 2^20 tokens: ids placed on both
// sides of chunk boundaries, scanned from starts inside and across chunks,
// against a plain loop over the same ids.
TEST_F(TokensTest, IdScansAgreeWithAPlainLoopAcrossChunks) {
  const size_t n = (size_t{1} << 21) + 77;
  std::vector<uint32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<uint32_t>((i * 2654435761u) % 200);
  for (size_t at : {size_t{0}, (size_t{1} << 20) - 1, size_t{1} << 20, n - 1}) ids[at] = 250;
  ids[(size_t{1} << 20) + 5] = 60000;
  write_tokens_raw(file("t.bin"), ids, 2);
  const TokenReader r = TokenReader::open(file("t.bin"));
  for (auto [start, count] : {std::pair<size_t, size_t>{0, n}, {1, n - 2}, {1000, (size_t{1} << 20) - 1001},
                             {(size_t{1} << 20) + 6, n - (size_t{1} << 20) - 6},  // n - 1 in its 2nd chunk
                             {(size_t{1} << 20) + 1, n - (size_t{1} << 20) - 2}, {5, 0}}) {
    uint32_t want_max = 0;
    size_t want_first = SIZE_MAX;
    for (size_t i = start; i < start + count; ++i) {
      want_max = std::max(want_max, ids[i]);
      if (ids[i] >= 250 && want_first == SIZE_MAX) want_first = i;
    }
    EXPECT_EQ(r.max_id(start, count), want_max) << start << " + " << count;
    const uint64_t first = r.first_at_least(start, count, 250);
    EXPECT_EQ(first, want_first == SIZE_MAX ? UINT64_MAX : want_first) << start << " + " << count;
  }
}

TEST_F(TokensTest, TooShortForSeqLen) {
  write_tokens_h5(file("t.h5"), iota_ids(8), 100);
  TokenReader r = TokenReader::open(file("t.h5"));
  expect_error([&] { BatchLoader(r, 1, 8, false, 0, 100); },
               {file("t.h5"), "has 8 tokens; seq_len 8 needs at least 9"});
  BatchLoader ok(r, 1, 7, false, 0, 100);  // 8 tokens = one window of 7 + 1
  EXPECT_EQ(ok.windows_per_epoch(), 1u);
}

TEST_F(TokensTest, FailedWritesLeaveNoFile) {
  std::vector<uint32_t> ids = iota_ids(10);
  ids[7] = 256;
  expect_error([&] { write_tokens_h5(file("bad.h5"), ids, 256); },
               {file("bad.h5"), "position 7", "256"});
  expect_error([&] { write_tokens_raw(file("bad.bin"), {1, 2, 70000}, 2); },
               {file("bad.bin"), "position 2", "70000"});
  expect_error([&] { write_tokens_raw(file("bad3.bin"), {1}, 3); }, {file("bad3.bin"), "2 or 4"});
  EXPECT_TRUE(listing().empty());
  // An existing file is left as it was when the rewrite fails.
  write_tokens_h5(file("keep.h5"), iota_ids(5), 10);
  expect_error([&] { write_tokens_h5(file("keep.h5"), ids, 256); }, {file("keep.h5")});
  EXPECT_EQ(TokenReader::open(file("keep.h5")).size(), 5u);
  EXPECT_EQ(listing(), std::vector<std::string>{"keep.h5"});
}

TEST_F(TokensTest, WritingCreatesParentDirectories) {
  write_tokens_raw(file("a/b/t.bin"), iota_ids(3), 2);
  EXPECT_EQ(TokenReader::open(file("a/b/t.bin")).size(), 3u);
}

// ---------------------------------------------------------------------------
// Byte tokenizer
// ---------------------------------------------------------------------------

TEST_F(TokensTest, TokenizeBytesGivesByteValues) {
  const std::string text = "Hi!\n\xff\x01";
  std::ofstream(file("in.txt"), std::ios::binary) << text;
  EXPECT_EQ(tokenize_bytes(file("in.txt"), file("out.h5")), text.size());
  TokenReader r = TokenReader::open(file("out.h5"));
  EXPECT_EQ(r.vocab_size_attr(), 256);
  EXPECT_EQ(r.bytes_per_token(), 2);
  EXPECT_EQ(read_all(r), (std::vector<int32_t>{'H', 'i', '!', '\n', 255, 1}));
}

TEST_F(TokensTest, TokenizeBytesErrors) {
  expect_error([&] { tokenize_bytes(file("missing.txt"), file("o.h5")); },
               {file("missing.txt"), "cannot open"});
  std::ofstream(file("empty.txt")).close();
  expect_error([&] { tokenize_bytes(file("empty.txt"), file("o.h5")); },
               {file("empty.txt"), "empty"});
  EXPECT_FALSE(fs::exists(file("o.h5")));
}

// meshlm replaces only the token files it wrote itself (vocab_size and
// format_version on the root, which every meshlm version wrote, and no other
// object than /tokens and /val_tokens): another tool's file with a /tokens
// dataset is refused and left as it was.
TEST_F(TokensTest, OnlyMeshlmsOwnTokenFilesAreReplaced) {
  write_tokens_h5(file("own.h5"), iota_ids(5), 10);
  EXPECT_TRUE(is_token_file_h5(file("own.h5")));
  auto foreign = [&](const std::string& name, bool attrs, bool weights) {
    h5::File f = h5::create_file(file(name));
    h5::write_dataset(f, "tokens", std::vector<uint32_t>{1, 2, 3});
    if (weights) h5::write_dataset(f, "weights", std::vector<double>{1, 1});
    if (attrs) {
      h5::write_scalar_attr<int64_t>(f, "vocab_size", 10);
      h5::write_scalar_attr<int32_t>(f, "format_version", kTokensFormatVersion);
    }
    h5::close_file(f, file(name));
  };
  foreign("other.h5", false, true);
  foreign("bare.h5", false, false);
  foreign("more.h5", true, true);
  foreign("like_own.h5", true, false);
  EXPECT_FALSE(is_token_file_h5(file("other.h5")));
  EXPECT_FALSE(is_token_file_h5(file("bare.h5")));
  EXPECT_FALSE(is_token_file_h5(file("more.h5")));
  EXPECT_TRUE(is_token_file_h5(file("like_own.h5")));
  std::ofstream(file("in.txt")) << "abc";
  expect_error([&] { tokenize_bytes(file("in.txt"), file("other.h5")); },
               {file("other.h5"), "not a meshlm token file"});
  {
    h5::File f = h5::open_file(file("other.h5"));
    EXPECT_TRUE(h5::exists(f, "weights"));
  }
  EXPECT_EQ(tokenize_bytes(file("in.txt"), file("own.h5")), 3u);
  EXPECT_EQ(TokenReader::open(file("own.h5")).size(), 3u);
}
