// `meshlm ckpt <tool> ...`: post-hoc analysis and conversion of checkpoints
// (docs/formats.md, "Checkpoints"). The tools read one file serially on
// world rank 0; the other ranks of the job wait for the result, and every
// rank exits with the same status.
#pragma once

#include <string>
#include <vector>

namespace meshlm {

// Runs `meshlm ckpt` with the arguments after "ckpt". Returns the exit
// status (0, or non-zero for a failed verification); throws CollectiveError
// for bad arguments or unreadable files, naming them.
int cmd_ckpt(const std::vector<std::string>& args);

}  // namespace meshlm
