// A process started without a launcher runs Open MPI without a helper
// daemon (comm::prefer_isolated_singleton, called by meshlm's MpiSession and
// by the tests' main before MPI_Init): no child `orted`, and a value the
// environment gives is kept. Each such singleton has a session directory of
// its own: another singleton that ends (a child here, as two `meshlm
// tokenize` started side by side would be) leaves it in place, and MPI-IO
// opens a file without Open MPI's complaint about its segment there.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <mpi.h>

extern char** environ;

#include "comm/mpi_session.h"

using namespace meshlm;
namespace fs = std::filesystem;

namespace {

constexpr const char* kVar = "OMPI_MCA_ess_singleton_isolated";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// The names (comm) of this process's children, from /proc/PID/stat.
std::vector<std::string> child_names() {
  std::vector<std::string> names;
  const std::string self = std::to_string(::getpid());
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream in(e.path() / "stat");
    std::string line;
    if (!in || !std::getline(in, line)) continue;  // not a process, or gone
    // pid (comm) state ppid ...: comm may hold spaces, so from the last ')'.
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state, ppid;
    rest >> state >> ppid;
    if (ppid == self) names.push_back(line.substr(open + 1, close - open - 1));
  }
  return names;
}

// Open MPI's session directories ("ompi.<host>.<uid>") under `base`.
int ompi_dirs_in(const std::string& base) {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("ompi.", 0) == 0) ++n;
  return n;
}

// Runs this program again on one quick test, as a second singleton started
// from the same shell would run: this environment without what Open MPI's
// initialisation added to it (OMPI_MCA_orte_ess_num_procs and the like) and
// without the session directory base meshlm named: every OMPI_, OPAL_ and
// PMIX_ variable but the isolated singleton's and the point-to-point
// layer's. Its
// exit status (-1 when it did not end by exit), and its process id in `pid`.
int run_child_singleton(pid_t& pid) {
  std::vector<char> exe(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (n <= 0) return -1;
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    const bool mpi = v.rfind("OMPI_", 0) == 0 || v.rfind("OPAL_", 0) == 0 || v.rfind("PMIX_", 0) == 0;
    const bool kept = v.rfind(std::string(kVar) + "=", 0) == 0 || v.rfind("OMPI_MCA_pml=", 0) == 0;
    if (!mpi || kept) vars.push_back(v);
  }
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  pid = ::fork();
  if (pid == 0) {
    const char* argv[] = {exe.data(), "--gtest_filter=MpiSession.TheEnvironmentsValueWins", nullptr};
    ::execve(exe.data(), const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The process id of a process that has ended (a child reaped here).
pid_t an_ended_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

}  // namespace

TEST(MpiSession, TheEnvironmentsValueWins) {
  const std::optional<std::string> saved = env(kVar);
  ::unsetenv(kVar);
  comm::prefer_isolated_singleton();
  EXPECT_EQ(env(kVar).value_or("(unset)"), "1");
  ::setenv(kVar, "0", 1);
  comm::prefer_isolated_singleton();
  EXPECT_EQ(env(kVar).value_or("(unset)"), "0");
  if (saved) ::setenv(kVar, saved->c_str(), 1);
  else ::unsetenv(kVar);
}

TEST(MpiSession, ASingletonForksNoHelperDaemon) {
  // (mpiexec sets OMPI_COMM_WORLD_SIZE; a singleton's daemon sets PMIX_RANK.)
  if (env("OMPI_COMM_WORLD_SIZE")) GTEST_SKIP() << "started by mpiexec: not a singleton";
  if (env(kVar).value_or("") != "1")
    GTEST_SKIP() << "the environment sets " << kVar << "=" << env(kVar).value_or("");
  for (const std::string& name : child_names()) EXPECT_NE(name, "orted") << "a helper daemon runs";
}

TEST(MpiSession, EachSingletonHasASessionDirectoryOfItsOwn) {
#if !(defined(OPEN_MPI) && defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION < 5)
  GTEST_SKIP() << "not Open MPI 4: no isolated singleton shares a session directory";
#else
  if (env("OMPI_COMM_WORLD_SIZE")) GTEST_SKIP() << "started by mpiexec: not a singleton";
  if (env(kVar).value_or("") != "1")
    GTEST_SKIP() << "the environment sets " << kVar << "=" << env(kVar).value_or("");
  const std::string base = comm::private_singleton_session_base();
  ASSERT_FALSE(base.empty()) << "this singleton got no session directory base of its own";
  EXPECT_EQ(env("OMPI_MCA_orte_tmpdir_base").value_or("(unset)"), base);
  EXPECT_EQ(comm::private_singleton_session_base(), base) << "made once";
  struct stat st {};
  ASSERT_EQ(::stat(base.c_str(), &st), 0) << base;
  EXPECT_EQ(st.st_mode & 0777, 0700u) << base;
  EXPECT_EQ(ompi_dirs_in(base), 1) << "Open MPI's session directory is not under " << base;

  // A directory a killed singleton left, named for a process that has ended:
  // the next singleton removes it. (This one's name with another pid.)
  const std::string name = fs::path(base).filename().string();
  const std::string mine = "." + std::to_string(::getpid()) + ".";
  const size_t at = name.rfind(mine);
  ASSERT_NE(at, std::string::npos) << name;
  const fs::path stale = fs::path(base).parent_path() /
                         (name.substr(0, at) + "." + std::to_string(an_ended_pid()) + "." +
                          name.substr(at + mine.size()));
  fs::create_directories(stale / "ompi.left" / "jf.0");

  pid_t child = 0;
  ASSERT_EQ(run_child_singleton(child), 0);
  EXPECT_FALSE(fs::exists(stale)) << "the stale " << stale << " was not removed";
  EXPECT_EQ(ompi_dirs_in(base), 1) << "another singleton's end removed this one's session directory";
  const std::string childs = name.substr(0, at) + "." + std::to_string(child) + ".";
  for (const auto& e : fs::directory_iterator(fs::path(base).parent_path()))
    EXPECT_NE(e.path().filename().string().rfind(childs, 0), 0u)
        << "the child's session directory base was left: " << e.path();

  // MPI-IO keeps a segment in the session directory: the file opens with no
  // complaint from Open MPI on stderr.
  std::string scratch = (fs::path(::testing::TempDir()) / "meshlm_test_XXXXXX").string();
  ASSERT_NE(::mkdtemp(scratch.data()), nullptr);
  const std::string err_file = scratch + "/stderr";
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* err = std::fopen(err_file.c_str(), "w");
  ASSERT_NE(err, nullptr);
  ::dup2(::fileno(err), 2);
  MPI_File fh;
  const std::string file = scratch + "/f.bin";
  const int rc = MPI_File_open(MPI_COMM_SELF, file.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY,
                               MPI_INFO_NULL, &fh);
  if (rc == MPI_SUCCESS) MPI_File_close(&fh);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(err);
  EXPECT_EQ(rc, MPI_SUCCESS);
  std::ifstream in(err_file);
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(said, "") << "Open MPI said, opening " << file;
  fs::remove_all(scratch);
#endif
}
