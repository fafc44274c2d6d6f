// Preemption: a batch system asks a job to stop with a signal some time
// before it kills it (SLURM: `--signal=USR1@120` or the SIGTERM of a
// preemption or `scancel`; PBS: SIGTERM before SIGKILL). While a
// StopSignals lives, SIGTERM and SIGUSR1 only set a flag; the training loop
// reads it after every step, agrees with the other ranks, writes a
// checkpoint and ends cleanly. SIGINT (Ctrl-C) and SIGHUP keep ending the
// process at once.
//
// A launcher that aborts a job (one rank failed) also sends SIGTERM to the
// others and may exit before they are gone; such a rank, waiting in a
// collective with a dead one, would never end. So once a stop signal has
// come, a watchdog thread ends the process (removing its temporary files,
// exit status 143) as soon as its parent process is gone.
#pragma once

#include <atomic>
#include <thread>

namespace meshlm {

class StopSignals {
public:
  StopSignals();   // installs the handlers (one StopSignals at a time)
  ~StopSignals();  // restores what was there before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received so far (SIGTERM or SIGUSR1), 0 when none.
  static int received();
  // "SIGTERM", "SIGUSR1", or "signal N".
  static const char* name(int sig);

private:
  std::atomic<bool> done_{false};
  std::thread watchdog_;
};

}  // namespace meshlm
