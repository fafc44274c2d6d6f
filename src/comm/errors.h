// The collective half of the error contract (core/error.h): how one rank's
// failure becomes every rank's error, and how a job ends on either kind.
//
//  * check_all / try_all: collective checks. Every rank of the communicator
//    enters; if any rank failed, every rank throws the same CollectiveError
//    carrying the lowest failing rank's message.
//  * fatal_all: the answer to a CollectiveError. Rank 0 prints, every rank
//    finalizes MPI and exits 1.
//  * fatal_one: the answer to anything else. This rank prints its number and
//    aborts the job (abort_job: MPI_Abort), so no other rank waits in a
//    collective; a job of one process just exits 1.
#pragma once

#include <mpi.h>

#include <exception>
#include <optional>
#include <string>

#include "core/error.h"

namespace meshlm {

// Collective: every rank of `comm` calls it. The lowest rank of `comm` where
// `ok` is false, with its `msg`, on every rank; nullopt when `ok` everywhere.
struct RankMessage {
  int rank = 0;
  std::string text;
};
std::optional<RankMessage> first_failure(MPI_Comm comm, bool ok, const std::string& msg);

// Collective: every rank of `comm` calls it. If `ok` is false on any rank, the
// message of the lowest failing rank (prefixed with that rank's number when it
// is not rank 0) is thrown as a CollectiveError on every rank.
void check_all(MPI_Comm comm, bool ok, const std::string& msg, const char* file, int line);

// Collective: runs `fn` on every rank of `comm`; if it throws on any rank,
// every rank throws one CollectiveError with the lowest failing rank's
// message, prefixed with `context` (e.g. the parameter key: "data.path: ").
template <typename F>
void try_all(MPI_Comm comm, const std::string& context, F&& fn, const char* file, int line) {
  bool ok = true;
  std::string msg;
  try {
    fn();
  } catch (const std::exception& e) {
    ok = false;
    msg = context + e.what();
  }
  check_all(comm, ok, msg, file, line);
}

// Collective over `comm`: rank 0 prints "ERROR: msg", all ranks finalize MPI
// and exit with status 1.
[[noreturn]] void fatal_all(MPI_Comm comm, const std::string& msg, const char* file, int line);

// Any one rank: prints "ERROR on rank R: msg" and aborts the whole job (a
// job of one process exits 1, without MPI_Abort's banner or any cleanup).
[[noreturn]] void fatal_one(const std::string& msg, const char* file, int line);

// MPI_Abort(comm, code), with a backstop: if MPI_Abort has not ended this
// process after kAbortGraceSeconds (a launcher that never answers), the
// process exits with `code` by itself, and the launcher, seeing a rank gone
// without MPI_Finalize, ends the rest of the job.
inline constexpr int kAbortGraceSeconds = 10;
[[noreturn]] void abort_job(MPI_Comm comm, int code);

}  // namespace meshlm
