// The parts of a checkpoint each rank holds and the collectives around
// them, shared by the save (train/checkpoint.cpp) and the resume
// (train/checkpoint_resume.cpp): which datasets a model has, this rank's
// view of them (its part of each logical tensor, the flat elements it writes
// and whose moments it holds), the checksums shared out over the ranks, and
// the host side of a backend's buffers. Internal to the checkpointer.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint_file.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "model/param_table.h"
#include "ops/kernels.h"
#include "plan/memory.h"
#include "train/engine.h"
#include "train/run_config.h"

namespace meshlm {
class ProcessMesh;
}

namespace meshlm::checkpoint_detail {

namespace h5 = io::h5;
namespace ck = io::ckpt;

// One dataset of the checkpoint: a trained tensor's values or one of its moments.
struct DatasetRef {
  std::string path;             // "params/wte.weight", "optimizer/wte.weight/m", ...
  const ParamSpec* full;        // its entry in the whole model's table
  enum Kind { value, m, v } kind;
};

// The datasets of a model whose trained tensors are `full_table`, in the
// order every rank creates them.
std::vector<DatasetRef> datasets_of(const std::vector<ParamSpec>& full_table, bool lora,
                                    bool with_moments);

std::vector<hsize_t> dims_of(const Shape& s);
std::vector<io::ckpt::Box> to_boxes(const std::vector<TensorBox>& tb);

// This rank's view of the model in the file: its part of each logical
// tensor, which elements of its flat buffers it writes, and which moments
// it holds.
struct RankView {
  std::vector<ParamSpec> full_table;       // the whole model's trained tensors
  std::vector<const ParamSpec*> local_of;  // per full-table index: this rank's entry, or null
  size_t n = 0;                            // elements of the rank's table
  std::pair<size_t, size_t> write;         // flat elements whose values it writes
  std::pair<size_t, size_t> moments;       // flat elements whose moments it holds
  int tp_rank = 0, tp_size = 1;
  bool first_stage = true;
  bool lora = false;
};
RankView view_of(const RunConfig& cfg, const ProcessMesh& mesh, Engine& engine);

// The elements [a, b) of local tensor `p` inside the flat range `range`.
std::pair<size_t, size_t> clip(const ParamSpec& p, std::pair<size_t, size_t> range);

// Datasets shared out for hashing: the largest first, each to the rank with
// the fewest elements so far (the lowest on a tie); the same on every rank.
std::vector<int> hash_owners(const std::vector<uint64_t>& sizes, int ranks);

// Collective: the XXH3-64 of each dataset of the file at `path`, which no
// rank has open for writing: every rank opens it alone, read-only (serial
// HDF5 reads straight into the hash's buffer, a few times faster than MPI-
// IO's independent reads), hashes its share, and all of them are shared.
// `between()` runs after every block read.
std::vector<uint64_t> checksums(MPI_Comm world, const std::string& path,
                                const std::vector<std::string>& names,
                                const std::vector<uint64_t>& sizes,
                                const std::function<void()>& between = {});

// Floats of the backend's memory as host memory: in place on the CPU (or
// when `host` says they are host memory), else through a staging copy.
class HostFloats {
public:
  explicit HostFloats(const ops::Kernels& k, bool host = false)
      : k_(k), host_(host || k.device() == Device::cpu) {}
  const float* read(const float* src, size_t n) {
    if (host_) return src;
    staging_.resize(n);
    k_.download(staging_.data(), src, n * sizeof(float));
    return staging_.data();
  }
  float* target(float* dst, size_t n) {
    dst_ = dst;
    n_ = n;
    if (host_) return dst;
    staging_.resize(n);
    return staging_.data();
  }
  void commit() {
    if (!host_ && n_ > 0) k_.upload(dst_, staging_.data(), n_ * sizeof(float));
  }

private:
  const ops::Kernels& k_;
  bool host_;
  std::vector<float> staging_;
  float* dst_ = nullptr;
  size_t n_ = 0;
};

// The engine's flat buffer that a dataset of `kind` is read from / written to.
float* buffer_of(Engine& e, DatasetRef::Kind kind);

}  // namespace meshlm::checkpoint_detail
