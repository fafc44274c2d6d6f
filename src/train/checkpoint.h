// Checkpoints: the training state in one HDF5 file of logical tensors
// (docs/formats.md, "Checkpoints"), written and read by every rank together
// with parallel HDF5, so that any layout loads what any layout wrote.
//
// Who writes what. The elements of a rank's flat buffers are split over its
// DP group as ZeRO splits them (DP rank k writes the parameters and moments
// of its shard; under ZeRO 0 the same split of [0, n)), a tensor that tensor
// parallelism does not split is written by TP rank 0 alone, and the tied
// embedding by the first stage alone: every element of every dataset is
// written by exactly one rank, as a few boxes of the logical tensor
// (part_boxes), in one collective write per dataset.
//
// Saving, collective over the world:
//   1. rank 0 names a temporary file beside the checkpoint; every rank
//      creates it with MPI-IO and writes its boxes;
//   2. the file is closed and opened again; the ranks share the datasets
//      (largest first, to the least loaded rank), read each back whole and
//      hash it (XXH3-64), and write every checksum as attributes, with /meta;
//   3. rank 0 flushes the file to disk, renames it, then replaces `latest`
//      the same way, then removes checkpoints beyond checkpoint.keep_last.
// A rank killed at any moment leaves the previous checkpoint and `latest`
// as they were; its temporary file is removed by the next save.
//
// checkpoint.async: save() copies what the rank writes (the values of its
// write range and their moments) into a host snapshot, kept for the run
// (memory category checkpoint, made with the checkpointer), and returns; a background thread does
// steps 1-3 from it on a duplicate of the world communicator while training
// goes on. The next save() or finish() waits for it. HDF5 is entered by one
// thread at a time (io/h5.h, LibraryLock): the writer lets the main thread
// in between blocks of at most 16 MiB.
//
// Loading, collective: the file's /meta is checked against the run (the
// model, what trains, the data it counts windows of), every dataset the run
// needs is hashed again (shared as above) and compared with its checksum,
// then every rank reads the boxes of its own parts: its whole shard of the
// parameters and the moments of the elements it updates.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "comm/mpi_comm.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "io/tokens.h"
#include "mesh/mesh.h"
#include "train/engine.h"
#include "train/faults.h"
#include "train/run_config.h"

namespace meshlm {

// What a checkpoint holds besides the tensors and the optimizer's state.
struct TrainingState {
  int64_t step = 0;         // steps done, skipped ones included: training resumes at step + 1
  int64_t tokens_seen = 0;  // training tokens of those steps
  io::DataCursor cursor;    // where the next step's data starts
  int64_t skipped_steps = 0, overflow_steps = 0;
};

// Rank 0, before training: checkpoint.dir (set, or output.dir/checkpoints)
// can hold the checkpoints of any step, its `latest` (if any) is meshlm's
// (a regular file of one line naming a step_*.h5), and a fresh run
// (checkpoint.resume = none) without output.overwrite finds no checkpoint
// files (step_*.h5, `latest`) of an earlier run there to write over.
// RankError naming checkpoint.dir and the file otherwise.
void check_checkpoint_dir(const RunConfig& cfg);

class Checkpointer {
public:
  // Collective over mesh.world(). `engine` holds the state; its data loader
  // counts `windows_per_epoch` windows. All must outlive the checkpointer.
  // `faults`: where a test kills a rank inside a save (train/faults.h).
  Checkpointer(const RunConfig& cfg, const ProcessMesh& mesh, Engine& engine,
               uint64_t windows_per_epoch, SectionTimers& timers, debug::Faults faults = {});
  ~Checkpointer();

  // Collective: the checkpoint checkpoint.resume names, "" for a fresh
  // start (none; or auto where checkpoint.dir has no `latest`, which rank 0
  // says). CollectiveError naming the key when a named file is missing.
  std::string resume_path() const;

  // Collective: sets the engine's parameters, moments, AdamW step count and
  // loss scale from the checkpoint at `path` and returns the rest of the
  // state. CollectiveError naming the file and the dataset or key when the
  // file is not a checkpoint of this model, a checksum differs, or a
  // dataset is missing or of another shape.
  TrainingState load(const std::string& path);

  // Collective: only the LoRA adapters of the checkpoint at `path`
  // (finetune.adapters_from); the optimizer starts afresh.
  void load_adapters(const std::string& path);

  // Collective: writes the checkpoint of `state` (step_<step>.h5 in
  // checkpoint.dir), points `latest` at it and removes the old ones beyond
  // checkpoint.keep_last. Returns its path. Under checkpoint.async it
  // returns once the snapshot is taken and the write has begun; a write
  // still going on from the checkpoint before is waited for first.
  std::string save(const TrainingState& state);

  // Collective: waits for the background write, if any (checkpoint.async),
  // and says how it went. CollectiveError when it failed. Returns the
  // seconds waited.
  double finish();

  struct Job;            // one checkpoint being written (checkpoint.cpp)
  struct OptimizerMeta;  // the optimizer state of a save besides its moments (checkpoint.cpp)

private:
  void write(Job& job, MPI_Comm comm);  // collective over comm
  const RunConfig& cfg_;
  const ProcessMesh& mesh_;
  Engine& engine_;
  uint64_t windows_per_epoch_;
  SectionTimers& timers_;
  const debug::Faults faults_;
  std::string base_hash_;  // XXH3-128 of quant.base under LoRA (rank 0 computes it once)
  std::string hf_config_;  // /meta hf_config: load::kept_hf_config(quant.base)
  // checkpoint.async:
  std::unique_ptr<comm::OwnedComm> writer_comm_;  // the writer's duplicate of the world
  Buffer snapshot_;                                // the host snapshot, made with the checkpointer
  std::thread writer_;
  std::exception_ptr writer_error_;  // how the writer's last job ended
  int64_t writing_step_ = -1;        // the step it writes
  double writer_started_ = 0;        // now_seconds() when it began
  double lock_waited_at_start_ = 0;  // the main thread's LibraryLock::waited_seconds() then
};

}  // namespace meshlm
