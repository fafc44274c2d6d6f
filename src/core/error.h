// Errors with the two MPI contracts of an HPC program.
//
//  * CollectiveError: thrown where every rank of the job sees the same failure
//    (the same parameter file, a check_all() that every rank entered). The
//    top level answers it with fatal_all(): rank 0 prints, every rank calls
//    MPI_Finalize and exits 1. Nobody hangs, nobody prints the message 8 times.
//  * RankError (and any other exception): this rank alone may have failed.
//    The top level answers it with fatal_one(): the rank prints its number and
//    the message and calls MPI_Abort, which takes the whole job down.
//
// Messages name the parameter key or the file for users; the file:line of the
// throw site is added for developers.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace meshlm {

class Error : public std::runtime_error {
public:
  Error(const std::string& msg, const char* file, int line)
      : std::runtime_error(msg), file_(file), line_(line) {}
  const char* file() const { return file_; }
  int line() const { return line_; }

private:
  const char* file_;
  int line_;
};

// Every rank throws the same CollectiveError at the same point.
class CollectiveError : public Error {
public:
  using Error::Error;
};

// This rank alone failed (a file it could not read, an invariant it broke).
class RankError : public Error {
public:
  using Error::Error;
};

#define MESHLM_HERE __FILE__, __LINE__

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

// Any one rank: prints "ERROR on rank R: msg" and aborts the whole job.
[[noreturn]] void fatal_one(const std::string& msg, const char* file, int line);

}  // namespace meshlm

// Internal invariant: throws RankError with the condition's text.
#define MESHLM_CHECK(cond, msg)                                                          \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw ::meshlm::RankError(std::string("check failed: " #cond ": ") + (msg),       \
                                __FILE__, __LINE__);                                     \
  } while (0)
