// What the file system says about a path, for the checks that keep meshlm
// from reading what it must not (a FIFO that blocks forever, a directory) and
// from writing over its own inputs.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace meshlm {

// True when `a` and `b` name the same file: the same inode when both exist,
// else the same absolute path once `.`, `..` and symbolic links of the
// existing part are resolved. Never throws (false when either is empty).
bool same_file(const std::string& a, const std::string& b);

// "a directory", "a FIFO", "a socket", "a character device", "a block
// device" or "something that is not a regular file" for what is at `path`
// (symbolic links followed), "" for a regular file or nothing at all.
// "a symbolic link loop" or "a path the system cannot resolve (<why>)" when
// it cannot be examined (too long, a loop, no permission).
std::string non_regular_kind(const std::string& path);

// "" when a directory can be made at `dir` (or is there) and files written
// in it; else why not, as a phrase that follows "'<dir>' ": "is a regular
// file", "is below '/a/b', which is a regular file", "cannot be written:
// making a directory in '/a' failed (Read-only file system)". The proof is
// a directory made in `dir`, or in the deepest directory above it that
// exists, and removed at once: what a later mkdir and write need
// (permissions, a read-only or virtual file system) is what it needs.
// Nothing is left on disk.
std::string unwritable_dir_reason(const std::string& dir);

}  // namespace meshlm

namespace meshlm {

// Temporary files of this process (written under a temporary name, renamed
// when complete) are removed when the process is ended by SIGTERM, SIGINT
// or SIGHUP (a batch system ending the job, Ctrl-C): the handler unlinks
// them, then the signal takes its default course. At most kMaxTempFiles at
// once; more are not registered (and so not removed on a signal).
inline constexpr int kMaxTempFiles = 64;
// Installs those handlers now (they are otherwise installed by the first
// register_temp_file): a handler installed later for one of the signals
// (core/stop_signals.h) then replaces them for good.
void install_temp_file_handlers();
// Removes every registered temporary file now (async-signal-safe: unlink).
void remove_temp_files_now();
// Registers `path` (installing the handlers on first use); returns its slot,
// or -1 when none is free.
int register_temp_file(const std::string& path);
// The file was renamed or removed by its writer.
void unregister_temp_file(int slot);

// "<name>.tmp.<host>.<pid>.<16 hex>" in the directory of `path`: the name
// under which this process writes `path`. The host and pid say whose file it
// is, the random part keeps two writers of one process apart.
std::string temp_name_for(const std::string& path);
// Flushes the file at `path` to the disk (fsync), then the directory that
// holds it, so that a rename done before is durable too. RankError naming
// the path when either fails.
void sync_file_and_dir(const std::string& path);
// Starts the kernel's write-back of a file while it is still being written
// and read: a thread asks for it (sync_file_range, Linux) every few
// milliseconds until the object is destroyed, so that the file's final fsync
// finds most of it on the disk already. It changes no data and guarantees
// nothing: the fsync (sync_file_and_dir) still makes the file durable. A
// file that cannot be opened is left to that fsync.
class WriteBack {
public:
  explicit WriteBack(const std::string& path);
  ~WriteBack();
  WriteBack(const WriteBack&) = delete;
  WriteBack& operator=(const WriteBack&) = delete;

private:
  struct State;
  std::unique_ptr<State> state_;
};

// Removes the temporary files (or directories) of `path` left by processes
// of this host that no longer run (killed by SIGKILL, a node crash); returns
// their names.
std::vector<std::string> remove_stale_temp_files(const std::string& path);

}  // namespace meshlm
