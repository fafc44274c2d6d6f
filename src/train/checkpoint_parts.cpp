#include "train/checkpoint_parts.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "io/h5.h"
#include "mesh/mesh.h"

namespace meshlm::checkpoint_detail {

// ---- who holds what ---------------------------------------------------------------

// The datasets of a model whose trained tensors are `full_table`, in the
// order every rank creates them.
std::vector<DatasetRef> datasets_of(const std::vector<ParamSpec>& full_table, bool lora,
                                    bool with_moments) {
  std::vector<DatasetRef> out;
  for (const ParamSpec& p : full_table)
    out.push_back({lora ? ck::lora_path(p.name) : ck::params_path(p.name), &p, DatasetRef::value});
  if (with_moments)
    for (const ParamSpec& p : full_table) {
      out.push_back({ck::optimizer_path(p.name, 'm'), &p, DatasetRef::m});
      out.push_back({ck::optimizer_path(p.name, 'v'), &p, DatasetRef::v});
    }
  return out;
}

std::vector<hsize_t> dims_of(const Shape& s) {
  std::vector<hsize_t> d;
  for (int i = 0; i < s.ndim; ++i) d.push_back(static_cast<hsize_t>(s.dims[i]));
  return d;
}

std::vector<ck::Box> to_boxes(const std::vector<TensorBox>& tb) {
  std::vector<ck::Box> out;
  for (const TensorBox& b : tb) {
    ck::Box x;
    for (size_t d = 0; d < b.start.size(); ++d) {
      x.start.push_back(static_cast<hsize_t>(b.start[d]));
      x.count.push_back(static_cast<hsize_t>(b.count[d]));
    }
    out.push_back(std::move(x));
  }
  return out;
}

RankView view_of(const RunConfig& cfg, const ProcessMesh& mesh, Engine& engine) {
  RankView r;
  const GPT& model = engine.model();
  r.full_table = trainable_table(cfg.model, {}, model.options());
  r.local_of.assign(r.full_table.size(), nullptr);
  for (const ParamSpec& p : model.table()) r.local_of[static_cast<size_t>(p.index)] = &p;
  r.n = model.num_params();
  const RankPlan plan = Engine::plan_of(cfg, mesh.coords());
  r.write = checkpoint_write_range(plan, zero_layout(cfg.model, plan));
  MESHLM_CHECK(engine.zero().stage() == 0 ||
                   r.write == std::make_pair(std::min(engine.zero().own_begin(), r.n),
                                             std::min(engine.zero().own_end(), r.n)),
               "the checkpoint's write range is the rank's ZeRO shard");
  const AdamW& opt = engine.optimizer();
  r.moments = {opt.begin(), std::min(opt.end(), r.n)};
  r.tp_rank = model.shard().tp_rank;
  r.tp_size = model.shard().tp_size;
  r.first_stage = model.shard().first_stage;
  r.lora = model.lora();
  return r;
}

// The elements [a, b) of local tensor `p` inside the flat range `range`.
std::pair<size_t, size_t> clip(const ParamSpec& p, std::pair<size_t, size_t> range) {
  const size_t lo = std::max(p.offset, range.first);
  const size_t hi = std::min(p.offset + p.numel(), range.second);
  if (lo >= hi) return {0, 0};
  return {lo - p.offset, hi - p.offset};
}

// ---- small collectives ------------------------------------------------------------

// Datasets shared out for hashing: the largest first, each to the rank with
// the fewest elements so far (the lowest on a tie); the same on every rank.
std::vector<int> hash_owners(const std::vector<uint64_t>& sizes, int ranks) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<uint64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(sizes.size(), 0);
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += sizes[i];
  }
  return owner;
}

// Collective: the XXH3-64 of each dataset of the file at `path`, which no
// rank has open for writing: every rank opens it alone, read-only (serial
// HDF5 reads straight into the hash's buffer, a few times faster than MPI-
// IO's independent reads), hashes its share, and all of them are shared.
// `between()` runs after every block read.
std::vector<uint64_t> checksums(MPI_Comm world, const std::string& path,
                                const std::vector<std::string>& names,
                                const std::vector<uint64_t>& sizes,
                                const std::function<void()>& between) {
  std::unique_ptr<comm::Communicator> c = comm::make_mpi_communicator(world);
  const std::vector<int> owner = hash_owners(sizes, c->size());
  std::vector<uint64_t> mine(names.size(), 0);
  try_all(world, "", [&] {
    if (std::find(owner.begin(), owner.end(), c->rank()) == owner.end()) return;
    h5::File f = h5::open_file(path);
    for (size_t i = 0; i < names.size(); ++i) {
      if (owner[i] != c->rank()) continue;
      h5::Dataset d = h5::open_dataset(f, names[i]);
      mine[i] = ck::dataset_checksum(d, H5P_DEFAULT, [&](uint64_t, uint64_t) {
        if (between) between();
      });
    }
  }, MESHLM_HERE);
  std::vector<uint64_t> all(names.size() * static_cast<size_t>(c->size()));
  c->all_gather(mine.data(), all.data(), names.size() * sizeof(uint64_t), DType::u8).wait();
  std::vector<uint64_t> out(names.size());
  for (size_t i = 0; i < names.size(); ++i)
    out[i] = all[static_cast<size_t>(owner[i]) * names.size() + i];
  return out;
}

float* buffer_of(Engine& e, DatasetRef::Kind kind) {
  switch (kind) {
    case DatasetRef::value: return e.model().params();
    case DatasetRef::m: return e.optimizer().m();
    case DatasetRef::v: return e.optimizer().v();
  }
  return nullptr;
}

}  // namespace meshlm::checkpoint_detail
