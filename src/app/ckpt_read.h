// What the `meshlm ckpt` tools share to read a checkpoint (docs/formats.md,
// "Checkpoints") serially on world rank 0: the file opened read-only with a
// clear error, a dataset's shape and type, its values a block of whole rows
// at a time (never the whole tensor: a 1.5B-parameter model's wte is 300 MiB
// and its moments twice that), attributes of any type as text, and the
// tables the tools print (aligned for people, tab-separated for scripts).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/h5.h"

namespace meshlm::ckpt_tools {

// ---------------------------------------------------------------------------
// Files and datasets
// ---------------------------------------------------------------------------

// Opens `path` read-only with the default (serial) driver. RankError naming
// the file when it is missing, not HDF5, or cannot be opened (truncated).
io::h5::File open_checkpoint(const std::string& path);

// One dataset as the tools see it. `path` has no leading '/'.
struct DatasetInfo {
  std::string path;
  std::vector<hsize_t> shape;  // empty for a scalar
  std::string dtype;           // "float32", "int64", "string", ...
  bool numeric = false;        // integer or float: the tools can read it as double
  size_t type_bytes = 0;
  uint64_t numel = 1;
  uint64_t bytes() const { return numel * type_bytes; }
};
DatasetInfo dataset_info(hid_t file, const std::string& path);

// "48x16", "64" (1-D), "scalar".
std::string shape_string(const std::vector<hsize_t>& shape);

// A numeric dataset's values, converted to double, one block of whole rows
// at a time: rows_per_block(shape) rows of at most io::ckpt::kReadBlockBytes
// of float32 (or one row). The block depends on the shape alone, so two
// readers of equally shaped datasets (diff) step through the same rows.
class BlockReader {
public:
  explicit BlockReader(hid_t dset);
  // The next block's values, row-major; empty once every row was read.
  std::span<const double> next();
  uint64_t total() const { return total_; }

private:
  hid_t dset_;
  bool is_float32_ = false;
  std::vector<hsize_t> shape_;
  hsize_t rows_ = 1, row_ = 1, per_block_ = 1, next_row_ = 0;
  uint64_t total_ = 0;
  std::vector<float> fbuf_;
  std::vector<double> dbuf_;
};

// ---------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------

struct AttrText {
  std::string name;
  std::string type;   // "string", "int64", "float64", "uint64", "float32[3]"
  std::string value;  // as text: a string's characters, a number in full
  bool is_string = false;
};
// Every attribute of `obj` in name order.
std::vector<AttrText> read_attrs(hid_t obj);

// 16 lowercase hex digits, as `xxhsum -H1` prints an XXH3-64.
std::string hex64(uint64_t v);

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

enum class Format { table, tsv };

// A number for a table: 6 significant digits, or every digit (round trip)
// for tsv.
std::string num(double v, Format f);

// Fixed columns: the header line starts with "# ", rows with two spaces, the
// first column left-aligned and the others right-aligned (table); or the
// same cells separated by tabs (tsv). No cell holds a space in either
// layout, so a row splits on whitespace.
class Table {
public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  size_t size() const { return rows_.size(); }
  void print(Format f) const;

private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace meshlm::ckpt_tools
