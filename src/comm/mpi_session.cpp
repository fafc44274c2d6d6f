#include "comm/mpi_session.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/files.h"

namespace meshlm::comm {

namespace {

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A launcher (mpiexec, orted, srun with PMI or PMIx) sets one of these in
// every process it starts; a singleton has none.
bool started_by_a_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_ess_num_procs", "PMIX_RANK",
                           "PMI_RANK", "PMI_FD", "PMI_SIZE"})
    if (env_or_null(name) != nullptr) return true;
  return false;
}

std::string& session_base() {
  static std::string dir;
  return dir;
}

void remove_session_base() {
  if (session_base().empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(session_base(), ec);
  session_base().clear();
}

}  // namespace

std::string private_singleton_session_base() {
#if defined(OPEN_MPI) && defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION < 5
  if (!session_base().empty()) return session_base();
  const char* isolated = std::getenv("OMPI_MCA_ess_singleton_isolated");
  if (isolated == nullptr || std::string(isolated) != "1") return "";
  if (started_by_a_launcher() || env_or_null("OMPI_MCA_orte_tmpdir_base") != nullptr) return "";
  const char* tmp = env_or_null("TMPDIR");
  const std::string stem = std::string(tmp != nullptr ? tmp : "/tmp") + "/meshlm-mpi";
  remove_stale_temp_files(stem);  // of singletons of this host that were killed
  const std::string dir = temp_name_for(stem);
  std::error_code ec;
  if (!std::filesystem::create_directory(dir, ec) || ec) return "";  // Open MPI's own then
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace, ec);
  ::setenv("OMPI_MCA_orte_tmpdir_base", dir.c_str(), /*overwrite=*/1);
  session_base() = dir;
  std::atexit(remove_session_base);
  return dir;
#else
  return "";
#endif
}

void prefer_isolated_singleton() {
  ::setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
  private_singleton_session_base();
}

MpiSession::MpiSession(int* argc, char*** argv) {
  prefer_isolated_singleton();
  // A second thread may write checkpoints (checkpoint.async) while the main
  // one trains: MPI calls from both, each on its own communicator.
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace meshlm::comm
