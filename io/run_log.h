// The run log <dir>/run.h5: what a training run did, readable by h5py while
// the run goes on and after it dies.
//
//   /                      attributes: config (the resolved parameter file,
//                          INI text), format_version = 1; layout_choice
//                          (text) when parallel.layout = auto chose the
//                          layout: the planner's lines saying which and why
//   /resumed_at_steps      (k) int64    a resumed run only: the steps of the
//                          checkpoints it and the runs before it resumed from
//   /metrics/step          (n) int64    one row per append()
//   /metrics/loss          (n) float64
//   /metrics/lr            (n) float64
//   /metrics/grad_norm     (n) float64
//   /metrics/tokens_per_s  (n) float64
//   /metrics/val_step      (k) int64    one row per append_val() (evaluation)
//   /metrics/val_loss      (k) float64
//   /memory/<category>/{peak_bytes,current_bytes,predicted_bytes}
//                          (ranks) int64, one entry per rank in rank order (host)
//   /memory/process/{rss_bytes,rss_peak_bytes,pss_bytes}  (ranks) int64
//   /timing/<section>/seconds                            float64 scalars
//
// Unlike checkpoints, the log is written in place (no temporary name): a run
// that is killed must keep every row it logged, so each append() ends with a
// flush. Written by one rank only (the caller makes sure of it), with plain
// serial file access and HDF5's file locking on: to look at the log while
// the run goes on, open it without locking (h5py: h5py.File(path, "r",
// locking=False); h5dump: HDF5_USE_FILE_LOCKING=FALSE).
#pragma once

#include <cstdint>
#include <memory>
#include <array>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/timer.h"
#include "io/h5.h"
#include "io/output_dir.h"

namespace meshlm::io {

inline constexpr int kRunLogFormatVersion = 1;

class RunLog {
public:
  // Holds `dir` for the run (io/output_dir.h: created with its parents,
  // locked against a second run) and creates <dir>/run.h5. An old run log
  // there is replaced only when `overwrite`; anything else named run.h5
  // never. If the file cannot be created whole (a full disk), nothing of
  // it is left.
  //
  // A resumed run passes `resumed_at` >= 0, the step of its checkpoint: the
  // rows of the old <dir>/run.h5 (a run log of this format) with step <=
  // resumed_at come first in the new one, so that its metrics tell the
  // whole run across restarts; /resumed_at_steps lists the steps resumed
  // at, oldest first. An old log that cannot be read is
  // replaced without them, with a warning.
  RunLog(const std::string& dir, const std::string& resolved_config_ini, bool overwrite = false,
         int64_t resumed_at = -1);
  ~RunLog();  // closes; errors at this point are swallowed (call close() to see them)
  RunLog(RunLog&&) noexcept = default;
  RunLog& operator=(RunLog&&) noexcept = default;
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // The root attribute layout_choice (parallel.layout = auto).
  void write_layout_choice(const std::string& text);
  // One row of /metrics, flushed to disk before returning.
  void append(int64_t step, double loss, double lr, double grad_norm, double tokens_per_s);
  // One row of /metrics/val_step and val_loss (an evaluation after `step`
  // steps), flushed to disk before returning. A resumed run carries the old
  // log's rows with val_step <= resumed_at like the other metrics.
  void append_val(int64_t step, double val_loss);
  // Every rank's memory (see train/report.h: gather_memory): tracked bytes
  // per category (peak, current) beside the prediction, and the process
  // figures from /proc; entry r of each dataset is rank r.
  void write_memory(const std::vector<MemoryByCategory>& predicted,
                    const std::vector<MemoryByCategory>& current,
                    const std::vector<MemoryByCategory>& peak,
                    const std::vector<ProcessMemory>& process);
  // Every rank's process prediction against /proc (entry r is rank r):
  // memory/process/runtime_bytes (resident at start-up outside the tracked
  // buffers), predicted_peak_bytes (that plus the largest phase), error
  // ((predicted - VmHWM) / VmHWM), and per phase
  // memory/phases/<phase>/predicted_bytes and peak_bytes (host tracked total).
  void write_process_prediction(const std::vector<size_t>& runtime,
                                const std::vector<size_t>& predicted_peak,
                                const std::vector<double>& error,
                                const std::vector<std::array<size_t, kNumMemPhases>>& phase_predicted,
                                const std::vector<std::array<size_t, kNumMemPhases>>& phase_peak);
  // The nodes' memory: memory/process/runtime_pss_bytes and node (entry r is
  // rank r: the runtime's part in PSS, the node's index), and per node
  // (entry n is node n) memory/node/predicted_peak_bytes (the largest
  // phase's sum of runtime PSS + tracked total over its ranks) and
  // memory/node/pss_bytes (its ranks' PSS summed at the end of the run).
  void write_node_prediction(const std::vector<size_t>& runtime_pss, const std::vector<int>& node,
                             const std::vector<size_t>& node_predicted_peak,
                             const std::vector<size_t>& node_pss);
  // Seconds per section.
  void write_timing(const SectionTimers& timers);
  void close();

  const std::string& path() const { return path_; }
  int64_t rows() const { return rows_; }
  int64_t val_rows() const { return val_rows_; }
  // Rows of the old log the constructor carried over.
  int64_t carried_rows() const { return carried_; }

private:
  void require_open() const;

  std::unique_ptr<OutputDirLock> lock_;
  std::string path_;
  h5::File file_;
  h5::Dataset step_, loss_, lr_, grad_norm_, tokens_per_s_, val_step_, val_loss_;
  int64_t rows_ = 0, carried_ = 0, val_rows_ = 0;
};

}  // namespace meshlm::io
