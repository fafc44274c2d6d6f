#include "core/files.h"

#include "core/error.h"

#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <random>
#include <string_view>

namespace meshlm {

namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) {
    std::error_code e;
    const bool same = fs::equivalent(a, b, e);
    return !e && same;
  }
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ea), ea);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return !ea && !eb && ca == cb;
}

std::string non_regular_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return "";
    if (errno == ELOOP) return "a symbolic link loop";
    return std::string("a path the system cannot resolve (") + std::strerror(errno) + ")";
  }
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  return "something that is not a regular file";
}

std::string unwritable_dir_reason(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec);
  if (ec) return "cannot be resolved (" + ec.message() + ")";
  // The deepest part of the path that exists.
  fs::path existing = p;
  while (!existing.empty() && !fs::exists(fs::symlink_status(existing, ec))) {
    if (existing == existing.parent_path()) break;
    existing = existing.parent_path();
  }
  const std::string kind = non_regular_kind(existing.string());
  if (kind.empty() && !fs::exists(existing, ec))
    return existing == p ? "is a broken symbolic link"
                         : "is below '" + existing.string() + "', a broken symbolic link";
  if (kind != "a directory") {
    const std::string what = kind.empty() ? "a regular file" : kind;
    if (existing == p) return "is " + what;
    return "is below '" + existing.string() + "', which is " + what;
  }
  // A directory made and removed where the run would make its own.
  std::string probe = (existing / ".meshlm-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr)
    return "cannot be written: making a directory in '" + existing.string() + "' failed (" +
           std::strerror(errno) + ")";
  ::rmdir(probe.c_str());
  return "";
}

}  // namespace meshlm

// ---- temporary files --------------------------------------------------------

