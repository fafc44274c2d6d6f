// runtime.stall_timeout_s: a rank that makes no progress for that long ends
// the job, naming what it waited for. A rank stopped by SIGSTOP, a frozen
// node or a lost message leaves the others blocked in MPI for ever, where a
// batch system would only end the job at its time limit.
//
// Progress is core/heartbeat.h: every completed message or collective, the
// end of every step, every block of a checkpoint written. While armed, a
// thread of each rank looks at it every period (an eighth of the bound, 50
// ms to 1 s); past the bound it prints one line and calls MPI_Abort on the
// world (exit status kStallExitCode). The line says what the rank waits in
// (which operation, for which rank or over which ranks), and what the other
// ranks of its node were doing: each rank's thread stamps a slot of a
// node-shared table (an MPI-3 shared window) with the time it last ran, its
// last progress and the rank it waits for, so a rank that has stopped
// running (SIGSTOP, a frozen process) is named as such, and a rank busy
// outside communication for long (compute, I/O) too. Ranks of other nodes
// are known only by what this rank waits for.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <vector>

namespace meshlm::comm {

// MPI_Abort's error code, the job's exit status under mpiexec, on a stall.
inline constexpr int kStallExitCode = 3;

class StallWatchdog {
public:
  // timeout_s <= 0: off (no table, no thread). Otherwise collective over
  // `host` (the ranks sharing this machine's memory; the table), with its
  // thread started but not armed.
  StallWatchdog(MPI_Comm world, MPI_Comm host, double timeout_s);
  ~StallWatchdog();  // collective over `host` when on (the table's window)
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  // From now on the calling thread's waits are the ones reported, and no
  // progress for the bound ends the job. disarm() stops that (arm() again
  // restarts the clock).
  void arm();
  void disarm();
  bool on() const { return impl_ != nullptr; }

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

// Called by the communicators' waits (comm/mpi_comm.cpp): the watched thread
// waits in `op` over the world ranks `members`, for members[peer] (peer -1:
// all of them, a collective). `members` lives as long as the wait.
void note_wait(const char* op, const std::vector<int>* members, int peer);
void note_wait_done();

// What a stall does before it ends the job, besides the line and MPI_Abort:
// `action` (an NCCL communicator's ncclCommAbort, so that its kernels let
// the device go), registered under `key` until forget_on_stall(key). Any
// thread; the actions run on the watchdog's thread.
void on_stall(const void* key, std::function<void()> action);
void forget_on_stall(const void* key);

}  // namespace meshlm::comm
