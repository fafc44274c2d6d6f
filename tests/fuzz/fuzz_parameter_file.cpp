// Fuzz target: the parameter-file reader, meshlm::parse_run_config
// (src/app/parameter_file.h), which parses the INI text and the command-line
// overrides and resolves and checks the whole configuration. Pure: no MPI,
// no files.
//
// Two kinds of input:
//  * text: the file's text, optionally followed by a NUL and the overrides,
//    one per line ("--train.steps=5"), optionally followed by a second NUL
//    and the job's rank count in decimal (default 1). A plain .cfg file is an
//    input as it is (tests/fuzz/corpus/parameter_file/*.cfg).
//  * structured, when the first byte is 0x01: a description, read by
//    ByteReader, of a file of "section.key = value" lines whose keys are
//    taken from the option table (run_config_help(), so new keys join in)
//    and whose values are typed: integers at the edges of int, doubles
//    (nan, inf, ...), keywords, lists, odd text; some lines become
//    command-line overrides instead; and the rank count. Byte mutations of
//    text rarely put two large numbers on the right two keys; here each is
//    one byte.
//
// A CollectiveError (or any meshlm::Error) is the expected answer to a bad
// file; any other exception, a crash, a hang or a sanitizer report is a
// finding, as is an accepted file whose resolved configuration does not
// parse back to itself.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/parameter_file.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "fuzz_targets.h"

namespace meshlm::fuzz {

namespace {

// Every key of the option table ("model.n_layer", ...), from --help.
const std::vector<std::string>& option_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    const std::string help = run_config_help();
    for (size_t at = help.find("--"); at != std::string::npos; at = help.find("--", at + 2)) {
      size_t end = at + 2;
      while (end < help.size() && (std::isalnum(static_cast<unsigned char>(help[end])) ||
                                   help[end] == '_' || help[end] == '.'))
        ++end;
      const std::string key = help.substr(at + 2, end - at - 2);
      if (key.find('.') != std::string::npos &&
          std::find(out.begin(), out.end(), key) == out.end())
        out.push_back(key);
    }
    if (out.size() < 10) {
      std::fprintf(stderr, "meshlm fuzz: found only %zu keys in run_config_help()\n", out.size());
      std::abort();
    }
    return out;
  }();
  return keys;
}

// A value of one of a few kinds, as text.
std::string typed_value(ByteReader& in) {
  static const char* const kEdges[] = {
      "0", "1", "-1", "2", "3", "7", "8", "64", "65", "256", "1024", "46341", "65536",
      "2147483647", "-2147483648", "2147483584", "2147483585", "4294967296", "1000000000",
      "99999999999999999999", "0x10", "1e3", " 4 ", "+2", "08"};
  static const char* const kDoubles[] = {"0", "0.5", "1", "-1", "nan", "-nan", "inf", "-inf",
                                         "1e-300", "1e308", "1e400", "4.9e-324", "0.1", "1."};
  static const char* const kWords[] = {
      "gpipe", "1f1b", "none", "full", "lora", "nf4", "int8", "f32", "node", "per_rank",
      "true", "false", "yes", "qkv", "qkv,mlp-up", "attn-out, mlp-down", "qkv,,", "1,1",
      "2,2,2,2", "1, 0", ",", "data/x.h5", "/dev/null", "%value%", "a#b", ""};
  switch (in.pick(8)) {
    case 0: return std::to_string(static_cast<int8_t>(in.u8()));
    case 1: return std::to_string(in.u32());
    case 2: return std::to_string(static_cast<int32_t>(in.u32()));
    case 3: return kDoubles[in.pick(sizeof kDoubles / sizeof *kDoubles)];
    case 4: return kWords[in.pick(sizeof kWords / sizeof *kWords)];
    case 5: return in.bytes(16);
    default: return kEdges[in.pick(sizeof kEdges / sizeof *kEdges)];
  }
}

// Parses; an accepted file must resolve to a text that parses to itself.
void check_parse(const std::string& text, const std::vector<std::string>& overrides,
                 int world_size) {
  RunConfig c;
  try {
    c = parse_run_config(text, "fuzz.cfg", overrides, world_size);
  } catch (const meshlm::Error& e) {
    report(e.what());
    return;
  }
  report("accepted");
  // The resolved text of an accepted file parses again, to the same
  // configuration (as test_config.cpp checks for one file). Only for a file
  // alone: an override may give a value no INI line can hold ('#', spaces at
  // either end).
  if (!overrides.empty()) return;
  std::string again;
  try {
    again = parse_run_config(c.resolved, "resolved.cfg", {}, world_size).resolved;
  } catch (const meshlm::Error& e) {
    again = std::string("(rejected: ") + e.what() + ")";
  }
  if (again != c.resolved) {
    std::fprintf(stderr, "the resolved configuration does not parse to itself:\n%s\n---\n%s\n",
                 c.resolved.c_str(), again.c_str());
    std::abort();
  }
}

}  // namespace

void fuzz_parameter_file(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 0x01) {
    ByteReader in(data + 1, size - 1);
    const std::vector<std::string>& keys = option_keys();
    std::string text = in.one_in(8) ? "" : "data.path = tokens.h5\n";
    std::vector<std::string> overrides;
    const unsigned lines = 1 + in.pick(12);
    for (unsigned i = 0; i < lines; ++i) {
      const std::string& key = keys[in.pick(static_cast<unsigned>(keys.size()))];
      const std::string value = typed_value(in);
      if (in.one_in(4)) overrides.push_back("--" + key + "=" + value);
      else text += key + " = " + value + "\n";
    }
    // The rank count as a launcher gives it: 1 .. 16, sometimes more.
    const int world_size = in.one_in(8) ? 1 + static_cast<int>(in.u32() % (1u << 20))
                                        : 1 + static_cast<int>(in.pick(16));
    check_parse(text, overrides, world_size);
    return;
  }
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul1 = input.find('\0');
  const std::string text = input.substr(0, nul1);
  std::vector<std::string> overrides;
  int world_size = 1;
  if (nul1 != std::string::npos) {
    const size_t nul2 = input.find('\0', nul1 + 1);
    const std::string args = input.substr(nul1 + 1, nul2 == std::string::npos ? std::string::npos
                                                                              : nul2 - nul1 - 1);
    for (size_t at = 0; at <= args.size();) {
      const size_t nl = std::min(args.find('\n', at), args.size());
      if (nl > at) overrides.push_back(args.substr(at, nl - at));
      at = nl + 1;
    }
    if (nul2 != std::string::npos) {
      // A rank count as a launcher could give it: 1 .. 2^20.
      long n = 0;
      for (size_t i = nul2 + 1; i < input.size() && i < nul2 + 8; ++i)
        if (input[i] >= '0' && input[i] <= '9') n = n * 10 + (input[i] - '0');
      world_size = static_cast<int>(n % (1 << 20)) + 1;
    }
  }
  check_parse(text, overrides, world_size);
}

}  // namespace meshlm::fuzz

MESHLM_FUZZ_ENTRY(meshlm::fuzz::fuzz_parameter_file)
