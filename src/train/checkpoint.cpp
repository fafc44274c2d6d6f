#include "train/checkpoint.h"

#include <fmt/format.h>

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <regex>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "core/heartbeat.h"
#include "core/timer.h"
#include "core/files.h"
#include "core/log.h"
#include "io/checkpoint_file.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "io/hash.h"
#include "model/param_table.h"
#include "plan/memory.h"
#include "train/report.h"

namespace meshlm {

namespace fs = std::filesystem;
namespace h5 = io::h5;
namespace ck = io::ckpt;

namespace {

// ---- who holds what ---------------------------------------------------------------

// One dataset of the checkpoint: a trained tensor's values or one of its moments.
struct DatasetRef {
  std::string path;             // "params/wte.weight", "optimizer/wte.weight/m", ...
  const ParamSpec* full;        // its entry in the whole model's table
  enum Kind { value, m, v } kind;
};

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
                                const std::function<void()>& between = {}) {
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

// ---- the host side of the engine's buffers ----------------------------------------

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

float* buffer_of(Engine& e, DatasetRef::Kind kind) {
  switch (kind) {
    case DatasetRef::value: return e.model().params();
    case DatasetRef::m: return e.optimizer().m();
    case DatasetRef::v: return e.optimizer().v();
  }
  return nullptr;
}

// ---- /meta -----------------------------------------------------------------------


// The optimizer's state besides its moments, as it was at the save.
struct OptimizerMeta {
  int64_t adamw_step = 0;
  double loss_scale = 1;
  int64_t loss_scale_good_steps = 0;
};

// The /meta of a save (collective: every rank writes the same values).
ck::Meta meta_of(const RunConfig& cfg, const TrainingState& st, const OptimizerMeta& opt,
                 uint64_t windows_per_epoch, const std::string& base_hash,
                 const std::string& created) {
  const GPTConfig& g = cfg.model;
  ck::Meta m;
  m.sizes = {g.n_layer, g.n_head, g.n_embd, g.vocab_size, g.max_seq_len};
  m.created = created;
  m.config = cfg.resolved;
  if (cfg.finetune.mode == FinetuneMode::lora)
    m.lora = ck::LoraMeta{cfg.finetune.lora_rank, cfg.finetune.lora_alpha,
                          slots_text(cfg.finetune.lora_targets), name_of(cfg.quant.type),
                          cfg.quant.base, base_hash};
  m.step = st.step;
  m.tokens_seen = st.tokens_seen;
  m.adamw_step = opt.adamw_step;
  ck::RunMeta& r = m.run.emplace();
  r.skipped_steps = st.skipped_steps;
  r.overflow_steps = st.overflow_steps;
  r.loss_scale = opt.loss_scale;
  r.loss_scale_good_steps = opt.loss_scale_good_steps;
  r.data_epoch = st.cursor.epoch;
  r.data_position = st.cursor.position;
  r.data_windows_per_epoch = windows_per_epoch;
  r.data_seq_len = cfg.train.seq_len;
  r.data_shuffle = cfg.data.shuffle;
  r.data_path = cfg.data.path;
  m.seed = cfg.train.seed;
  const ParallelConfig& p = cfg.parallel;
  r.layout_dp = p.dp;
  r.layout_tp = p.tp;
  r.layout_pp = p.pp;
  r.layout_zero_stage = p.zero_stage;
  r.layout_micro_batches = p.micro_batches;
  return m;
}

// The state a resume takes from /meta.
TrainingState state_of(const ck::Meta& m) {
  TrainingState st;
  st.step = m.step;
  st.tokens_seen = m.tokens_seen;
  if (m.run) {
    st.skipped_steps = m.run->skipped_steps;
    st.overflow_steps = m.run->overflow_steps;
    st.cursor.epoch = m.run->data_epoch;
    st.cursor.position = m.run->data_position;
  }
  return st;
}

// The checkpoint must be of this run's model and of what it trains.
void check_meta(const ck::Meta& m, const RunConfig& cfg, const std::string& path,
                const std::string& base_hash, bool adapters_only) {
  const GPTConfig& g = cfg.model;
  const ck::ModelSizes& z = m.sizes;
  const std::pair<const char*, std::pair<int64_t, int64_t>> model[] = {
      {"model.n_layer", {z.n_layer, g.n_layer}},   {"model.n_head", {z.n_head, g.n_head}},
      {"model.n_embd", {z.n_embd, g.n_embd}},      {"model.vocab_size", {z.vocab_size, g.vocab_size}},
      {"model.max_seq_len", {z.max_seq_len, g.max_seq_len}}};
  for (const auto& [key, v] : model)
    if (v.first != v.second)
      throw RankError(fmt::format("checkpoint '{}' is of another model: {} = {} there, {} in this "
                                  "run",
                                  path, key, v.first, v.second),
                      MESHLM_HERE);
  const bool lora = cfg.finetune.mode == FinetuneMode::lora;
  if (m.lora.has_value() != lora)
    throw RankError(fmt::format("checkpoint '{}' was written by finetune.mode = {}; this run has "
                                "finetune.mode = {}",
                                path, m.lora ? "lora" : "full", lora ? "lora" : "full"),
                    MESHLM_HERE);
  if (lora) {
    const ck::LoraMeta& l = *m.lora;
    if (l.rank != cfg.finetune.lora_rank)
      throw RankError(fmt::format("checkpoint '{}': finetune.lora_rank = {} there, {} in this run",
                                  path, l.rank, cfg.finetune.lora_rank),
                      MESHLM_HERE);
    if (l.targets != slots_text(cfg.finetune.lora_targets))
      throw RankError(fmt::format("checkpoint '{}': finetune.lora_targets = {} there, {} in this "
                                  "run",
                                  path, l.targets, slots_text(cfg.finetune.lora_targets)),
                      MESHLM_HERE);
    if (l.alpha != cfg.finetune.lora_alpha)
      throw RankError(fmt::format("checkpoint '{}': finetune.lora_alpha = {} there, {} in this "
                                  "run",
                                  path, l.alpha, cfg.finetune.lora_alpha),
                      MESHLM_HERE);
    if (l.base_hash != base_hash)
      throw RankError(fmt::format("checkpoint '{}' was trained on another frozen base (XXH3-128 "
                                  "'{}' there, '{}' for quant.base = '{}')",
                                  path, l.base_hash, base_hash, cfg.quant.base),
                      MESHLM_HERE);
  }
  if (adapters_only) return;
  if (!m.run)
    throw RankError(fmt::format("checkpoint '{}' holds tensors but no training state (no /meta "
                                "loss_scale: a `meshlm ckpt import`?); start from it with "
                                "quant.base or finetune.adapters_from instead of "
                                "checkpoint.resume",
                                path),
                    MESHLM_HERE);
  if (m.run->data_seq_len != cfg.train.seq_len)
    throw RankError(fmt::format("checkpoint '{}': its data cursor counts windows of model.seq_len "
                                "= {}; this run has {}",
                                path, m.run->data_seq_len, cfg.train.seq_len),
                    MESHLM_HERE);
  if (m.run->data_shuffle != cfg.data.shuffle)
    throw RankError(fmt::format("checkpoint '{}' was trained with data.shuffle = {}; this run has "
                                "{}",
                                path, m.run->data_shuffle, cfg.data.shuffle),
                    MESHLM_HERE);
}

}  // namespace

// ---- Checkpointer -------------------------------------------------------------------

Checkpointer::Checkpointer(const RunConfig& cfg, const ProcessMesh& mesh, Engine& engine,
                           uint64_t windows_per_epoch, SectionTimers& timers,
                           debug::Faults faults)
    : cfg_(cfg), mesh_(mesh), engine_(engine), windows_per_epoch_(windows_per_epoch),
      timers_(timers), faults_(std::move(faults)) {
  // The frozen base's identity, once (rank 0 hashes the file, as the
  // quantized cache does).
  if (cfg.finetune.mode == FinetuneMode::lora && !cfg.quant.base.empty() && cfg.quant.base != "init") {
    std::unique_ptr<comm::Communicator> c = comm::make_mpi_communicator(mesh.world());
    try_all(mesh.world(), "quant.base: ", [&] {
      if (mesh.rank() == 0) base_hash_ = io::xxh3_128_file(cfg.quant.base);
    }, MESHLM_HERE);
    base_hash_ = comm::broadcast_string(*c, base_hash_);
  }
  if (cfg.checkpoint.async) {
    if (!comm::threads_may_call_mpi())
      throw CollectiveError("checkpoint.async = true needs MPI_THREAD_MULTIPLE (a writer thread "
                            "beside training), which this MPI library does not provide: set "
                            "checkpoint.async = false",
                            MESHLM_HERE);
    writer_comm_ = std::make_unique<comm::OwnedComm>(mesh.world());
    // The snapshot, made (and its pages touched) now rather than in the
    // first checkpoint's stall.
    const size_t floats =
        checkpoint_snapshot_numel(cfg.model, Engine::plan_of(cfg, mesh.coords()));
    if (floats > 0)
      snapshot_ = Buffer(floats * sizeof(float), MemCategory::checkpoint, "checkpoint snapshot",
                         Device::cpu);
  }
}

Checkpointer::~Checkpointer() {
  // A run that ends by an error: its background write, if any, still ends
  // (every rank's writer goes on alone) before the state it reads is freed.
  if (writer_.joinable()) writer_.join();
}

std::string Checkpointer::resume_path() const {
  const std::string& r = cfg_.checkpoint.resume;
  if (r == "none") return "";
  std::unique_ptr<comm::Communicator> c = comm::make_mpi_communicator(mesh_.world());
  std::string path;
  try_all(mesh_.world(), "checkpoint.resume: ", [&] {
    if (mesh_.rank() != 0) return;
    std::error_code ec;
    if (r != "auto") {
      if (!fs::exists(r, ec)) throw RankError("no checkpoint '" + r + "'", MESHLM_HERE);
      path = r;
      return;
    }
    const fs::path latest = fs::path(cfg_.checkpoint.resolved_dir) / ck::kLatestName;
    if (!fs::exists(latest, ec)) {
      log::info("# checkpoint: no checkpoint in {} (no file '{}'), starting fresh",
                cfg_.checkpoint.resolved_dir, latest.string());
      return;
    }
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    if (!in && !in.eof())
      throw RankError("cannot read '" + latest.string() + "'", MESHLM_HERE);
    if (name.empty() || name.find('/') != std::string::npos)
      throw RankError("'" + latest.string() + "' does not name a checkpoint file of its directory",
                      MESHLM_HERE);
    path = (fs::path(cfg_.checkpoint.resolved_dir) / name).string();
    if (!fs::exists(path, ec))
      throw RankError("'" + latest.string() + "' names '" + name + "', which does not exist",
                      MESHLM_HERE);
  }, MESHLM_HERE);
  return comm::broadcast_string(*c, path);
}

namespace {

// Collective: opens a checkpoint, checks it against the run and its
// checksums (of the datasets `refs`); every failure a CollectiveError.
h5::File open_and_verify(const RunConfig& cfg, const ProcessMesh& mesh, const std::string& path,
                         const std::string& base_hash, bool adapters_only,
                         const std::vector<DatasetRef>& refs, ck::Meta& meta) {
  MPI_Comm world = mesh.world();
  const std::string where = "checkpoint '" + path + "': ";
  try_all(world, "", [&] {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw RankError("no checkpoint '" + path + "'", MESHLM_HERE);
    if (!h5::is_hdf5_file(path))
      throw RankError("'" + path + "' is not an HDF5 file (a meshlm checkpoint is one)", MESHLM_HERE);
  }, MESHLM_HERE);
  h5::File f;
  try_all(world, "", [&] { f = ck::open_parallel(path, world, false); }, MESHLM_HERE);
  try_all(world, "", [&] {
    meta = ck::read_meta(f, path);
    check_meta(meta, cfg, path, base_hash, adapters_only);
  }, MESHLM_HERE);
  // Every dataset the run needs is there, float32, of the logical shape, and
  // carries its checksum twice.
  std::vector<std::string> names;
  std::vector<uint64_t> sizes, stored;
  try_all(world, where, [&] {
    h5::Group sums = h5::exists(f, ck::kChecksumGroup)
                         ? h5::open_group(f, ck::kChecksumGroup)
                         : h5::Group();
    for (const DatasetRef& r : refs) {
      if (!h5::exists(f, r.path)) throw RankError("no dataset /" + r.path, MESHLM_HERE);
      h5::Dataset d = h5::open_dataset(f, r.path);
      const std::vector<hsize_t> want = dims_of(r.full->full_shape), got = h5::shape(d);
      if (got != want) {
        auto text = [](const std::vector<hsize_t>& v) {
          std::string s = "(";
          for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
          return s + ")";
        };
        throw RankError("dataset /" + r.path + " has shape " + text(got) + "; this model's is " +
                            text(want),
                        MESHLM_HERE);
      }
      if (!h5::has_attr(d, ck::kChecksumAttr))
        throw RankError("dataset /" + r.path + " has no checksum (attribute xxh3)", MESHLM_HERE);
      const uint64_t own = h5::read_scalar_attr<uint64_t>(d, ck::kChecksumAttr);
      if (!sums.valid() || !h5::has_attr(sums, r.path))
        throw RankError("/meta/checksums has no entry for " + r.path, MESHLM_HERE);
      const uint64_t listed = h5::read_scalar_attr<uint64_t>(sums, r.path);
      if (own != listed)
        throw RankError(fmt::format("dataset /{}: its checksum attribute {:016x} differs from "
                                    "/meta/checksums' {:016x}",
                                    r.path, own, listed),
                        MESHLM_HERE);
      names.push_back(r.path);
      sizes.push_back(r.full->numel());
      stored.push_back(own);
    }
  }, MESHLM_HERE);
  const std::vector<uint64_t> got = checksums(world, path, names, sizes);
  for (size_t i = 0; i < names.size(); ++i)
    if (got[i] != stored[i])
      throw CollectiveError(fmt::format("{}dataset /{}: checksum mismatch (stored {:016x}, "
                                        "computed {:016x}): the file is damaged",
                                        where, names[i], stored[i], got[i]),
                            MESHLM_HERE);
  return f;
}

// Collective: reads this rank's part of every dataset of `refs` into the
// engine's buffers (independent reads).
void read_parts(Engine& engine, const RankView& v, hid_t f, const std::vector<DatasetRef>& refs,
                const std::string& path) {
  HostFloats host(engine.model().kernels());
  for (const DatasetRef& r : refs) {
    const ParamSpec* p = v.local_of[static_cast<size_t>(r.full->index)];
    if (p == nullptr) continue;
    // Values: the whole part (a tied copy and replicated tensors too);
    // moments: those of the elements the rank updates.
    std::pair<size_t, size_t> range{0, p->numel()};
    size_t base = 0;
    if (r.kind != DatasetRef::value) {
      range = clip(*p, v.moments);
      base = v.moments.first;
    }
    if (range.first >= range.second) continue;
    h5::Dataset d = h5::open_dataset(f, r.path);
    // A slice of at most a write block at a time (through a staging buffer
    // of that size on a device).
    constexpr size_t kSlice = ck::kWriteBlockBytes / sizeof(float);
    for (size_t first = range.first; first < range.second; first += kSlice) {
      const size_t last = std::min(range.second, first + kSlice), n = last - first;
      float* dst = buffer_of(engine, r.kind) + p->offset + first - base;
      float* out = host.target(dst, n);
      ck::read_boxes(d, to_boxes(part_boxes(*p, v.tp_rank, v.tp_size, first, last)), out,
                     /*collective=*/false);
      for (size_t i = 0; i < n; ++i)
        if (!std::isfinite(out[i]))
          throw RankError(fmt::format("checkpoint '{}': dataset /{} holds {} at element {} of "
                                      "this rank's part",
                                      path, r.path, out[i], first + i),
                          MESHLM_HERE);
      host.commit();
    }
  }
}

}  // namespace

TrainingState Checkpointer::load(const std::string& path) {
  ScopedTimer timer(timers_, Section::checkpoint);
  const double t0 = now_seconds();
  const RankView v = view_of(cfg_, mesh_, engine_);
  const std::vector<DatasetRef> refs = datasets_of(v.full_table, v.lora, /*with_moments=*/true);
  log::info("# checkpoint: resuming from {}", path);
  ck::Meta meta;
  h5::File f = open_and_verify(cfg_, mesh_, path, base_hash_, false, refs, meta);
  const ck::RunMeta& run = *meta.run;  // open_and_verify checked it is there
  if (run.data_windows_per_epoch != windows_per_epoch_)
    throw CollectiveError(fmt::format("checkpoint '{}' counts {} windows per epoch of its data; "
                                      "data.path '{}' has {}: not the same token file",
                                      path, run.data_windows_per_epoch, cfg_.data.path,
                                      windows_per_epoch_),
                          MESHLM_HERE);
  const int64_t seed = meta.seed.value_or(cfg_.train.seed);
  if (seed != cfg_.train.seed && cfg_.data.shuffle)
    log::warn("checkpoint '{}' was trained with train.seed = {}, this run has {}: the data order "
              "from here on differs from the original run's",
              path, seed, cfg_.train.seed);
  try_all(mesh_.world(), "", [&] { read_parts(engine_, v, f, refs, path); }, MESHLM_HERE);
  f.close();
  engine_.optimizer().set_steps_taken(meta.adamw_step);
  engine_.loss_scaler().restore(run.loss_scale, static_cast<int>(run.loss_scale_good_steps));
  log::info("# checkpoint: step {} ({} tokens seen, written by dp {} tp {} pp {} ZeRO {}) loaded "
            "and verified in {:.2f} s",
            meta.step, meta.tokens_seen, run.layout_dp, run.layout_tp, run.layout_pp,
            run.layout_zero_stage, now_seconds() - t0);
  return state_of(meta);
}

void Checkpointer::load_adapters(const std::string& path) {
  ScopedTimer timer(timers_, Section::checkpoint);
  const RankView v = view_of(cfg_, mesh_, engine_);
  const std::vector<DatasetRef> refs = datasets_of(v.full_table, v.lora, /*with_moments=*/false);
  log::info("# finetune.adapters_from: {}", path);
  ck::Meta meta;
  h5::File f = open_and_verify(cfg_, mesh_, path, base_hash_, true, refs, meta);
  try_all(mesh_.world(), "finetune.adapters_from: ", [&] { read_parts(engine_, v, f, refs, path); },
          MESHLM_HERE);
  log::info("# finetune.adapters_from: the adapters of step {} loaded and verified; the optimizer "
            "starts afresh",
            meta.step);
}

// Everything one save needs, taken on the main thread: where it goes, the
// state besides the tensors, and where the rank's floats are read from.
struct Checkpointer::Job {
  TrainingState state;
  OptimizerMeta opt;
  std::string path, tmp, created;
  std::unique_ptr<h5::AtomicWrite> out;  // rank 0: the temporary file and its rename
  RankView view;
  std::vector<DatasetRef> refs;  // point into view.full_table
  uint64_t bytes = 0;            // of all the datasets
  // Per DatasetRef::Kind: the floats and the flat element of the rank's
  // table the first of them is; in the engine's memory, or in the snapshot.
  const float* data[3] = {};
  size_t begin[3] = {};
  bool host = false;  // data[] is host memory (the snapshot)
  bool async = false;
};

// A full disk met in the middle of a parallel HDF5 write is an error on one
// rank inside collective calls that the others are still making (a hang,
// not an error). So the space is checked first, on rank 0, where an error
// is still everyone's: the checkpoint's tensors, HDF5's metadata (about 2
// KiB a dataset, measured: 630 bytes) and 1 MiB to spare. Another writer
// filling the disk during the write is not covered: runtime.stall_timeout_s
// ends such a job, and the checkpoint before stays whole either way.
void check_free_space(const std::string& dir, uint64_t bytes, size_t datasets, int64_t step) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return;  // unknown: HDF5 will say
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  const uint64_t need = bytes + bytes / 64 + (uint64_t{2} << 10) * datasets + (uint64_t{1} << 20);
  if (free_bytes < need)
    throw RankError(fmt::format("'{}' has {} free on its file system; the checkpoint of step {} "
                                "needs about {} (its tensors and HDF5's metadata): nothing written, "
                                "the checkpoints already there are untouched. Free space (or set "
                                "checkpoint.dir elsewhere) and resume with checkpoint.resume = auto",
                                dir, format_bytes(static_cast<double>(free_bytes)), step,
                                format_bytes(static_cast<double>(need))),
                    MESHLM_HERE);
}

