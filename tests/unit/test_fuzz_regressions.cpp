// The fuzz targets (tests/fuzz/) without libFuzzer: every input of their
// seed corpora and of past findings (tests/fuzz/regressions/<target>/) goes
// through the same function the fuzzer calls, in the ordinary build. An
// input that crashes, aborts or lets a foreign exception escape fails here.
//
// Findings have a test of their own below, which says what went wrong and
// checks the error meshlm now gives.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "app/parameter_file.h"
#include "core/error.h"
#include "core/log.h"
#include "expect_error.h"
#include "fuzz_targets.h"
#include "io/h5.h"
#include "io/quant_cache.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using namespace meshlm;

namespace {

using Target = void (*)(const uint8_t*, size_t);

// Every file of tests/fuzz/<kind>/<target>/, sorted.
std::vector<fs::path> inputs(const std::string& kind, const std::string& target) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(MESHLM_FUZZ_DIR) / kind / target;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void replay(const std::string& target, Target fn, bool need_seeds = true) {
  std::vector<fs::path> all = inputs("corpus", target);
  if (need_seeds) EXPECT_FALSE(all.empty()) << "no seed corpus for " << target;
  for (const fs::path& p : inputs("regressions", target)) all.push_back(p);
  for (const fs::path& p : all) {
    SCOPED_TRACE(p.string());
    const std::string bytes = read_bytes(p);
    EXPECT_NO_THROW(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  }
}

}  // namespace

TEST(FuzzReplay, ParameterFile) { replay("parameter_file", fuzz::fuzz_parameter_file); }
TEST(FuzzReplay, Safetensors) { replay("safetensors", fuzz::fuzz_safetensors); }
TEST(FuzzReplay, Tokens) {
  // The seeds include HDF5 token files: read them as they are (fuzz_tokens.cpp).
  ::setenv("MESHLM_FUZZ_RAW_HDF5", "1", 1);
  replay("tokens", fuzz::fuzz_tokens);
  ::unsetenv("MESHLM_FUZZ_RAW_HDF5");
}
TEST(FuzzReplay, QuantCache) { replay("quant_cache", fuzz::fuzz_quant_cache); }

// ---------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------

namespace {

// The message of the meshlm::Error that parse_run_config throws for `text`
// and `overrides`. A parse that has not ended after 30 s ends the program
// (a hang would otherwise hold the test until ctest's timeout).
std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  std::packaged_task<std::string()> task([text, overrides] {
    try {
      (void)parse_run_config(text, "p.cfg", overrides);
    } catch (const meshlm::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  });
  std::future<std::string> result = task.get_future();
  std::thread(std::move(task)).detach();
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "parse_run_config has not ended after 30 s; text:\n%s\n", text.c_str());
    std::_Exit(1);
  }
  return result.get();
}

}  // namespace

