#include "io/output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "io/h5.h"

namespace meshlm::io {

namespace fs = std::filesystem;

namespace {
constexpr const char* kLockName = ".meshlm.lock";

[[noreturn]] void fail(const std::string& dir, const std::string& why) {
  throw RankError("output.dir '" + dir + "' " + why, MESHLM_HERE);
}

// Whether another process holds the lock of an existing directory (tried and
// released at once; nothing is created).
bool locked_by_another(const std::string& dir) {
  const std::string lock = (fs::path(dir) / kLockName).string();
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

void check_contents(const std::string& dir, bool overwrite) {
  const std::string log = (fs::path(dir) / "run.h5").string();
  std::error_code ec;
  if (!fs::exists(log, ec)) return;
  if (!is_run_log(log))
    fail(dir, "holds " + log + ", which is not a meshlm run log; meshlm will not replace it "
              "(move it, or choose another output.dir)");
  if (!overwrite)
    fail(dir, "holds the run log of an earlier run (run.h5); set output.overwrite = true to "
              "replace it, or choose another output.dir");
}
}  // namespace

bool is_run_log(const std::string& path) {
  if (!non_regular_kind(path).empty() || !h5::is_hdf5_file(path)) return false;
  try {
    h5::File f = h5::open_file(path);
    return h5::has_attr(f, "format_version") && h5::has_attr(f, "config");
  } catch (const std::exception&) {
    return false;
  }
}

void check_output_dir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (const std::string kind = non_regular_kind(dir); !kind.empty() && kind != "a directory")
      fail(dir, "cannot be used: it is " + kind);
    return;
  }
  if (!fs::is_directory(dir, ec)) fail(dir, "exists and is not a directory");
  if (locked_by_another(dir))
    fail(dir, "is in use by another meshlm run (it holds " + std::string(kLockName) + ")");
  check_contents(dir, overwrite);
}

OutputDirLock::OutputDirLock(const std::string& dir, bool overwrite) {
  check_output_dir(dir, overwrite);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot be created: " + ec.message());
  const std::string lock = (fs::path(dir) / kLockName).string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(dir, "cannot hold its lock file " + lock + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK) fail(dir, "is in use by another meshlm run (it holds " + lock + ")");
    // A file system without flock: go on, as HDF5 does.
  }
  check_contents(dir, overwrite);  // a run may have finished there in between
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace meshlm::io
