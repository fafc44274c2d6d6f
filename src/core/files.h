// What the file system says about a path, for the checks that keep meshlm
// from reading what it must not (a FIFO that blocks forever, a directory) and
// from writing over its own inputs.
#pragma once

#include <string>

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

}  // namespace meshlm