std::string Checkpointer::save(const TrainingState& st) {
  ScopedTimer timer(timers_, Section::checkpoint);
  const double t0 = now_seconds();
  const double waited = finish();
  MPI_Comm world = mesh_.world();
  std::unique_ptr<comm::Communicator> c = comm::make_mpi_communicator(world);
  const int rank = mesh_.rank();
  const std::string dir = cfg_.checkpoint.resolved_dir;

  auto job = std::make_unique<Job>();
  job->state = st;
  job->opt = {engine_.optimizer().steps_taken(), engine_.loss_scaler().scale(),
              engine_.loss_scaler().good_in_a_row()};
  job->path = (fs::path(dir) / ck::file_name_of_step(st.step)).string();
  job->view = view_of(cfg_, mesh_, engine_);
  job->refs = datasets_of(job->view.full_table, job->view.lora, /*with_moments=*/true);
  for (const DatasetRef& r : job->refs) job->bytes += r.full->numel() * sizeof(float);
  job->async = cfg_.checkpoint.async;

  // The temporary file, named by rank 0.
  try_all(world, "checkpoint.dir: ", [&] {
    if (rank != 0) return;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw RankError("cannot create directory '" + dir + "': " + ec.message(), MESHLM_HERE);
    h5::LibraryLock lock;
    if (fs::exists(job->path, ec) && !ck::is_checkpoint_file(job->path))
      throw RankError("'" + job->path + "' exists and is not a meshlm checkpoint: meshlm will not "
                      "write over it",
                      MESHLM_HERE);
    remove_stale_temp_files(job->path);
    check_free_space(dir, job->bytes, job->refs.size(), st.step);
    job->out = std::make_unique<h5::AtomicWrite>(job->path);
    job->tmp = job->out->tmp_path();
    job->created = utc_timestamp();
  }, MESHLM_HERE);
  job->tmp = comm::broadcast_string(*c, job->tmp);
  job->created = comm::broadcast_string(*c, job->created);

  // Where the floats come from: the engine's buffers ...
  const RankView& v = job->view;
  const std::pair<size_t, size_t> both{std::max(v.write.first, v.moments.first),
                                       std::min(v.write.second, v.moments.second)};
  job->data[DatasetRef::value] = engine_.model().params();
  job->data[DatasetRef::m] = engine_.optimizer().m();
  job->data[DatasetRef::v] = engine_.optimizer().v();
  job->begin[DatasetRef::m] = job->begin[DatasetRef::v] = v.moments.first;
  if (!job->async) {
    log::info("# checkpoint: writing step {} to {} ({})", st.step, job->path,
              format_bytes(static_cast<double>(job->bytes)));
    write(*job, world);
    return job->path;
  }

  // ... or, under checkpoint.async, a copy of what this rank writes: the
  // values of its write range, then the m and v of the part it keeps.
  const size_t nw = v.write.second - v.write.first;
  const size_t nb = both.second > both.first ? both.second - both.first : 0;
  const size_t floats = checkpoint_snapshot_numel(cfg_.model, Engine::plan_of(cfg_, mesh_.coords()));
  MESHLM_CHECK(floats == nw + 2 * nb && snapshot_.bytes() == floats * sizeof(float),
               "the snapshot holds what the memory model books");
  float* snap = snapshot_.as<float>();
  const ops::Kernels& k = engine_.model().kernels();
  auto copy = [&](float* dst, const float* src, size_t n) {
    if (n == 0) return;
    if (k.device() == Device::cpu)
      std::copy(src, src + n, dst);
    else
      k.download(dst, src, n * sizeof(float));
  };
  copy(snap, job->data[DatasetRef::value] + v.write.first, nw);
  copy(snap + nw, job->data[DatasetRef::m] + both.first - v.moments.first, nb);
  copy(snap + nw + nb, job->data[DatasetRef::v] + both.first - v.moments.first, nb);
  job->data[DatasetRef::value] = snap;
  job->data[DatasetRef::m] = snap + nw;
  job->data[DatasetRef::v] = snap + nw + nb;
  job->begin[DatasetRef::value] = v.write.first;
  job->begin[DatasetRef::m] = job->begin[DatasetRef::v] = both.first;
  job->host = true;

  const double copied = now_seconds() - t0 - waited;
  log::info("# checkpoint: step {} copied to the host snapshot ({} on this rank) in {:.3f} s; "
            "training waited {:.3f} s in all ({:.3f} s for the checkpoint before). Writing {} to "
            "{} in the background",
            st.step, format_bytes(static_cast<double>(floats * sizeof(float))), copied,
            now_seconds() - t0, waited, format_bytes(static_cast<double>(job->bytes)), job->path);
  const std::string path = job->path;
  writing_step_ = st.step;
  writer_started_ = now_seconds();
  lock_waited_at_start_ = h5::LibraryLock::waited_seconds();
  MPI_Comm wc = writer_comm_->get();
  writer_error_ = nullptr;
  writer_ = std::thread([this, wc, job = std::move(job)] {
    try {
      write(*job, wc);
    } catch (...) {
      writer_error_ = std::current_exception();
    }
  });
  return path;
}

