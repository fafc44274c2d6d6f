#include "core/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

#include "core/files.h"

namespace meshlm {

namespace {
std::atomic<int> g_received{0};
constexpr int kStopSignals[] = {SIGTERM, SIGUSR1};
struct sigaction g_previous[2];

extern "C" void note_stop_signal(int sig) {
  int none = 0;
  g_received.compare_exchange_strong(none, sig);
}
}  // namespace

StopSignals::StopSignals() {
  // The temporary-file handlers first, so that they never replace these.
  install_temp_file_handlers();
  g_received.store(0);
  for (int i = 0; i < 2; ++i) {
    struct sigaction sa {};
    sa.sa_handler = note_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(kStopSignals[i], &sa, &g_previous[i]);
  }
  const pid_t parent = ::getppid();
  watchdog_ = std::thread([this, parent] {
    while (!done_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (g_received.load() != 0 && ::getppid() != parent) {
        remove_temp_files_now();
        std::_Exit(128 + SIGTERM);
      }
    }
  });
}

StopSignals::~StopSignals() {
  done_.store(true);
  watchdog_.join();
  for (int i = 0; i < 2; ++i) ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() { return g_received.load(); }

const char* StopSignals::name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a stop signal";
  }
}

}  // namespace meshlm
