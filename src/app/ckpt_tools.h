// The reading tools of `meshlm ckpt` (app/ckpt.h dispatches to them): each
// reads one or two checkpoint files serially and prints to stdout. They run
// on world rank 0 alone, write nothing, and throw RankError naming the file
// (and the dataset) when something cannot be read; the dispatcher turns that
// into every rank's error.
#pragma once

#include <cstddef>
#include <string>

#include "app/ckpt_read.h"

namespace meshlm::ckpt_tools {

// The tree (every group and dataset: shape, dtype, bytes, xxh3), totals per
// top-level group, and the attributes of / and /meta; the `config`
// attribute summarised, or printed whole with `show_config`.
struct InspectOptions {
  std::string file;
  bool show_config = false;
};
void inspect(const InspectOptions& o);

// Per dataset: min, max, mean, std (divides by n), L2 norm, over the finite
// values in double, and the NaN and Inf counts; with `layers`, the same per
// set (params, optimizer/m, ...) and layer (embeddings, h.<l>, ln_f).
struct StatsOptions {
  std::string file;
  bool layers = false;
  Format format = Format::table;
};
void stats(const StatsOptions& o);

// Per dataset in both files: ||a - b|| / max(||a||, kTinyNorm) and
// max |a - b|, largest first (the first `top` rows; 0: all); datasets in
// one file only, shapes that differ, attributes of / and /meta that differ.
inline constexpr double kTinyNorm = 1e-30;
struct DiffOptions {
  std::string a, b;
  size_t top = 20;
  Format format = Format::table;
};
void diff(const DiffOptions& o);

// Every dataset's XXH3-64 (io::ckpt::dataset_checksum) against its xxh3
// attribute and its /meta/checksums entry; /meta's kind and format_version.
// Prints a line per dataset, then throws RankError naming the file and the
// first problem ("params/h.0.mlp.c_fc.weight: checksum mismatch (stored
// ..., computed ...)") when there is one.
struct VerifyOptions {
  std::string file;
};
void verify(const VerifyOptions& o);

}  // namespace meshlm::ckpt_tools
