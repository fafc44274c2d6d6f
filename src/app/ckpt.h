// `meshlm ckpt <tool> ...`: post-hoc analysis and conversion of checkpoints
// (docs/formats.md, "Checkpoints"). The tools read one file serially on
// world rank 0; the other ranks of the job wait for the result, and every
// rank exits with the same status.
#pragma once

#include <string>
#include <vector>

namespace meshlm {

// Collective over the world: runs `meshlm ckpt` with the arguments after
// "ckpt" (the tools in app/ckpt_tools.h, export and import in
// app/ckpt_convert.h). Returns 0; throws the same CollectiveError on every
// rank (exit status 1) for a bad argument, a file rank 0 cannot read or a
// failed verification, naming the argument, the file and the dataset.
int cmd_ckpt(const std::vector<std::string>& args);

}  // namespace meshlm
