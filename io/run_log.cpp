#include "io/run_log.h"

#include <algorithm>

#include <filesystem>
#include <type_traits>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

namespace meshlm::io {

namespace {

// Rows are appended one at a time; a chunk holds this many of them, so the
// file grows by a few KiB now and then rather than on every step.
constexpr hsize_t kRowsPerChunk = 512;

h5::Dataset create_column(hid_t file, const std::string& name, hid_t type) {
  hsize_t dims = 0, maxdims = H5S_UNLIMITED;
  h5::Dataspace space(H5Screate_simple(1, &dims, &maxdims));
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl, 1, &kRowsPerChunk);
  h5::PropList lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  return h5::Dataset(h5::check(H5Dcreate2(file, name.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT),
                               file, name, "cannot create dataset"));
}

// Writes `value` as row `row` of a column that has `row` rows so far.
void append_row(hid_t dset, hsize_t row, hid_t type, const void* value) {
  std::string name = h5::object_name(dset);
  hsize_t size = row + 1, one = 1;
  h5::check(H5Dset_extent(dset, &size), dset, name, "cannot extend dataset");
  h5::Dataspace fspace(H5Dget_space(dset));
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &row, nullptr, &one, nullptr);
  h5::Dataspace mspace(H5Screate_simple(1, &one, nullptr));
  h5::check(H5Dwrite(dset, type, mspace, fspace, H5P_DEFAULT, value), dset, name,
            "cannot append row " + std::to_string(row));
}

// The rows of an earlier run log's /metrics with step <= until, and its
// resumed_at_steps.
struct Carried {
  std::vector<int64_t> step;
  std::vector<double> loss, lr, grad_norm, tokens_per_s;
  std::vector<int64_t> val_step;  // evaluations (a log of a run before them has none)
  std::vector<double> val_loss;
  std::vector<int64_t> resumed_at;
};

Carried read_earlier(const std::string& path, hid_t fapl, int64_t until) {
  Carried c;
  h5::File f = h5::open_file(path, false, fapl);
  if (!h5::has_attr(f, "format_version") ||
      h5::read_scalar_attr<int32_t>(f, "format_version") != kRunLogFormatVersion)
    throw RankError(path + ": not a run log of format_version " +
                        std::to_string(kRunLogFormatVersion),
                    MESHLM_HERE);
  auto column = [&](const char* name, auto& out) {
    out = h5::read_dataset<typename std::decay_t<decltype(out)>::value_type>(
        f, std::string("metrics/") + name, nullptr);
  };
  column("step", c.step);
  column("loss", c.loss);
  column("lr", c.lr);
  column("grad_norm", c.grad_norm);
  column("tokens_per_s", c.tokens_per_s);
  const size_t n = c.step.size();
  if (c.loss.size() != n || c.lr.size() != n || c.grad_norm.size() != n ||
      c.tokens_per_s.size() != n)
    throw RankError(path + ": its /metrics columns differ in length", MESHLM_HERE);
  // Rows are in step order; those past the checkpoint were trained again.
  size_t keep = 0;
  while (keep < n && c.step[keep] <= until) ++keep;
  c.step.resize(keep);
  c.loss.resize(keep);
  c.lr.resize(keep);
  c.grad_norm.resize(keep);
  c.tokens_per_s.resize(keep);
  if (h5::exists(f, "metrics/val_step")) {
    column("val_step", c.val_step);
    column("val_loss", c.val_loss);
    if (c.val_loss.size() != c.val_step.size())
      throw RankError(path + ": its /metrics/val_step and val_loss differ in length", MESHLM_HERE);
    size_t kept = 0;
    while (kept < c.val_step.size() && c.val_step[kept] <= until) ++kept;
    c.val_step.resize(kept);
    c.val_loss.resize(kept);
  }
  if (h5::exists(f, "resumed_at_steps")) c.resumed_at = h5::read_dataset<int64_t>(f, "resumed_at_steps", nullptr);
  return c;
}

// Writes `values` as the first rows of an empty column.
template <typename T>
void write_rows(hid_t dset, hid_t type, const std::vector<T>& values) {
  if (values.empty()) return;
  const std::string name = h5::object_name(dset);
  hsize_t n = values.size();
  h5::check(H5Dset_extent(dset, &n), dset, name, "cannot extend dataset");
  h5::check(H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), dset, name,
            "cannot write the earlier run's rows");
}

}  // namespace

