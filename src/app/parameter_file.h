// The parameter file of `meshlm train`: INI sections read with
// Boost.Program_options, every key overridable on the command line as
// --section.key=value. The option table in parameter_file.cpp is the single
// source of every key, its default and its meaning; `meshlm train --help`
// prints it and the README's reference is generated from that output.
//
// Values are typed where they are read: a keyword (parallel.schedule,
// quant.type, ...) is bound straight to its enum through the enum's name
// table (core/enum_names.h), so a bad value is rejected here, with the key
// and the accepted names. What the values mean together is checked by the
// layers that own them (train/run_config.h).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "train/run_config.h"

namespace meshlm {

// Parses the parameter file text (named `source` in messages) and the
// command-line overrides ("--section.key=value" or "--section.key value").
// Throws CollectiveError naming the key or the file on any error; every rank
// that calls it with the same text throws the same error.
// `world_size` (the ranks of the job) resolves parallel.dp = 0.
RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides, int world_size = 1);

// The bytes of the parameter file `path` (one process): false, with `why`
// (": it is a directory", ... or empty), when it is not a regular file or
// cannot be read.
bool read_parameter_text(const std::string& path, std::string& text, std::string& why);
// Collective over `job`: rank 0 reads `path`, every rank parses the same
// bytes (so a file visible on one node only still gives one clear error).
RunConfig load_run_config(MPI_Comm job, const std::string& path,
                          const std::vector<std::string>& overrides);

// Every key: "  --model.n_layer arg (=2)  transformer blocks (L)".
std::string run_config_help();

}  // namespace meshlm
