#include "comm/stall_watchdog.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "comm/errors.h"
#include "comm/shared_window.h"
#include "core/heartbeat.h"

namespace meshlm::comm {

namespace {

// What the watched thread waits for (note_wait); read by the watchdog.
std::atomic<std::thread::id> g_watched{};
std::atomic<const char*> g_wait_op{nullptr};
std::atomic<const std::vector<int>*> g_wait_members{nullptr};
std::atomic<int> g_wait_peer{-1};
std::atomic<bool> g_in_wait{false};

// One rank's slot of the node's table.
struct Slot {
  int64_t alive_ns;     // when its watchdog thread last ran
  int64_t progress_ns;  // its last progress
  int32_t world_rank;
  int32_t waiting_for;  // a world rank; kCollective; kNotWaiting
  int32_t state;        // kUnused, kRunning, kDone
  int32_t pad;
};
constexpr int32_t kCollective = -1, kNotWaiting = -2;
constexpr int32_t kUnused = 0, kRunning = 1, kDone = 2;

template <typename T>
std::atomic_ref<T> at(T& x) {
  return std::atomic_ref<T>(x);
}

double seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// "0-3, 8, 10-11"
std::string rank_list(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += j == i ? std::to_string(r[i]) : fmt::format("{}-{}", r[i], r[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

void note_wait(const char* op, const std::vector<int>* members, int peer) {
  if (g_watched.load(std::memory_order_relaxed) != std::this_thread::get_id()) return;
  g_wait_op.store(op, std::memory_order_relaxed);
  g_wait_members.store(members, std::memory_order_relaxed);
  g_wait_peer.store(peer, std::memory_order_relaxed);
  g_in_wait.store(true, std::memory_order_release);
}

void note_wait_done() {
  if (g_watched.load(std::memory_order_relaxed) != std::this_thread::get_id()) return;
  g_in_wait.store(false, std::memory_order_release);
}

namespace {

std::mutex g_actions_mutex;
std::map<const void*, std::function<void()>>& stall_actions() {
  static std::map<const void*, std::function<void()>> actions;
  return actions;
}

}  // namespace

void on_stall(const void* key, std::function<void()> action) {
  std::lock_guard<std::mutex> lock(g_actions_mutex);
  stall_actions()[key] = std::move(action);
}

void forget_on_stall(const void* key) {
  std::lock_guard<std::mutex> lock(g_actions_mutex);
  stall_actions().erase(key);
}

struct StallWatchdog::Impl {
  MPI_Comm world = MPI_COMM_NULL;
  int world_rank = 0, host_rank = 0, host_size = 1;
  int64_t timeout_ns = 0, period_ns = 0;
  SharedWindow table;
  std::atomic<bool> armed{false};
  bool stop = false;
  std::mutex mutex;
  std::condition_variable wake;
  std::thread thread;

  Impl(MPI_Comm w, MPI_Comm host, double timeout_s)
      : world(w), table(host, sizeof(Slot) * static_cast<size_t>(host_size_of(host))) {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);  // as mpiexec numbers them, like the waits' ranks
    MPI_Comm_rank(host, &host_rank);
    MPI_Comm_size(host, &host_size);
    timeout_ns = static_cast<int64_t>(timeout_s * 1e9);
    period_ns = std::clamp<int64_t>(timeout_ns / 8, 50'000'000, 1'000'000'000);
    table.fence();  // the owner's zeroing before any rank's stamps
    Slot& me = slot(host_rank);
    at(me.world_rank).store(world_rank);
    at(me.waiting_for).store(kNotWaiting);
    at(me.alive_ns).store(heartbeat::now_ns());
    at(me.progress_ns).store(heartbeat::last_ns());
    at(me.state).store(kRunning);
    thread = std::thread([this] { run(); });
  }

  static int host_size_of(MPI_Comm host) {
    int n = 1;
    MPI_Comm_size(host, &n);
    return n;
  }

  Slot& slot(int i) { return reinterpret_cast<Slot*>(table.data())[i]; }

  // A thread that did not run for a while was stopped with its whole
  // process (SIGSTOP; a job suspended by its batch system, `scontrol
  // suspend`): that time is not this rank's stall. Every rank of a suspended
  // job sees it alike, so resuming one never ends it; a rank stopped alone
  // is named by the others.
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    int64_t seen_progress = heartbeat::last_ns(), stopped = 0, prev = heartbeat::now_ns();
    const int64_t stale = stale_ns();
    while (!stop) {
      const int64_t now = heartbeat::now_ns(), last = heartbeat::last_ns();
      if (last != seen_progress) {
        seen_progress = last;
        stopped = 0;
      }
      if (now - prev > stale) stopped += now - prev - period_ns;
      prev = now;
      Slot& me = slot(host_rank);
      at(me.alive_ns).store(now);
      at(me.progress_ns).store(last);
      at(me.waiting_for).store(waiting_for());
      if (armed.load() && now - last - stopped > timeout_ns) end_the_job(now, last);
      wake.wait_for(lock, std::chrono::nanoseconds(period_ns));
    }
  }

  // A thread that has not stamped its slot for this long did not run.
  int64_t stale_ns() const { return std::max<int64_t>(4 * period_ns, 500'000'000); }

  int32_t waiting_for() const {
    if (!g_in_wait.load(std::memory_order_acquire)) return kNotWaiting;
    const std::vector<int>* m = g_wait_members.load(std::memory_order_relaxed);
    const int peer = g_wait_peer.load(std::memory_order_relaxed);
    if (m == nullptr || peer < 0 || peer >= static_cast<int>(m->size())) return kCollective;
    return (*m)[static_cast<size_t>(peer)];
  }

  [[noreturn]] void end_the_job(int64_t now, int64_t last) {
    std::string what;
    if (!g_in_wait.load(std::memory_order_acquire)) {
      what = "not waiting for any rank (in its own work: compute or I/O)";
    } else {
      const char* op = g_wait_op.load(std::memory_order_relaxed);
      const std::vector<int>* m = g_wait_members.load(std::memory_order_relaxed);
      const int32_t peer = waiting_for();
      what = fmt::format("waiting in {}", op ? op : "a message");
      if (peer >= 0)
        what += fmt::format(" for rank {}", peer);
      else if (m != nullptr)
        what += fmt::format(" over ranks {}", rank_list(*m));
    }
    // The other ranks of this node, from their slots.
    std::string others;
    const int64_t stale = stale_ns();
    for (int i = 0; i < host_size; ++i) {
      if (i == host_rank) continue;
      Slot& s = slot(i);
      if (at(s.state).load() != kRunning) continue;
      const int r = at(s.world_rank).load();
      const int64_t alive = now - at(s.alive_ns).load(), progress = now - at(s.progress_ns).load();
      if (alive > stale)
        others += fmt::format("; rank {} (this node) has not run for {:.1f} s: stopped or frozen", r,
                              seconds(alive));
      else if (at(s.waiting_for).load() == kNotWaiting && progress > timeout_ns / 2)
        others += fmt::format(
            "; rank {} (this node) runs but has made no progress outside communication for {:.1f} s", r,
            seconds(progress));
    }
    std::fprintf(stderr,
                 "ERROR on rank %d: stalled: no progress for %.1f s (runtime.stall_timeout_s = %g), "
                 "%s%s. Ending the job (exit status %d)\n",
                 world_rank, seconds(now - last), seconds(timeout_ns), what.c_str(), others.c_str(),
                 kStallExitCode);
    std::fflush(stderr);
    std::fflush(stdout);
    {
      std::lock_guard<std::mutex> lock(g_actions_mutex);
      for (auto& [key, action] : stall_actions()) action();
    }
    abort_job(world, kStallExitCode);
  }
};

StallWatchdog::StallWatchdog(MPI_Comm world, MPI_Comm host, double timeout_s) {
  if (timeout_s > 0) impl_ = std::make_unique<Impl>(world, host, timeout_s);
}

StallWatchdog::~StallWatchdog() {
  if (!impl_) return;
  disarm();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  impl_->thread.join();
  at(impl_->slot(impl_->host_rank).state).store(kDone);
}

void StallWatchdog::arm() {
  if (!impl_) return;
  g_in_wait.store(false);
  g_watched.store(std::this_thread::get_id());
  heartbeat::beat();
  impl_->armed.store(true);
}

void StallWatchdog::disarm() {
  if (!impl_) return;
  impl_->armed.store(false);
  g_watched.store(std::thread::id{});
  g_in_wait.store(false);
}

}  // namespace meshlm::comm
