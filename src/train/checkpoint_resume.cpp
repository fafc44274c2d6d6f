// The checkpointer's resume: finding the checkpoint (checkpoint.resume),
// opening and verifying it against the run (its /meta, its checksums), and
// reading each rank's parts into the engine (train/checkpoint.h).
#include "train/checkpoint.h"
#include "train/checkpoint_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "core/files.h"
#include "core/timer.h"
#include "core/log.h"
#include "io/checkpoint_file.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "load/model_meta.h"
#include "train/loss_scaler.h"
#include "train/report.h"

namespace meshlm {

using namespace checkpoint_detail;  // and its h5 and ck
namespace fs = std::filesystem;

namespace {

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
  const std::string model = load::model_meta_difference(m, cfg.model, "in this run");
  if (!model.empty())
    throw RankError(fmt::format("checkpoint '{}' is of another model: {}", path, model), MESHLM_HERE);
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
  // The fp16 scale a run can reach (train/loss_scaler.h); 1 under fp32 and
  // bf16. Outside the range the first step would overflow or underflow.
  const double scale = m.run->loss_scale;
  if (!(scale >= LossScaler::kMin && scale <= LossScaler::kMax))
    throw RankError(fmt::format("checkpoint '{}': /meta loss_scale = {:g} lies outside the loss "
                                "scales of fp16 training, [2^-24, 2^32]",
                                path, scale),
                    MESHLM_HERE);
  if (m.run->loss_scale_good_steps > std::numeric_limits<int>::max())
    throw RankError(fmt::format("checkpoint '{}': /meta loss_scale_good_steps = {} is more than "
                                "the loss scaler counts ({})",
                                path, m.run->loss_scale_good_steps,
                                std::numeric_limits<int>::max()),
                    MESHLM_HERE);
  if (m.run->data_shuffle != cfg.data.shuffle)
    throw RankError(fmt::format("checkpoint '{}' was trained with data.shuffle = {}; this run has "
                                "{}",
                                path, m.run->data_shuffle, cfg.data.shuffle),
                    MESHLM_HERE);
}

}  // namespace

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
    // By name first: reading a FIFO would block.
    if (const std::string kind = non_regular_kind(latest.string()); !kind.empty())
      throw RankError("'" + latest.string() + "' is " + kind + ", not meshlm's file naming the "
                      "newest checkpoint",
                      MESHLM_HERE);
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    if (!in && !in.eof())
      throw RankError("cannot read '" + latest.string() + "'", MESHLM_HERE);
    // A line end of CRLF (the file edited or copied on Windows) is a line end.
    if (!name.empty() && name.back() == '\r') name.pop_back();
    // A NUL would end the name the file system sees before the name read.
    if (name.empty() || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
      throw RankError("'" + latest.string() + "' does not name a checkpoint file of its directory "
                          "(it holds '" + log::printable(name) + "')",
                      MESHLM_HERE);
    path = (fs::path(cfg_.checkpoint.resolved_dir) / name).string();
    // The name as text fit for a message: a NUL or a control byte is \xNN.
    if (!fs::exists(path, ec))
      throw RankError("'" + latest.string() + "' names '" + log::printable(name) +
                          "', which does not exist",
                      MESHLM_HERE);
  }, MESHLM_HERE);
  return comm::broadcast_string(*c, path);
}

namespace {

// Collective: opens a checkpoint, checks it against the run and its
// checksums (of the datasets `refs`), and that it holds no dataset outside
// `known` (every dataset a checkpoint of this run has); every failure a
// CollectiveError.
h5::File open_and_verify(const RunConfig& cfg, const ProcessMesh& mesh, const std::string& path,
                         const std::string& base_hash, bool adapters_only,
                         const std::vector<DatasetRef>& refs, const std::vector<DatasetRef>& known,
                         ck::Meta& meta) {
  MPI_Comm world = mesh.world();
  const std::string where = "checkpoint '" + path + "': ";
  try_all(world, "", [&] {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw RankError("no checkpoint '" + path + "'", MESHLM_HERE);
    // By name, before anything opens it: a FIFO would block every rank.
    if (const std::string kind = non_regular_kind(path); !kind.empty())
      throw RankError("checkpoint '" + path + "' is " + kind + ", not a checkpoint file",
                      MESHLM_HERE);
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
    // A dataset this model has no tensor for (another depth, another
    // model's file with this one's /meta) is no checkpoint of this run.
    std::set<std::string> ours;
    for (const DatasetRef& r : known) ours.insert(r.path);
    for (const std::string& name : ck::list_datasets(f))
      if (!ours.count(name))
        throw RankError("dataset /" + log::printable(name) + " is not one of this model's (" +
                            (cfg.finetune.mode == FinetuneMode::lora ? "finetune.mode = lora"
                                                                     : "finetune.mode = full") +
                            ")",
                        MESHLM_HERE);
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
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(out[i]))
          throw RankError(fmt::format("checkpoint '{}': dataset /{} holds {} at element {} of "
                                      "this rank's part",
                                      path, r.path, out[i], first + i),
                          MESHLM_HERE);
        // A second moment is a mean of squares: a negative one would make
        // AdamW's sqrt(v) a NaN steps later, blamed on training.
        if (r.kind == DatasetRef::v && out[i] < 0)
          throw RankError(fmt::format("checkpoint '{}': dataset /{} holds {} at element {} of "
                                      "this rank's part; AdamW's second moment is never negative",
                                      path, r.path, out[i], first + i),
                          MESHLM_HERE);
      }
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
  h5::File f = open_and_verify(cfg_, mesh_, path, base_hash_, false, refs, refs, meta);
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
  h5::File f = open_and_verify(cfg_, mesh_, path, base_hash_, true, refs,
                               datasets_of(v.full_table, v.lora, /*with_moments=*/true), meta);
  try_all(mesh_.world(), "finetune.adapters_from: ", [&] { read_parts(engine_, v, f, refs, path); },
          MESHLM_HERE);
  log::info("# finetune.adapters_from: the adapters of step {} loaded and verified; the optimizer "
            "starts afresh",
            meta.step);
}

}  // namespace meshlm
