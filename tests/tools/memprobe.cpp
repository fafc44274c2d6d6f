// memprobe: runs one program and measures its memory from the outside, the
// way the operating system sees it, for the memory tests and benchmarks
// (tests/memory/, tests/bench/memory_accuracy.py). meshlm reads nothing of
// what this writes.
//
//   memprobe OUT [--every-ms N] -- PROGRAM [ARGS...]
//
// (--every-ms 0: no samples, only the high-water marks. Each sample walks
// the program's page tables in the kernel: at 20 ms, for a GPT-2-sized
// rank, a good part of a core.)
//
// Under mpiexec each rank runs its own memprobe, which runs the rank's
// program as its child. memprobe writes OUT.<rank>.txt (the rank from
// OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID; 0 without them):
//   sample <t_ms> <rss_kb> <pss_kb>   every N ms (default 20) from
//                                     /proc/<pid>/smaps_rollup; t_ms is
//                                     CLOCK_MONOTONIC, one clock per machine,
//                                     so the ranks of a node line up
//   hwm_kb <kb>                       VmHWM of /proc/<pid>/status, read as
//                                     the program exits (ptrace's exit stop:
//                                     its memory is still there)
//   maxrss_kb <kb>                    the kernel's ru_maxrss from wait4, the
//                                     same high-water mark by another way
//   exit <code> | signal <n>
// and exits as its program did. Signals memprobe receives (SIGTERM from
// mpiexec, SIGINT) go on to the program.
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

pid_t g_child = 0;

void forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

// The "Key:   1234 kB" lines of a /proc file, in kB, read once (a read of
// smaps_rollup is a walk of the page tables); -1 for a key that is absent.
template <size_t N>
std::array<long, N> proc_kb(const std::string& path, const std::array<const char*, N>& keys) {
  std::array<long, N> kb;
  kb.fill(-1);
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    for (size_t k = 0; k < N; ++k) {
      const size_t n = std::strlen(keys[k]);
      if (line.compare(0, n, keys[k]) == 0 && line.size() > n && line[n] == ':') {
        std::istringstream s(line.substr(n + 1));
        s >> kb[k];
      }
    }
  return kb;
}

double now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

std::string rank_text() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0') return s;
  return "0";
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "memprobe: %s\nusage: memprobe OUT [--every-ms N] -- PROGRAM [ARGS...]\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) usage("too few arguments");
  const std::string out_path = std::string(argv[1]) + "." + rank_text() + ".txt";
  int every_ms = 20, i = 2;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--every-ms") == 0 && i + 1 < argc)
      every_ms = std::atoi(argv[++i]);
    else
      usage((std::string("unknown option ") + argv[i]).c_str());
  }
  if (i + 1 >= argc || every_ms < 0) usage("no program after --, or --every-ms negative");
  char** program = argv + i + 1;

  FILE* out = std::fopen(out_path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "memprobe: cannot write %s: %s\n", out_path.c_str(), std::strerror(errno));
    return 2;
  }

  const pid_t child = fork();
  if (child < 0) {
    std::perror("memprobe: fork");
    return 2;
  }
  if (child == 0) {
    ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    execvp(program[0], program);
    std::fprintf(stderr, "memprobe: cannot run %s: %s\n", program[0], std::strerror(errno));
    _exit(127);
  }
  g_child = child;
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGCONT}) std::signal(sig, forward);

  const std::string status = "/proc/" + std::to_string(child) + "/status";
  const std::string rollup = "/proc/" + std::to_string(child) + "/smaps_rollup";
  bool options_set = false;
  long hwm_kb = -1;
  int wstatus = 0;
  rusage usage_of{};
  double next = now_ms();
  for (;;) {
    // Without samples, wait4 blocks until the program stops or exits (after
    // a forwarded signal, wait4 goes on: signal() installs with SA_RESTART).
    const pid_t w = wait4(child, &wstatus, (every_ms > 0 ? WNOHANG : 0) | __WALL, &usage_of);
    if (w < 0 && errno != EINTR) {
      std::perror("memprobe: wait4");
      return 2;
    }
    if (w == child) {
      if (WIFEXITED(wstatus) || WIFSIGNALED(wstatus)) break;
      if (WIFSTOPPED(wstatus)) {
        const int sig = WSTOPSIG(wstatus);
        const int event = wstatus >> 16;
        int deliver = 0;
        if (!options_set && sig == SIGTRAP) {
          // The stop after exec: from now on, stop once more at the exit.
          ptrace(PTRACE_SETOPTIONS, child, nullptr,
                 reinterpret_cast<void*>(PTRACE_O_TRACEEXIT | PTRACE_O_EXITKILL));
          options_set = true;
        } else if (event == PTRACE_EVENT_EXIT) {
          hwm_kb = proc_kb(status, std::array{"VmHWM"})[0];
        } else if (event == 0) {
          deliver = sig;  // a signal for the program: pass it on
        }
        ptrace(PTRACE_CONT, child, nullptr, reinterpret_cast<void*>(static_cast<long>(deliver)));
      }
      continue;
    }
    if (every_ms == 0) continue;
    const double t = now_ms();
    if (t >= next) {
      const auto [rss, pss] = proc_kb(rollup, std::array{"Rss", "Pss"});
      if (rss >= 0) std::fprintf(out, "sample %.1f %ld %ld\n", t, rss, pss);
      next = t + every_ms;
    }
    // Until the next sample, 1 ms at least. A stop of the program (its exit,
    // a signal for it) waits at most that long for the PTRACE_CONT above.
    usleep(static_cast<useconds_t>(std::max(1.0, next - now_ms()) * 1000));
  }
  std::fprintf(out, "hwm_kb %ld\nmaxrss_kb %ld\n", hwm_kb, static_cast<long>(usage_of.ru_maxrss));
  int code = 0;
  if (WIFEXITED(wstatus)) {
    code = WEXITSTATUS(wstatus);
    std::fprintf(out, "exit %d\n", code);
  } else {
    code = 128 + WTERMSIG(wstatus);
    std::fprintf(out, "signal %d\n", WTERMSIG(wstatus));
  }
  std::fclose(out);
  return code;
}