// fuzz_parameter_file found that a value holding "%value%" hung meshlm on
// every rank (regressions/parameter_file/hang-*): Boost.Program_options
// replaces the placeholders of its error message until none is left, and
// the value put one back each time. Now the error names the key and the
// value as written.
TEST(FuzzFindings, ValueHoldingAMessagePlaceholderIsAnErrorNotAHang) {
  std::string msg = parse_error("[train]\nlr = %value%'_min_ratio = 0.1\n");
  EXPECT_NE(msg.find("p.cfg"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.lr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'%value%'_min_ratio = 0.1'"), std::string::npos) << msg;
  // A keyword, a list of targets, a layer list (meshlm's own validators).
  msg = parse_error("[parallel]\nschedule = %value%\n");
  EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << msg;
  EXPECT_NE(msg.find("('%value%')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpipe"), std::string::npos) << msg;
  msg = parse_error("[finetune]\nlora_targets = qkv,%value%\n");
  EXPECT_NE(msg.find("unknown target '%value%'"), std::string::npos) << msg;
  msg = parse_error("[parallel]\nstage_layers = 1,%value%\n");
  EXPECT_NE(msg.find("parallel.stage_layers"), std::string::npos) << msg;
  // Every placeholder Boost knows, on the command line too, and the
  // escape character itself.
  for (const std::string& v : {"%value%", "%canonical_option%", "%prefix%", "%option%",
                               "%original_token%", "%invalid_line%", "a\1p%value%\1e"}) {
    // A control byte in a parameter file is refused as such, by its line;
    // messages show it escaped (\x01).
    const bool control = v.find('\1') != std::string::npos;
    const std::string shown = log::printable(v);
    msg = parse_error("[train]\nsteps = " + v + "\n");
    EXPECT_NE(msg.find(control ? "line 2 holds the byte \\x01" : "train.steps"), std::string::npos)
        << msg;
    if (!control) EXPECT_NE(msg.find("('" + v + "')"), std::string::npos) << msg;
    msg = parse_error("", {"--train.steps=" + v});
    EXPECT_NE(msg.find("('" + shown + "')"), std::string::npos) << msg;
    msg = parse_error("", {"--" + v + "=1"});
    EXPECT_NE(msg.find("command line"), std::string::npos) << msg;
    msg = parse_error("[train]\n" + v + " = 1\n");
    EXPECT_NE(msg.find(control ? "holds the byte" : "unknown key"), std::string::npos) << msg;
  }
}

// parallel.dp = 0 divided the job's ranks by parallel.tp * parallel.pp in int:
// 65536 * 65536 overflowed (undefined; in practice 0, then a division by zero
// on every rank). regressions/parameter_file/overflow-tp-times-pp.cfg.
TEST(FuzzFindings, HugeTpTimesPpIsAnErrorNotAnOverflow) {
  const std::string msg =
      parse_error("[parallel]\ndp = 0\ntp = 65536\npp = 65536\n[data]\npath = x\n");
  // Refused by the range of parallel.tp before any product is formed.
  EXPECT_NE(msg.find("parallel.tp = 65536: must lie in"), std::string::npos) << msg;
  EXPECT_NE(parse_error("[parallel]\ndp = 0\ntp = 2147483647\npp = 2147483647\n").find(
                "parallel.tp = 2147483647"),
            std::string::npos);
}

// model.vocab_size near 2^31 overflowed the padded vocabulary (a multiple of
// 64) in int. regressions/parameter_file/overflow-padded-vocab.cfg.
TEST(FuzzFindings, VocabularyWhosePaddedSizeIsNoIntIsAnError) {
  for (const char* v : {"2147483647", "2147483585"}) {
    const std::string msg =
        parse_error(std::string("[model]\nvocab_size = ") + v + "\n[data]\npath = x\n");
    EXPECT_NE(msg.find(std::string("model.vocab_size = ") + v + ": must lie in [2, 16777216]"),
              std::string::npos)
        << msg;
  }
  // The largest one is a valid configuration.
  EXPECT_EQ(parse_error("[model]\nvocab_size = 16777216\n[data]\npath = x\n"), "(no error)");
}

// h5::read_string_attr read an attribute holding several strings into room
// for one: an array of variable-length strings overran a pointer on the
// stack, one of fixed-length strings a heap buffer. fuzz_quant_cache found it
// through the cache's "key" (regressions/quant_cache/overflow-string-attr-array);
// every string attribute meshlm reads went through it. Now such an attribute
// is an error, and a cache holding one is reported corrupt.
using FuzzFindingsFiles = ScratchDirTest;

TEST_F(FuzzFindingsFiles, StringAttributeHoldingSeveralStringsIsAnError) {
  namespace h5 = io::h5;
  const std::string path = file("strings.h5");
  {
    h5::File f = h5::create_file(path);
    const hsize_t three = 3;
    h5::Dataspace space(H5Screate_simple(1, &three, nullptr));
    h5::Datatype vlen(H5Tcopy(H5T_C_S1));
    H5Tset_size(vlen, H5T_VARIABLE);
    const char* v[3] = {"a", "bb", "ccc"};
    h5::Attribute a(H5Acreate2(f, "vlen", vlen, space, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Awrite(a, vlen, v), 0);
    h5::Datatype fixed(H5Tcopy(H5T_C_S1));
    H5Tset_size(fixed, 4);
    h5::Attribute b(H5Acreate2(f, "fixed", fixed, space, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Awrite(b, fixed, "abc\0def\0ghi"), 0);
    h5::Dataspace null_space(H5Screate(H5S_NULL));
    h5::Attribute c(H5Acreate2(f, "none", fixed, null_space, H5P_DEFAULT, H5P_DEFAULT));
    h5::Dataspace one_space(H5Screate_simple(1, std::array<hsize_t, 1>{1}.data(), nullptr));
    h5::Attribute d(H5Acreate2(f, "one", fixed, one_space, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Awrite(d, fixed, "xyz"), 0);
  }
  h5::File f = h5::open_file(path);
  for (const char* name : {"vlen", "fixed", "none"})
    expect_error([&] { (void)h5::read_string_attr(f, name); },
                 {name, "is not a single string"});
  EXPECT_EQ(h5::read_string_attr(f, "one"), "xyz");  // one string, 1-D: still one string
}

TEST_F(FuzzFindingsFiles, CacheWhoseKeyIsAnArrayOfStringsIsCorrupt) {
  namespace h5 = io::h5;
  const std::string path = file("cache.h5");
  const std::vector<io::CacheTensor> layout = fuzz::quant_cache_layout();
  std::vector<uint8_t> store(fuzz::kQuantCacheStoreBytes, 7);
  io::write_quant_cache(path, fuzz::quant_cache_key(), layout, store.data(), store.size());
  ASSERT_EQ(io::read_quant_cache(path, fuzz::quant_cache_key(), layout, store.data(), store.size())
                .status,
            io::CacheStatus::hit);
  {
    h5::File f = h5::open_file(path, /*writable=*/true);
    h5::Group meta(H5Gopen2(f, "meta", H5P_DEFAULT));
    ASSERT_GE(H5Adelete(meta, "key"), 0);
    const hsize_t three = 3;
    h5::Dataspace space(H5Screate_simple(1, &three, nullptr));
    h5::Datatype vlen(H5Tcopy(H5T_C_S1));
    H5Tset_size(vlen, H5T_VARIABLE);
    const std::string key = fuzz::quant_cache_key().key();
    const char* v[3] = {key.c_str(), key.c_str(), key.c_str()};
    h5::Attribute a(H5Acreate2(meta, "key", vlen, space, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Awrite(a, vlen, v), 0);
  }
  const io::CacheLookup r =
      io::read_quant_cache(path, fuzz::quant_cache_key(), layout, store.data(), store.size());
  EXPECT_EQ(r.status, io::CacheStatus::corrupt) << r.reason;
  EXPECT_NE(r.reason.find("is not a single string"), std::string::npos) << r.reason;
}
