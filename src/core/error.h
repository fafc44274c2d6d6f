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
// The classes are plain C++ and live here, at the bottom of the layers; the
// collective half of the contract (check_all, try_all, fatal_all, fatal_one)
// talks to MPI and lives in comm/errors.h.
//
// Messages name the parameter key or the file for users; the file:line of the
// throw site is added for developers.
#pragma once

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

}  // namespace meshlm

// Internal invariant: throws RankError with the condition's text.
#define MESHLM_CHECK(cond, msg)                                                          \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw ::meshlm::RankError(std::string("check failed: " #cond ": ") + (msg),       \
                                __FILE__, __LINE__);                                     \
  } while (0)
