// meshlm ckpt TOOL ...: one table of tools (name, arguments, options, what
// it does, how it runs) drives the parsing, the help and the dispatch. The
// arguments are parsed on every rank alike, so a bad one is a
// CollectiveError; the tool then runs on world rank 0 and its outcome is
// shared with every rank by check_all.
#include "app/ckpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "app/ckpt_convert.h"
#include "app/ckpt_tools.h"
#include "comm/errors.h"
#include "core/error.h"
#include "core/log.h"
#include "core/suggest.h"

namespace meshlm {

namespace {

// What the command line gave a tool.
struct ToolArgs {
  std::vector<std::string> files;
  std::set<std::string> flags;                 // "--layers"
  std::map<std::string, std::string> values;   // "--top" -> "5"
  std::vector<std::string> raw;                // everything after the tool's name
};

struct Tool {
  const char* name;
  const char* synopsis;  // arguments and options, for the usage line
  const char* help;      // what it does
  // Positional files (SIZE_MAX: the tool parses its own arguments).
  size_t files;
  std::vector<std::string> flags, valued;
  std::function<int(const ToolArgs&)> run;  // on world rank 0
};

ckpt_tools::Format format_of(const ToolArgs& a) {
  const auto it = a.values.find("--format");
  if (it == a.values.end() || it->second == "table") return ckpt_tools::Format::table;
  return ckpt_tools::Format::tsv;  // checked by parse()
}

const std::vector<Tool>& tools() {
  static const std::vector<Tool> kTools = {
      {"inspect", "FILE [--config]",
       "every group and dataset (shape, dtype, bytes, attributes, the xxh3 attribute and\n"
       "whether /meta/checksums agrees), totals per group, and the attributes of / and\n"
       "/meta; --config prints the resolved parameter file (the config attribute) whole",
       1, {"--config"}, {},
       [](const ToolArgs& a) {
         ckpt_tools::inspect({a.files[0], a.flags.contains("--config")});
         return 0;
       }},
      {"stats", "FILE [--layers] [--format table|tsv]",
       "per dataset: numel, min, max, mean, std, L2 norm (in double, over the finite\n"
       "values; std divides by n) and the NaN and Inf counts, read a block of rows at a\n"
       "time; --layers adds the same per set (params, optimizer/m, ...) and layer\n"
       "(embeddings, h.<l>, ln_f); --format tsv prints tab-separated rows, every digit",
       1, {"--layers"}, {"--format"},
       [](const ToolArgs& a) {
         ckpt_tools::stats({a.files[0], a.flags.contains("--layers"), format_of(a)});
         return 0;
       }},
      {"diff", "A B [--top N] [--format table|tsv]",
       "per dataset in both files: ||a - b|| / max(||a||, 1e-30) and max |a - b|,\n"
       "largest first, N rows (default 20; 0: all); datasets in one file only, shapes\n"
       "that differ, and the attributes of / and /meta that differ (the parameter\n"
       "file's lines). Exit status 0 whatever the differences",
       2, {}, {"--top", "--format"},
       [](const ToolArgs& a) {
         ckpt_tools::DiffOptions o{a.files[0], a.files[1]};
         if (const auto it = a.values.find("--top"); it != a.values.end())
           o.top = std::stoull(it->second);  // checked by parse()
         o.format = format_of(a);
         ckpt_tools::diff(o);
         return 0;
       }},
      {"verify", "FILE",
       "recomputes every dataset's XXH3-64 and compares it with its xxh3 attribute and\n"
       "/meta/checksums; checks /meta's kind and format_version (1). Exit status 1,\n"
       "naming the file and the first bad dataset, when anything is wrong",
       1, {}, {},
       [](const ToolArgs& a) {
         ckpt_tools::verify({a.files[0]});
         return 0;
       }},
      {"export", "ARGS", "a checkpoint to a Hugging Face model directory (GPT-2 or Llama) or a safetensors file (meshlm ckpt export --help)",
       SIZE_MAX, {}, {}, [](const ToolArgs& a) { return ckpt_export(a.raw); }},
      {"import", "ARGS", "a Hugging Face model directory (GPT-2 or Llama) or a GPT-2 safetensors file to a checkpoint (meshlm ckpt import --help)",
       SIZE_MAX, {}, {}, [](const ToolArgs& a) { return ckpt_import(a.raw); }},
  };
  return kTools;
}

std::string tool_usage(const Tool& t) {
  std::string s = fmt::format("  meshlm ckpt {} {}\n", t.name, t.synopsis);
  size_t start = 0;
  const std::string help = t.help;
  while (start <= help.size()) {
    size_t end = help.find('\n', start);
    if (end == std::string::npos) end = help.size();
    s += "      " + help.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return s;
}

std::string usage() {
  std::string s =
      "usage: meshlm ckpt TOOL [args]\n"
      "\n"
      "Post-hoc tools for meshlm checkpoints (docs/formats.md, \"Checkpoints\"). They run\n"
      "on rank 0 (the other ranks of a job wait); inspect, stats, diff and verify read\n"
      "serially and write nothing. Header lines start with '#'; long work prints a\n"
      "progress line per 10%.\n"
      "\n";
  for (const Tool& t : tools()) s += tool_usage(t) + "\n";
  s += "  meshlm ckpt help | --help\n      this text\n"
       "\n"
       "example: meshlm ckpt verify out/demo/checkpoints/step_00000100.h5\n";
  return s;
}

void print_on_rank_zero(const std::string& text) {
  if (log::rank() != 0) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

// The arguments of `t`, parsed the same way on every rank: CollectiveError
// naming the argument. nullopt when --help was asked for (printed here).
std::optional<ToolArgs> parse(const Tool& t, const std::vector<std::string>& args) {
  ToolArgs a;
  a.raw = args;
  if (t.files == SIZE_MAX) return a;
  const std::string who = fmt::format("meshlm ckpt {}", t.name);
  auto bad = [&](const std::string& what) {
    return CollectiveError(fmt::format("{}: {} (usage: meshlm ckpt {} {})", who, what, t.name, t.synopsis),
                           MESHLM_HERE);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      print_on_rank_zero("usage:\n" + tool_usage(t));
      return std::nullopt;
    }
    if (!arg.starts_with("--")) {
      a.files.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const bool is_flag = std::find(t.flags.begin(), t.flags.end(), name) != t.flags.end();
    const bool takes_value = std::find(t.valued.begin(), t.valued.end(), name) != t.valued.end();
    if (is_flag) {
      if (eq != std::string::npos) throw bad(fmt::format("option {} takes no value ('{}')", name, arg));
      a.flags.insert(name);
    } else if (takes_value) {
      std::string value;
      if (eq != std::string::npos) value = arg.substr(eq + 1);
      else if (i + 1 < args.size()) value = args[++i];
      else throw bad(fmt::format("option {} needs a value", name));
      a.values[name] = value;
    } else {
      std::vector<std::string> known = t.flags;
      known.insert(known.end(), t.valued.begin(), t.valued.end());
      throw bad(fmt::format("unknown option '{}'{}", log::printable(arg), did_you_mean(name, known)));
    }
  }
  if (a.files.size() != t.files)
    throw bad(fmt::format("needs {} file{}, got {}", t.files, t.files == 1 ? "" : "s", a.files.size()));
  if (const auto it = a.values.find("--top"); it != a.values.end()) {
    size_t n = 0;
    const char* end = it->second.data() + it->second.size();
    const auto r = std::from_chars(it->second.data(), end, n);
    if (it->second.empty() || r.ec != std::errc() || r.ptr != end)
      throw bad(fmt::format("--top '{}': not a whole number >= 0", log::printable(it->second)));
  }
  if (const auto it = a.values.find("--format");
      it != a.values.end() && it->second != "table" && it->second != "tsv")
    throw bad(fmt::format("--format '{}': table or tsv", log::printable(it->second)));
  return a;
}

}  // namespace

int cmd_ckpt(const std::vector<std::string>& args) {
  if (args.empty()) {
    if (log::rank() == 0) std::fputs(usage().c_str(), stderr);
    throw CollectiveError("meshlm ckpt needs a tool (inspect, stats, diff, verify, export, import)",
                          MESHLM_HERE);
  }
  const std::string& name = args[0];
  if (name == "help" || name == "--help" || name == "-h") {
    print_on_rank_zero(usage());
    return 0;
  }
  const auto& all = tools();
  const auto tool = std::find_if(all.begin(), all.end(), [&](const Tool& t) { return name == t.name; });
  if (tool == all.end())
    throw CollectiveError(fmt::format("meshlm ckpt: unknown tool '{}' (inspect, stats, diff, verify, "
                                      "export, import; meshlm ckpt --help)",
                                      log::printable(name)),
                          MESHLM_HERE);
  const std::optional<ToolArgs> a = parse(*tool, {args.begin() + 1, args.end()});
  if (!a) return 0;

  // Rank 0 runs the tool; every rank waits in check_all for its outcome, so
  // a file rank 0 cannot read (or a failed verification) ends every rank
  // with the same error and exit status 1, and no rank hangs.
  bool ok = true;
  std::string msg;
  if (log::rank() == 0) {
    try {
      const int status = tool->run(*a);
      if (status != 0) {
        ok = false;
        msg = fmt::format("meshlm ckpt {}: exit status {}", tool->name, status);
      }
    } catch (const std::exception& e) {
      ok = false;
      msg = fmt::format("meshlm ckpt {}: {}", tool->name, e.what());
    }
    std::fflush(stdout);
  }
  check_all(MPI_COMM_WORLD, ok, msg, MESHLM_HERE);
  return 0;
}

}  // namespace meshlm