double Checkpointer::finish() {
  if (!writer_.joinable()) return 0;
  const double t0 = now_seconds();
  writer_.join();
  const double waited = now_seconds() - t0;
  const std::exception_ptr error = std::exchange(writer_error_, nullptr);
  // The writers agree on failure (their checks are collective); this says
  // so on the main threads too.
  try_all(mesh_.world(), "", [&] {
    if (error) std::rethrow_exception(error);
  }, MESHLM_HERE);
  log::info("# checkpoint: the background write of step {} ended {:.2f} s after it began; "
            "training waited {:.3f} s for it at the end and {:.3f} s for HDF5 meanwhile "
            "(rank 0)",
            writing_step_, now_seconds() - writer_started_, waited,
            h5::LibraryLock::waited_seconds() - lock_waited_at_start_);
  return waited;
}

namespace {

// `latest` in dir names the file `path` from now on: written under a
// temporary name, made durable, renamed over the old one (rank 0).
void point_latest_at(const std::string& dir, const std::string& path) {
  const std::string latest = (fs::path(dir) / ck::kLatestName).string();
  const std::string latest_tmp = temp_name_for(latest);
  {
    std::ofstream o(latest_tmp, std::ios::trunc);
    o << fs::path(path).filename().string() << "\n";
    o.close();
    if (!o) {
      std::error_code ec;
      fs::remove(latest_tmp, ec);
      throw RankError("cannot write '" + latest_tmp + "'", MESHLM_HERE);
    }
  }
  sync_file_and_dir(latest_tmp);
  std::error_code ec;
  fs::rename(latest_tmp, latest, ec);
  if (ec) {
    fs::remove(latest_tmp, ec);
    throw RankError("cannot rename '" + latest_tmp + "' to '" + latest + "'", MESHLM_HERE);
  }
  sync_file_and_dir(latest);
}

// checkpoint.keep_last: the `keep` newest step_*.h5 of dir stay; older ones
// are removed when they are meshlm checkpoints, never `current` (rank 0).
void keep_newest(const std::string& dir, int keep, const std::string& current) {
  static const std::regex kName(R"(step_(\d{8,})\.h5)");
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::smatch mt;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, mt, kName)) found.emplace_back(std::stoll(mt[1]), e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep); i < found.size(); ++i) {
    const std::string old = found[i].second.string();
    h5::LibraryLock library;
    if (old == current || !ck::is_checkpoint_file(old)) continue;
    fs::remove(old, ec);
  }
}

}  // namespace

