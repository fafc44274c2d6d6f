// Preemption: a batch system asks a job to stop with a signal some time
// before it kills it (SLURM: `--signal=USR1@120` or the SIGTERM of a
// preemption or `scancel`; PBS: SIGTERM before SIGKILL). While a
// StopSignals lives, SIGTERM and SIGUSR1 only set a flag; the training loop
// reads it after every step, agrees with the other ranks, writes a
// checkpoint and ends cleanly. SIGINT (Ctrl-C) and SIGHUP keep ending the
// process at once.
#pragma once

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
};

}  // namespace meshlm
