// meshlm tokenize IN [IN ...] OUT.h5 [options]: a corpus (text files or
// JSON lines) to a token file with a model's own tokenizer, by every rank of
// the job at once (docs/usage.md, "Tokenizing a corpus").
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace meshlm {

// Collective over `comm`. Returns the exit status (0; errors throw).
int cmd_tokenize(MPI_Comm comm, const std::vector<std::string>& args);

}  // namespace meshlm
