// main() of every meshlm test program: MPI up before the tests, down after;
// ranks other than 0 print only their failures, prefixed with the rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "comm/mpi_session.h"
#include "core/log.h"

// Built with AddressSanitizer (MESHLM_SANITIZE=address,...): GCC says so
// with __SANITIZE_ADDRESS__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define MESHLM_LEAK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MESHLM_LEAK_CHECK 1
#endif
#endif
#ifdef MESHLM_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

namespace {
// The failures of one rank > 0: file, line and message of each failed
// assertion, so a test that fails only there says why.
// (GoogleTest calls OnTestPartResult holding the lock that
// current_test_info() takes: the test is kept from OnTestStart instead.)
class FailurePrinter : public ::testing::EmptyTestEventListener {
public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& t) override { test_ = &t; }
  void OnTestEnd(const ::testing::TestInfo&) override { test_ = nullptr; }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s.%s at %s:%d\n%s\n", rank_,
                 test_ ? test_->test_suite_name() : "?", test_ ? test_->name() : "?",
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }

private:
  int rank_;
  const ::testing::TestInfo* test_ = nullptr;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;  // as comm/mpi_session.cpp asks (checkpoint.async)
  meshlm::comm::prefer_isolated_singleton();  // as meshlm does: no helper daemon without mpiexec
#ifdef MESHLM_LEAK_CHECK
  // What Open MPI's initialisation loses (in components it loads and
  // unloads again) is not meshlm's leak: not tracked.
  __lsan_disable();
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  __lsan_enable();
#else
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#endif
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  meshlm::log::set_rank(rank);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS();
#ifdef MESHLM_LEAK_CHECK
  // LeakSanitizer's check runs here, while MPI is up, instead of at exit:
  // what Open MPI allocated is still reachable now, and what it leaks in
  // MPI_Finalize is not meshlm's (and sits in the components it unloads,
  // which the report could not even name). A leak ends the program with
  // LeakSanitizer's report and exit code; none is checked again at exit.
  __lsan_do_leak_check();
#endif
  // A test program fails if any rank failed.
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // With MESHLM_ALL_SKIPPED_EXIT=N (the GPU tests' ctest entries, whose
  // SKIP_RETURN_CODE is N): exit N where no test failed and every test that
  // ran skipped on every rank, so that ctest reports the program skipped;
  // a failure, or a program some of whose tests ran, is reported as such
  // (a SKIP_REGULAR_EXPRESSION would mark it skipped whatever its exit).
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  int all_skipped = u.successful_test_count() == 0 && u.skipped_test_count() > 0 ? 1 : 0;
  int everywhere = 0;
  MPI_Allreduce(&all_skipped, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  const char* code = std::getenv("MESHLM_ALL_SKIPPED_EXIT");
  if (any == 0 && everywhere == 1 && code != nullptr && *code != '\0') return std::atoi(code);
  return any;
}
