// core/files.h: which paths name the same file, what is not a regular file,
// and the temporary files removed on a signal or by the next writer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/files.h"
#include "scratch_dir.h"

using namespace meshlm;
namespace fs = std::filesystem;

namespace {
void touch(const std::string& p) { std::fclose(std::fopen(p.c_str(), "w")); }
}  // namespace

class FilesTest : public ScratchDirTest {};

TEST_F(FilesTest, SameFileThroughLinksAndDots) {
  const std::string a = file("a.txt"), link = file("link.txt");
  touch(a);
  fs::create_symlink(a, link);
  EXPECT_TRUE(same_file(a, link));
  EXPECT_TRUE(same_file(a, (dir_ / "." / "a.txt").string()));
  EXPECT_FALSE(same_file(a, file("b.txt")));
  // Neither exists: the same path once normalised.
  EXPECT_TRUE(same_file(file("new.h5"), (dir_ / "x" / ".." / "new.h5").string()));
  EXPECT_FALSE(same_file("", a));
}

TEST_F(FilesTest, WhatIsNotARegularFile) {
  const std::string reg = file("r"), fifo = file("f"), loop1 = file("l1"), loop2 = file("l2");
  touch(reg);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(loop2, loop1);
  fs::create_symlink(loop1, loop2);
  EXPECT_EQ(non_regular_kind(reg), "");
  EXPECT_EQ(non_regular_kind(file("missing")), "");
  EXPECT_EQ(non_regular_kind(dir_.string()), "a directory");
  EXPECT_EQ(non_regular_kind(fifo), "a FIFO");
  EXPECT_EQ(non_regular_kind("/dev/null"), "a character device");
  EXPECT_EQ(non_regular_kind(loop1), "a symbolic link loop");
  EXPECT_NE(non_regular_kind(std::string(10000, 'a')).find("cannot resolve"), std::string::npos);
}

// A process ended by SIGTERM while writing leaves no temporary file.
TEST_F(FilesTest, TemporaryFilesGoWithASignal) {
  const std::string tmp = temp_name_for(file("out.h5"));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    touch(tmp);
    if (register_temp_file(tmp) < 0) ::_exit(2);
    ::raise(SIGTERM);
    ::_exit(3);  // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(fs::exists(tmp));
}

// A signal while HDF5 opens or closes the temporary file through MPI-IO also
// removes the files Open MPI keeps beside it ("-<job>-<pid>.lock",
// ".locktest.<rank>"), and nothing else: for a temporary file named by an
// absolute path and by one relative to the working directory.
TEST_F(FilesTest, TheSignalAlsoRemovesMpiIoFilesBesideTheTemporaryFile) {
  for (const bool relative : {false, true}) {
    SCOPED_TRACE(relative ? "relative path" : "absolute path");
    const std::string tmp = temp_name_for(file("run.h5"));
    const std::vector<std::string> mpi_io = {tmp + "-1-4242.lock", tmp + "-3211264-17.lock",
                                             tmp + ".locktest.0", tmp + ".locktest.12"};
    const std::vector<std::string> others = {tmp + "-x-1.lock", tmp + "-1.lock", tmp + ".locktest.",
                                             tmp + ".lock", tmp + "0-1-2.lock", tmp + ".data",
                                             file("run.h5"), file("other-1-2.lock")};
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (const std::string& f : mpi_io) touch(f);
      for (const std::string& f : others) touch(f);
      touch(tmp);
      std::string name = tmp;
      if (relative) {
        if (::chdir(fs::path(tmp).parent_path().c_str()) != 0) ::_exit(4);
        name = fs::path(tmp).filename().string();
      }
      if (register_temp_file(name) < 0) ::_exit(2);
      ::raise(SIGTERM);
      ::_exit(3);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
    EXPECT_FALSE(fs::exists(tmp));
    for (const std::string& f : mpi_io) EXPECT_FALSE(fs::exists(f)) << f;
    for (const std::string& f : others) {
      EXPECT_TRUE(fs::exists(f)) << f;
      fs::remove(f);
    }
  }
}

// The next writer removes what a process killed beyond help (SIGKILL) left,
// and nothing of a process that still runs.
TEST_F(FilesTest, StaleTemporaryFilesOfDeadProcessesAreRemoved) {
  const std::string target = file("cache.h5");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    touch(temp_name_for(target));
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string mine = temp_name_for(target);
  touch(mine);
  touch(file("cache.h5.tmp.otherhost.1.0123456789abcdef"));
  // Names of this host that are not "<pid>.<16 hex>" are not meshlm's.
  const std::string dead_prefix = mine.substr(0, mine.rfind('.', mine.rfind('.') - 1) + 1);
  const std::vector<std::string> not_ours = {
      dead_prefix + std::to_string(pid) + "x.0123456789abcdef",
      dead_prefix + std::to_string(pid) + ".0123456789abcdeZ",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef0", dead_prefix + ".0123456789abcdef",
      // Only "-<job>-<pid>.lock" and ".locktest.<rank>" (Open MPI's files
      // beside a file opened through MPI-IO) may follow a dead writer's name.
      dead_prefix + std::to_string(pid) + ".0123456789abcdef.lock",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef.locktest.",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef.locktest.0x",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef-1.lock",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef-x-1.lock",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef--1.lock",
      dead_prefix + std::to_string(pid) + ".0123456789abcdef-1-2.lck",
      dead_prefix + std::to_string(pid) + ".0123456789abcdeZ-1-2.lock"};
  for (const std::string& name : not_ours) touch(name);
  // The lock file Open MPI's shared file pointers leave when a writer is
  // killed while HDF5 opens its temporary file, and a live writer's.
  const std::string dead_lock = dead_prefix + std::to_string(pid) + ".0123456789abcdef-1-" + std::to_string(pid) + ".lock";
  const std::string dead_locktest = dead_prefix + std::to_string(pid) + ".0123456789abcdef.locktest.0";
  const std::string live_lock = mine + "-1-" + std::to_string(::getpid()) + ".lock";
  for (const std::string& name : {dead_lock, dead_locktest, live_lock}) touch(name);
  std::vector<std::string> removed = remove_stale_temp_files(target);
  for (const std::string& name : not_ours) EXPECT_TRUE(fs::exists(name)) << name;
  ASSERT_EQ(removed.size(), 3u);
  for (const std::string& name : {dead_lock, dead_locktest}) {
    const auto at = std::find(removed.begin(), removed.end(), name);
    ASSERT_NE(at, removed.end()) << name;
    removed.erase(at);
    EXPECT_FALSE(fs::exists(name)) << name;
  }
  EXPECT_NE(removed[0].find("." + std::to_string(pid) + "."), std::string::npos) << removed[0];
  EXPECT_TRUE(fs::exists(live_lock));
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(file("cache.h5.tmp.otherhost.1.0123456789abcdef")));
}