RunLog::RunLog(const std::string& dir, const std::string& resolved_config_ini, bool overwrite,
               int64_t resumed_at)
    : lock_(std::make_unique<OutputDirLock>(dir, overwrite)) {
  h5::LibraryLock library;  // a checkpoint may be written meanwhile (checkpoint.async)
  path_ = (std::filesystem::path(dir) / "run.h5").string();
  h5::PropList fapl(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
  // HDF5's lock on, except where the file system has none (Lustre without flock).
  H5Pset_file_locking(fapl, true, true);
#endif
  // A resumed run keeps what the earlier log says up to its checkpoint.
  Carried earlier;
  if (resumed_at >= 0 && std::filesystem::exists(path_)) {
    try {
      earlier = read_earlier(path_, fapl, resumed_at);
    } catch (const std::exception& e) {
      log::warn("the run log '{}' of the earlier run cannot be read ({}): the new one starts at "
                "step {}",
                path_, e.what(), resumed_at + 1);
      earlier = Carried{};
    }
  }
  try {
    file_ = h5::create_file(path_, fapl);
    h5::write_string_attr(file_, "config", resolved_config_ini);
    h5::write_scalar_attr<int32_t>(file_, "format_version", kRunLogFormatVersion);
    if (resumed_at >= 0) {
      earlier.resumed_at.push_back(resumed_at);
      h5::write_dataset(file_, "resumed_at_steps", earlier.resumed_at);
    }
    step_ = create_column(file_, "metrics/step", H5T_NATIVE_INT64);
    loss_ = create_column(file_, "metrics/loss", H5T_NATIVE_DOUBLE);
    lr_ = create_column(file_, "metrics/lr", H5T_NATIVE_DOUBLE);
    grad_norm_ = create_column(file_, "metrics/grad_norm", H5T_NATIVE_DOUBLE);
    tokens_per_s_ = create_column(file_, "metrics/tokens_per_s", H5T_NATIVE_DOUBLE);
    val_step_ = create_column(file_, "metrics/val_step", H5T_NATIVE_INT64);
    val_loss_ = create_column(file_, "metrics/val_loss", H5T_NATIVE_DOUBLE);
    write_rows(step_, H5T_NATIVE_INT64, earlier.step);
    write_rows(loss_, H5T_NATIVE_DOUBLE, earlier.loss);
    write_rows(lr_, H5T_NATIVE_DOUBLE, earlier.lr);
    write_rows(grad_norm_, H5T_NATIVE_DOUBLE, earlier.grad_norm);
    write_rows(tokens_per_s_, H5T_NATIVE_DOUBLE, earlier.tokens_per_s);
    write_rows(val_step_, H5T_NATIVE_INT64, earlier.val_step);
    write_rows(val_loss_, H5T_NATIVE_DOUBLE, earlier.val_loss);
    rows_ = carried_ = static_cast<int64_t>(earlier.step.size());
    val_rows_ = static_cast<int64_t>(earlier.val_step.size());
    h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
  } catch (...) {
    // Nothing half-made stays behind (a full disk at the start of a run).
    for (h5::Dataset* d : {&step_, &loss_, &lr_, &grad_norm_, &tokens_per_s_, &val_step_, &val_loss_})
      d->reset();
    file_.reset();
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    throw;
  }
}

RunLog::~RunLog() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; close() explicitly to see the error.
  }
}

void RunLog::require_open() const {
  if (!file_.valid()) throw RankError("run log '" + path_ + "' is closed", MESHLM_HERE);
}

void RunLog::append(int64_t step, double loss, double lr, double grad_norm,
                    double tokens_per_s) {
  h5::LibraryLock library;
  require_open();
  hsize_t row = static_cast<hsize_t>(rows_);
  append_row(step_, row, H5T_NATIVE_INT64, &step);
  append_row(loss_, row, H5T_NATIVE_DOUBLE, &loss);
  append_row(lr_, row, H5T_NATIVE_DOUBLE, &lr);
  append_row(grad_norm_, row, H5T_NATIVE_DOUBLE, &grad_norm);
  append_row(tokens_per_s_, row, H5T_NATIVE_DOUBLE, &tokens_per_s);
  ++rows_;
  // On disk now, so a run killed later still has this row.
  h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
}

void RunLog::append_val(int64_t step, double val_loss) {
  h5::LibraryLock library;
  require_open();
  const hsize_t row = static_cast<hsize_t>(val_rows_);
  append_row(val_step_, row, H5T_NATIVE_INT64, &step);
  append_row(val_loss_, row, H5T_NATIVE_DOUBLE, &val_loss);
  ++val_rows_;
  h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
}

