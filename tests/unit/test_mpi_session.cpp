// A process started without a launcher runs Open MPI without a helper
// daemon (comm::prefer_isolated_singleton, called by meshlm's MpiSession and
// by the tests' main before MPI_Init): no child `orted`, and a value the
// environment gives is kept.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

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
