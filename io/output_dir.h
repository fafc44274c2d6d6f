// output.dir holds one run at a time, and meshlm writes there only over what
// it owns.
//
// A run takes an advisory lock (flock) on <dir>/.meshlm.lock for its whole
// life; a second run into the same directory finds it held and stops. A
// directory that already holds a run log (<dir>/run.h5: a finished or killed
// run) is used again only with output.overwrite = true, and never when
// run.h5 is not recognisably a meshlm run log.
#pragma once

#include <string>

namespace meshlm::io {

// True when `path` is an HDF5 file with the root attributes format_version
// and config that every meshlm run log has.
bool is_run_log(const std::string& path);

// Checks, without writing anything, that a run may use `dir`: throws
// RankError naming output.dir when it exists and is not a directory, when
// another process holds its lock, when its run.h5 is not a meshlm run log,
// or when it holds a run log and `overwrite` is false.
void check_output_dir(const std::string& dir, bool overwrite);

// The run's hold on `dir`: creates it (and its parents), takes the lock and
// checks again (another run may have come in between); released by the
// destructor.
class OutputDirLock {
public:
  OutputDirLock(const std::string& dir, bool overwrite);
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

private:
  int fd_ = -1;
};

}  // namespace meshlm::io