void Checkpointer::write(Job& job, MPI_Comm comm) {
  const double t0 = now_seconds();
  std::unique_ptr<comm::Communicator> c = comm::make_mpi_communicator(comm);
  const int rank = c->rank();
  const int64_t step = job.state.step;
  const RankView& v = job.view;
  const std::vector<DatasetRef>& refs = job.refs;
  // HDF5, one thread at a time: a background writer lets the main thread in
  // between blocks.
  std::unique_ptr<h5::LibraryLock> lock = std::make_unique<h5::LibraryLock>();
  auto between = [&] {
    heartbeat::beat();
    lock->yield();
  };

  // Every rank writes its boxes of every dataset. The disk starts taking
  // the file while it is written and hashed (rank 0's node).
  HostFloats host(engine_.model().kernels(), job.host);
  std::optional<WriteBack> flush;
  try_all(comm, "checkpoint: ", [&] {
    h5::File f = ck::create_parallel(job.tmp, comm);
    if (rank == 0) flush.emplace(job.tmp);
    faults_.in_checkpoint(step, "create");
    size_t written = 0;
    for (const DatasetRef& r : refs) {
      if (++written == refs.size() / 2) faults_.in_checkpoint(step, "tensors");
      h5::Dataset d = ck::create_tensor(f, r.path, dims_of(r.full->full_shape));
      const ParamSpec* p = v.local_of[static_cast<size_t>(r.full->index)];
      std::vector<ck::Box> boxes;
      const float* data = nullptr;  // the part, in the backend's memory
      const bool writer = p != nullptr && (p->tp_dim >= 0 || v.tp_rank == 0) &&
                          (p->tied == TiedGroup::none || v.first_stage);
      if (writer) {
        std::pair<size_t, size_t> range = clip(*p, v.write);
        if (r.kind != DatasetRef::value)
          range = clip(*p, {std::max(v.write.first, v.moments.first),
                            std::min(v.write.second, v.moments.second)});
        if (range.first < range.second) {
          boxes = to_boxes(part_boxes(*p, v.tp_rank, v.tp_size, range.first, range.second));
          data = job.data[r.kind] + p->offset + range.first - job.begin[r.kind];
        }
      }
      // A rank's part is one or a few contiguous ranges of the file, written
      // alone, unless tensor parallelism cuts the tensor's rows (then the
      // ranks' strided parts go together, collectively).
      const bool strided = r.full->tp_dim >= 1 && v.tp_size > 1;
      // A block at a time (from a device: through a staging buffer of a block).
      ck::write_boxes_in_blocks(
          d, boxes, [&](size_t offset, size_t n) { return host.read(data + offset, n); }, between,
          /*collective=*/strided);
    }
    h5::close_file(f, job.tmp);
  }, MESHLM_HERE);

  const double t_data = now_seconds();
  // Read back, hashed, and the checksums and /meta written.
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  for (const DatasetRef& r : refs) {
    names.push_back(r.path);
    sizes.push_back(r.full->numel());
  }
  faults_.in_checkpoint(step, "checksums");
  const std::vector<uint64_t> sums = checksums(comm, job.tmp, names, sizes, between);
  h5::File f;
  try_all(comm, "checkpoint: ", [&] { f = ck::open_parallel(job.tmp, comm, true); }, MESHLM_HERE);
  try_all(comm, "checkpoint: ", [&] {
    {
      h5::Group group = h5::require_group(f, ck::kChecksumGroup);
      for (size_t i = 0; i < names.size(); ++i) {
        h5::Dataset d = h5::open_dataset(f, names[i]);
        h5::write_scalar_attr<uint64_t>(d, ck::kChecksumAttr, sums[i]);
        h5::write_scalar_attr<uint64_t>(group, names[i], sums[i]);
      }
    }
    ck::write_meta(f, meta_of(cfg_, job.state, job.opt, windows_per_epoch_, base_hash_,
                              job.created));
    h5::close_file(f, job.tmp);
  }, MESHLM_HERE);
  lock.reset();  // no HDF5 while the file is flushed to disk
  flush.reset();
  const double t_hashed = now_seconds();

  // Made durable and visible, `latest` moved, old ones removed (rank 0).
  const std::string dir = cfg_.checkpoint.resolved_dir;
  try_all(comm, "checkpoint: ", [&] {
    faults_.in_checkpoint(step, "rename");
    if (rank != 0) return;
    job.out->commit();
    faults_.in_checkpoint(step, "latest");
    point_latest_at(dir, job.path);
    if (cfg_.checkpoint.keep_last > 0) keep_newest(dir, cfg_.checkpoint.keep_last, job.path);
  }, MESHLM_HERE);
  const double dt = now_seconds() - t0;
  log::info("# checkpoint: step {} -> {} | {} in {:.2f} s ({}/s){}: data {:.2f} s, read back "
            "and hashed {:.2f} s, on disk and renamed {:.2f} s | checksums of {} datasets verified",
            step, job.path, format_bytes(static_cast<double>(job.bytes)), dt,
            format_bytes(static_cast<double>(job.bytes) / std::max(dt, 1e-9)),
            job.async ? " in the background" : "", t_data - t0, t_hashed - t_data,
            now_seconds() - t_hashed, names.size());
}

}  // namespace meshlm
