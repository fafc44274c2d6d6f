// The checkpoint file's names and checksums (docs/formats.md, "Checkpoints"),
// shared by the parallel writer and reader (train/checkpoint.h) and the
// `meshlm ckpt` tools, which read one file serially.
//
// Every dataset of a checkpoint holds a logical float32 tensor; its checksum
// is XXH3-64 (seed 0) of its values as little-endian float32, row-major: the
// same bytes `xxhsum -H1` hashes when the tensor is dumped raw. The checksum
// is stored twice: as the dataset's attribute "xxh3" (one tensor checks
// alone) and as the attribute of /meta/checksums named by the dataset's path.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/h5.h"

namespace meshlm::io::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kKind = "meshlm checkpoint";
inline constexpr const char* kChecksumAttr = "xxh3";
inline constexpr const char* kChecksumGroup = "meta/checksums";
// The newest complete checkpoint of a directory: a text file of one line.
inline constexpr const char* kLatestName = "latest";
// Datasets are hashed (and the tools read them) a block of whole rows of at
// most this many bytes at a time (or one row).
inline constexpr size_t kReadBlockBytes = size_t{4} << 20;

// Dataset paths (no leading '/'): "params/wte.weight",
// "lora/h.0.attn.c_attn.weight/A" for the table entry
// "h.0.attn.c_attn.weight.lora_A", "optimizer/<name>/m".
std::string params_path(const std::string& name);
// The adapter `name` (".lora_A" / ".lora_B" at its end) under /lora.
std::string lora_path(const std::string& name);
std::string optimizer_path(const std::string& name, char moment);  // 'm' or 'v'

// "step_00000100.h5"
std::string file_name_of_step(int64_t step);

// XXH3-64 of a float32 dataset's content, reading it a block of rows at a
// time through `dxpl` (H5P_DEFAULT for a serial file). `progress(done,
// total)` in elements after every block. RankError naming the dataset when
// it is not float32 or cannot be read.
uint64_t dataset_checksum(hid_t dset, hid_t dxpl = H5P_DEFAULT,
                          const std::function<void(uint64_t, uint64_t)>& progress = {});
// XXH3-64 of n floats in memory, for comparison with dataset_checksum.
uint64_t float_checksum(const float* data, size_t n);

// The model sizes a checkpoint's / and /meta carry (a full-training
// checkpoint is also a base file: quant.base reads them from /).
struct ModelSizes {
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, max_seq_len = 0;
};
// Writes what makes `file` a meshlm checkpoint: format_version and the model
// sizes on / and on /meta; on /meta kind, meshlm_version, `created` (UTC,
// ISO 8601), `config` (the resolved parameter file) and finetune_mode
// ("full" or "lora"). Returns /meta for the writer's own attributes (step,
// optimizer, data, layout: docs/formats.md). Every writer of checkpoints
// (training, `meshlm ckpt import`) goes through it.
h5::Group write_identity(hid_t file, const ModelSizes& sizes, const std::string& created,
                         const std::string& config, const std::string& finetune_mode);

// Every dataset below `loc`, as paths relative to the file's root without
// the leading '/', in HDF5's name order (groups walked depth-first).
std::vector<std::string> list_datasets(hid_t file);

// True when `path` is an HDF5 file whose /meta has the attribute kind ==
// kKind: a file meshlm may replace. Never throws.
bool is_checkpoint_file(const std::string& path);

// ---------------------------------------------------------------------------
// Parallel access (MPI-IO): every rank of `comm` calls these together
// ---------------------------------------------------------------------------

// Creates (truncates) or opens `path` for every rank of `comm` (collective).
h5::File create_parallel(const std::string& path, MPI_Comm comm);
h5::File open_parallel(const std::string& path, MPI_Comm comm, bool writable);

// Creates the float32 dataset `name` of shape `dims` (collective): stored
// contiguously, its space allocated at once and never filled (every element
// is written).
h5::Dataset create_tensor(hid_t file, const std::string& name, const std::vector<hsize_t>& dims);

// A box of a dataset: start[d] <= i_d < start[d] + count[d].
struct Box {
  std::vector<hsize_t> start, count;
};
// Writes (reads) the elements of the union of `boxes`, taken in the
// dataset's row-major order, from (into) the contiguous floats at `data`.
// The boxes must not overlap. With `collective`, every rank of the file's
// communicator calls it for the dataset, those with no boxes too.
void write_boxes(hid_t dset, const std::vector<Box>& boxes, const float* data, bool collective);
void read_boxes(hid_t dset, const std::vector<Box>& boxes, float* data, bool collective);

// write_boxes a block of whole rows at a time (at most kWriteBlockBytes, or
// one row), so that MPI-IO's buffers stay of a block's size; `between()`
// runs after each block. With `collective`, the blocks are of the whole
// tensor and every rank makes the same calls, waiting on the others for one
// block only. Without, each rank writes its own boxes alone, a block of
// their rows at a time: the boxes must each be a contiguous range of the
// file (as the parts of a tensor cut along its first dimension, or a range
// of its elements, are), in the file's order; a rank with none makes no
// call.
inline constexpr size_t kWriteBlockBytes = size_t{16} << 20;
void write_boxes_in_blocks(hid_t dset, const std::vector<Box>& boxes, const float* data,
                           const std::function<void()>& between = {}, bool collective = true);
// The same, the floats fetched a block at a time: source(offset, n) returns
// the n floats of the union's elements [offset, offset + n), valid until the
// next call (e.g. a block downloaded from a device into a staging buffer).
using FloatSource = std::function<const float*(size_t offset, size_t n)>;
void write_boxes_in_blocks(hid_t dset, const std::vector<Box>& boxes, const FloatSource& source,
                           const std::function<void()>& between = {}, bool collective = true);

}  // namespace meshlm::io::ckpt
