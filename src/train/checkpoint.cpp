// The checkpointer's save: a job taken on the main thread (the state, the
// snapshot of the buffers under checkpoint.async), the parallel write of
// every rank's parts, the checksums, /meta, the rename and `latest`, and the
// retention of checkpoint.keep. The resume is train/checkpoint_resume.cpp;
// who holds what, train/checkpoint_parts.h.
#include "train/checkpoint.h"
#include "train/checkpoint_parts.h"

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
#include "load/base_source.h"
#include "load/model_meta.h"
#include "model/param_table.h"
#include "plan/memory.h"
#include "train/report.h"

namespace meshlm {

using namespace checkpoint_detail;  // and its h5 and ck
namespace fs = std::filesystem;

// ---- /meta -----------------------------------------------------------------------

// The optimizer's state besides its moments, as it was at the save (a member
// of Checkpointer::Job: outside the anonymous namespace).
struct Checkpointer::OptimizerMeta {
  int64_t adamw_step = 0;
  double loss_scale = 1;
  int64_t loss_scale_good_steps = 0;
};
using OptimizerMeta = Checkpointer::OptimizerMeta;

namespace {

// The /meta of a save (collective: every rank writes the same values).
ck::Meta meta_of(const RunConfig& cfg, const TrainingState& st, const OptimizerMeta& opt,
                 uint64_t windows_per_epoch, const std::string& base_hash,
                 const std::string& created, const std::string& hf_config) {
  ck::Meta m;
  load::set_model_meta(m, cfg.model);
  m.hf_config = hf_config;
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
      if (mesh.rank() == 0) base_hash_ = load::files_hash(load::base_files(cfg.quant.base));
    }, MESHLM_HERE);
    base_hash_ = comm::broadcast_string(*c, base_hash_);
  }
  // What an export of the model writes back of its Hugging Face config.json
  // (the base's token ids and context), read once by rank 0.
  if (!cfg.quant.base.empty() && cfg.quant.base != "init") {
    std::unique_ptr<comm::Communicator> c = comm::make_mpi_communicator(mesh.world());
    try_all(mesh.world(), "quant.base: ", [&] {
      if (mesh.rank() == 0) hf_config_ = load::kept_hf_config(cfg.quant.base);
    }, MESHLM_HERE);
    hf_config_ = comm::broadcast_string(*c, hf_config_);
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

// The names meshlm gives its checkpoint files.
const std::regex& step_file_name() {
  static const std::regex kName(R"(step_(\d{8,})\.h5)");
  return kName;
}

// checkpoint.keep_last: the `keep` newest step_*.h5 of dir stay; older ones
// are removed when they are meshlm checkpoints, never `current` (rank 0).
void keep_newest(const std::string& dir, int keep, const std::string& current) {
  const std::regex& kName = step_file_name();
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

void check_checkpoint_dir(const RunConfig& cfg) {
  const std::string& dir = cfg.checkpoint.resolved_dir;
  const std::string key = cfg.checkpoint.dir.empty()
                              ? std::string("checkpoint.dir (output.dir/checkpoints)")
                              : std::string("checkpoint.dir");
  auto fail = [&](const std::string& what) {
    throw RankError(key + ": " + what, MESHLM_HERE);
  };
  if (const std::string why = unwritable_dir_reason(dir); !why.empty())
    fail("'" + dir + "' " + why);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;  // made at the first save
  // `latest` is replaced at every save: it must be meshlm's, one line naming
  // a checkpoint file of the directory (a rename leaves no other content).
  const std::string latest = (fs::path(dir) / ck::kLatestName).string();
  const bool has_latest = fs::exists(fs::symlink_status(latest, ec));
  if (has_latest) {
    if (const std::string kind = non_regular_kind(latest); !kind.empty())
      fail("'" + latest + "' is " + kind + "; meshlm names its newest checkpoint in a file of that "
           "name (move it, or choose another checkpoint.dir)");
    std::ifstream in(latest, std::ios::binary);
    std::string text(256, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    std::string line = text;
    if (!line.empty() && line.back() == '\n') line.pop_back();
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!std::regex_match(line, step_file_name()))
      fail("'" + latest + "' is not meshlm's (it holds '" + log::printable(line, 64) +
           "', not the name of a checkpoint file): meshlm will not replace it (move it, or "
           "choose another checkpoint.dir)");
  }
  // A fresh run would write its step files over those of the run that left
  // them, and move that run's `latest` back: refused unless asked for.
  if (cfg.checkpoint.resume != "none" || cfg.output.overwrite) return;
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, step_file_name())) found.push_back(name);
  }
  if (found.empty() && !has_latest) return;
  std::sort(found.begin(), found.end());
  std::string list = has_latest ? std::string(ck::kLatestName) : std::string();
  for (size_t i = 0; i < found.size() && i < 3; ++i) list += (list.empty() ? "" : ", ") + found[i];
  if (found.size() > 3) list += fmt::format(" and {} more", found.size() - 3);
  fail("'" + dir + "' holds the checkpoints of an earlier run (" + list + "), which a fresh run "
       "(checkpoint.resume = none) would write over; continue that run with checkpoint.resume = "
       "auto, replace them with output.overwrite = true, or choose another checkpoint.dir");
}

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
                              job.created, hf_config_));
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