void RunLog::write_memory(const std::vector<MemoryByCategory>& predicted,
                          const std::vector<MemoryByCategory>& current,
                          const std::vector<MemoryByCategory>& peak,
                          const std::vector<ProcessMemory>& process) {
  h5::LibraryLock library;
  require_open();
  auto column = [](const auto& rows, auto get) {
    std::vector<int64_t> v;
    for (const auto& r : rows) v.push_back(static_cast<int64_t>(get(r)));
    return v;
  };
  for (int i = 0; i < kNumMemCategories; ++i) {
    auto c = static_cast<MemCategory>(i);
    std::string group = std::string("memory/") + mem_category_name(c) + "/";
    auto cat = [c](const MemoryByCategory& m) { return at(m, c); };
    h5::write_dataset(file_, group + "peak_bytes", column(peak, cat));
    h5::write_dataset(file_, group + "current_bytes", column(current, cat));
    h5::write_dataset(file_, group + "predicted_bytes", column(predicted, cat));
  }
  h5::write_dataset(file_, "memory/process/rss_bytes",
                    column(process, [](const ProcessMemory& p) { return p.rss; }));
  h5::write_dataset(file_, "memory/process/rss_peak_bytes",
                    column(process, [](const ProcessMemory& p) { return p.rss_peak; }));
  h5::write_dataset(file_, "memory/process/pss_bytes",
                    column(process, [](const ProcessMemory& p) { return p.pss; }));
  h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
}

void RunLog::write_process_prediction(
    const std::vector<size_t>& runtime, const std::vector<size_t>& predicted_peak,
    const std::vector<double>& error,
    const std::vector<std::array<size_t, kNumMemPhases>>& phase_predicted,
    const std::vector<std::array<size_t, kNumMemPhases>>& phase_peak) {
  h5::LibraryLock library;
  require_open();
  auto ints = [](const std::vector<size_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); };
  h5::write_dataset(file_, "memory/process/runtime_bytes", ints(runtime));
  h5::write_dataset(file_, "memory/process/predicted_peak_bytes", ints(predicted_peak));
  h5::write_dataset(file_, "memory/process/error", error);
  for (int p = 0; p < kNumMemPhases; ++p) {
    std::string name = mem_phase_name(static_cast<MemPhase>(p));
    std::replace(name.begin(), name.end(), ' ', '_');
    std::replace(name.begin(), name.end(), '-', '_');
    std::vector<int64_t> pred, peak;
    for (const auto& r : phase_predicted) pred.push_back(static_cast<int64_t>(r[p]));
    for (const auto& r : phase_peak) peak.push_back(static_cast<int64_t>(r[p]));
    h5::write_dataset(file_, "memory/phases/" + name + "/predicted_bytes", pred);
    h5::write_dataset(file_, "memory/phases/" + name + "/peak_bytes", peak);
  }
  h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
}

void RunLog::write_layout_choice(const std::string& text) {
  h5::write_string_attr(file_, "layout_choice", text);
}

void RunLog::write_node_prediction(const std::vector<size_t>& runtime_pss,
                                   const std::vector<int>& node,
                                   const std::vector<size_t>& node_predicted_peak,
                                   const std::vector<size_t>& node_pss) {
  h5::LibraryLock library;
  require_open();
  auto ints = [](const auto& v) { return std::vector<int64_t>(v.begin(), v.end()); };
  h5::write_dataset(file_, "memory/process/runtime_pss_bytes", ints(runtime_pss));
  h5::write_dataset(file_, "memory/process/node", ints(node));
  h5::write_dataset(file_, "memory/node/predicted_peak_bytes", ints(node_predicted_peak));
  h5::write_dataset(file_, "memory/node/pss_bytes", ints(node_pss));
  h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
}

void RunLog::write_timing(const SectionTimers& timers) {
  h5::LibraryLock library;
  require_open();
  for (int i = 0; i < static_cast<int>(Section::count); ++i) {
    auto s = static_cast<Section>(i);
    h5::write_scalar<double>(file_, std::string("timing/") + section_name(s) + "/seconds",
                             timers.total(s));
  }
  h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "/", "cannot flush");
}

void RunLog::close() {
  h5::LibraryLock library;
  if (!file_.valid()) return;
  step_.close();
  loss_.close();
  lr_.close();
  grad_norm_.close();
  tokens_per_s_.close();
  val_step_.close();
  val_loss_.close();
  h5::close_file(file_, path_);
}

}  // namespace meshlm::io
