// Rank-0 logging. Every rank may call log0(); only world rank 0 prints, so a
// job of 512 ranks prints one line, not 512. Lines meant to come from every
// rank (one line per rank, gathered in rank order) are printed by the caller
// after a gather, never by racing printf.
#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

namespace meshlm::log {

// Set once after MPI_Init; before that every process thinks it is rank 0.
void set_rank(int world_rank);
int rank();

// Writes `line` (its newline included) to `to` in one call and flushes: with
// stdout and stderr going to one file (2>&1), another process's or stream's
// output then falls between lines, never inside one (stderr is unbuffered:
// a prefix written apart from its message was once split from it).
void write_line(std::FILE* to, const std::string& line);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (rank() != 0) return;
  write_line(stdout, fmt::format(f, std::forward<Args>(args)...) + "\n");
}

template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (rank() != 0) return;
  write_line(stderr, "WARNING: " + fmt::format(f, std::forward<Args>(args)...) + "\n");
}

// Text from a user's file made fit for a message: bytes outside printable
// ASCII written \xNN (a NUL no longer cuts the message short), and at most
// `max` bytes of it kept ("... (N bytes in all)" after).
std::string printable(std::string_view text, size_t max = 256);

}  // namespace meshlm::log