namespace meshlm {

namespace {

bool all_digits(std::string_view d) {
  return !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos;
}

// The suffixes Open MPI's MPI-IO (OMPIO's sharedfp lockedfile) adds to the
// name of a file it opens, for the files it keeps beside that file:
// "-<job>-<pid>.lock" while the file is open, ".locktest.<rank>" while it
// tries a lock on the file system.
bool is_mpi_io_suffix(std::string_view s) {
  constexpr std::string_view kLock = ".lock", kLockTest = ".locktest.";
  if (s.starts_with(kLockTest)) return all_digits(s.substr(kLockTest.size()));
  if (!s.ends_with(kLock) || !s.starts_with('-')) return false;
  s.remove_suffix(kLock.size());
  s.remove_prefix(1);
  const size_t dash = s.find('-');
  return dash != std::string_view::npos && all_digits(s.substr(0, dash)) && all_digits(s.substr(dash + 1));
}

struct TempSlot {
  std::atomic<bool> used{false};
  char path[4096];
  int dir_end = -1;  // the index of path's last '/', -1 when it has none
};
TempSlot g_temp[kMaxTempFiles];
std::once_flag g_handlers_installed;
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};

// Unlinks the files Open MPI's MPI-IO keeps beside the slot's file while it
// is open (is_mpi_io_suffix): a signal during HDF5's open or close of the
// file would otherwise leave them. System calls only (open, getdents64,
// unlinkat, close) and no allocation: this runs in a signal handler.
void unlink_mpi_io_files_beside(const TempSlot& s) {
#ifdef __linux__
  char dir[sizeof(s.path)];
  const char* base = s.path;
  if (s.dir_end < 0) {
    dir[0] = '.';
    dir[1] = '\0';
  } else {
    const size_t n = s.dir_end == 0 ? 1 : static_cast<size_t>(s.dir_end);
    std::memcpy(dir, s.path, n);
    dir[n] = '\0';
    base = s.path + s.dir_end + 1;
  }
  const std::string_view base_name(base);
  const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[8192];
  for (;;) {
    const long got = ::syscall(SYS_getdents64, fd, buf, sizeof(buf));
    if (got <= 0) break;
    for (long at = 0; at < got;) {
      // struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen (2), d_type (1), d_name.
      unsigned short reclen = 0;
      std::memcpy(&reclen, buf + at + 16, sizeof(reclen));
      const char* name = buf + at + 19;
      const std::string_view entry(name);
      if (entry.size() > base_name.size() && entry.starts_with(base_name) &&
          is_mpi_io_suffix(entry.substr(base_name.size())))
        ::unlinkat(fd, name, 0);
      if (reclen == 0) break;
      at += reclen;
    }
  }
  ::close(fd);
#else
  (void)s;
#endif
}

void unlink_temp_files() {
  for (TempSlot& s : g_temp)
    if (s.used.load(std::memory_order_acquire)) {
      ::unlink(s.path);
      unlink_mpi_io_files_beside(s);
    }
}

// Async-signal-safe: unlink, signal, raise.
extern "C" void remove_temp_files_and_die(int sig) {
  unlink_temp_files();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_handlers() {
  for (int sig : kSignals) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // a process started to ignore it keeps doing so
    struct sigaction sa {};
    sa.sa_handler = remove_temp_files_and_die;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "host";
  std::string h(buf);
  for (char& c : h)
    if (c == '/') c = '_';
  return h.empty() ? "host" : h;
}
}  // namespace

void remove_temp_files_now() { unlink_temp_files(); }

void install_temp_file_handlers() { std::call_once(g_handlers_installed, install_handlers); }

int register_temp_file(const std::string& path) {
  install_temp_file_handlers();
  if (path.size() >= sizeof(g_temp[0].path)) return -1;
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  for (int i = 0; i < kMaxTempFiles; ++i) {
    TempSlot& s = g_temp[i];
    if (s.used.load(std::memory_order_acquire)) continue;
    std::snprintf(s.path, sizeof(s.path), "%s", path.c_str());
    const size_t slash = path.rfind('/');
    s.dir_end = slash == std::string::npos ? -1 : static_cast<int>(slash);
    s.used.store(true, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_temp_file(int slot) {
  if (slot >= 0 && slot < kMaxTempFiles) g_temp[slot].used.store(false, std::memory_order_release);
}

std::string temp_name_for(const std::string& path) {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(r));
  return path + ".tmp." + host_name() + "." + std::to_string(::getpid()) + "." + hex;
}

void sync_file_and_dir(const std::string& path) {
  auto sync = [](const std::string& p, int flags) {
    const int fd = ::open(p.c_str(), flags | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      throw RankError("cannot flush '" + p + "' to disk (fsync): " + why, MESHLM_HERE);
    }
    ::close(fd);
  };
  sync(path, O_RDONLY);
  const fs::path parent = fs::path(path).parent_path();
  sync(parent.empty() ? std::string(".") : parent.string(), O_RDONLY | O_DIRECTORY);
}

struct WriteBack::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

WriteBack::WriteBack(const std::string& path) : state_(std::make_unique<State>()) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  State* st = state_.get();
  st->thread = std::thread([st, fd] {
    std::unique_lock<std::mutex> lock(st->mutex);
    while (!st->stop) {
      lock.unlock();
#ifdef __linux__
      // Starts write-back of the dirty pages without waiting for it.
      const bool asked = ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0;
#else
      const bool asked = false;
#endif
      lock.lock();
      if (!asked) break;
      st->wake.wait_for(lock, std::chrono::milliseconds(20), [st] { return st->stop; });
    }
    ::close(fd);
  });
}

WriteBack::~WriteBack() {
  if (!state_ || !state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
}


std::vector<std::string> remove_stale_temp_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".tmp." + host_name() + ".";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    // The rest is "<pid>.<16 hex>", or that and the suffix of a file Open
    // MPI's MPI-IO keeps beside it (is_mpi_io_suffix), left behind when the
    // process is killed while HDF5 opens or closes the file.
    const std::string rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || rest.size() < dot + 1 + 16) continue;
    const size_t hex_end = dot + 1 + 16;
    if (rest.size() > hex_end && !is_mpi_io_suffix(std::string_view(rest).substr(hex_end))) continue;
    long pid = 0;
    const auto [pid_end, pid_err] = std::from_chars(rest.data(), rest.data() + dot, pid);
    if (pid_err != std::errc() || pid_end != rest.data() + dot || pid <= 0) continue;
    if (rest.find_first_not_of("0123456789abcdef", dot + 1) < hex_end) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still running
    std::error_code rm;  // a file, or a directory written under a temporary name
    if (fs::remove_all(it->path(), rm) > 0 && !rm) removed.push_back(it->path().string());
  }
  return removed;
}

}  // namespace meshlm
