// The parameter file of `meshlm train`: INI sections read with
// Boost.Program_options, every key overridable on the command line as
// --section.key=value. The option table in parameter_file.cpp is the single
// source of every key, its default and its meaning; `meshlm train --help`
// prints it and docs/parameters.md is generated from that output.
//
// Values are typed where they are read: a keyword (parallel.schedule,
// quant.type, ...) is bound straight to its enum through the enum's name
// table (core/enum_names.h), so a bad value is rejected here, with the key
// and the accepted names. What the values mean together is checked by the
// layers that own them (train/run_config.h).
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "train/layout_search.h"
#include "train/run_config.h"

namespace meshlm {

// Parses the parameter file text (named `source` in messages) and the
// command-line overrides ("--section.key=value" or "--section.key value").
// Throws CollectiveError naming the key or the file on any error; every rank
// that calls it with the same text throws the same error.
// `world_size` (the ranks of the job) resolves parallel.dp = 0.
//
// parallel.layout = auto: every key but [parallel]'s is checked on one rank,
// then `choose` (when given) returns the layout of `world_size` ranks to run
// (resolved, with RunConfig::layout_choice saying why), keeping the
// [parallel] keys that were given explicitly (`constraints`; dp, tp, pp and
// micro_batches given as 0 mean "derived" and keep nothing); its [parallel]
// values and train.micro_batch_size are taken.
// Without `choose` the result is that one-rank configuration, layout still
// auto (for commands that do not train).
using LayoutChooser =
    std::function<RunConfig(const RunConfig& base, const LayoutConstraints& constraints)>;
RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides, int world_size = 1,
                           const LayoutChooser& choose = {});

// The bytes of the parameter file `path` (one process): false, with `why`
// (": it is a directory", ... or empty), when it is not a regular file or
// cannot be read.
bool read_parameter_text(const std::string& path, std::string& text, std::string& why);
// Collective over `job`: rank 0 reads `path`, every rank parses the same
// bytes (so a file visible on one node only still gives one clear error).
// With `choose_layout`, parallel.layout = auto takes the planner's layout
// (choose_auto_layout).
RunConfig load_run_config(MPI_Comm job, const std::string& path,
                          const std::vector<std::string>& overrides, bool choose_layout = false);

// Collective over `job`: world rank 0 searches the layouts of the job's
// ranks (train/layout_search.h) for the fastest that fits the memory
// limits (memory.limit_per_rank, memory.limit_per_node; else on the CPU the
// node's memory / its ranks and the node's memory), broadcasts it, and every
// rank returns it. CollectiveError when none fits, naming the nearest.
RunConfig choose_auto_layout(MPI_Comm job, const RunConfig& base, const LayoutConstraints& k);

// Every key: "  --model.n_layer arg (=2)  transformer blocks (L)".
std::string run_config_help();

}  // namespace meshlm
