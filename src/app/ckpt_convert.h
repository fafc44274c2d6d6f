// `meshlm ckpt export` and `meshlm ckpt import`: a checkpoint to and from a
// Hugging Face GPT-2 safetensors file.
#pragma once

#include <string>
#include <vector>

namespace meshlm {

// The arguments after "export" / "import". Run on world rank 0 only (the
// dispatcher in app/ckpt.cpp shares the outcome with the other ranks);
// return the exit status, throw RankError naming the file or argument.
int ckpt_export(const std::vector<std::string>& args);
int ckpt_import(const std::vector<std::string>& args);

}  // namespace meshlm
