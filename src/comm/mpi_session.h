// MPI for the life of the program: MPI_Init when constructed, MPI_Finalize
// when destroyed (unless an error path already finalized or aborted, see
// comm/errors.h). main() holds one; nothing else calls MPI_Init.
#pragma once

#include <mpi.h>

#include <string>

namespace meshlm::comm {

// Before MPI_Init: a process started without a launcher (a singleton: `meshlm
// ckpt ...`, `meshlm plan ...` from a shell) runs Open MPI without the helper
// daemon it would otherwise fork (ess_singleton_isolated; meshlm never spawns
// processes). That start takes 0.13 s instead of 0.3 s and a third of the
// CPU, and the singleton's MPI_Finalize has no daemon to part from. Only
// Open MPI's singleton reads the variable, and a value already in the
// environment wins.
//
// Open MPI 4 gives every isolated singleton the same job id, and so the same
// session directory (<tmp>/ompi.<host>.<uid>/jf.0/1): one that finishes
// removes it under another that is starting or opening a file (MPI-IO keeps
// a segment there), and that one fails (orte_ess_init, MPI_File_open). So
// an isolated singleton also gets a session directory base of its own,
// through orte_tmpdir_base (private_singleton_session_base).
void prefer_isolated_singleton();

// An isolated Open MPI 4 singleton's own session directory base:
// "<TMPDIR or /tmp>/meshlm-mpi.tmp.<host>.<pid>.<16 hex>" (mode 0700), made
// once and named in OMPI_MCA_orte_tmpdir_base before MPI_Init; removed at
// exit, and, when a killed process left it, by the next singleton of this
// host. "" (and nothing set) when the process was started by a launcher
// (mpiexec, srun), when the environment names a base or turns the isolated
// singleton off, under another MPI, or when the directory cannot be made.
std::string private_singleton_session_base();

class MpiSession {
public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  MPI_Comm world() const { return MPI_COMM_WORLD; }
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }

private:
  int rank_ = 0, size_ = 1;
};

}  // namespace meshlm::comm
