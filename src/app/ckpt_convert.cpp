#include "app/ckpt_convert.h"

#include "core/error.h"

namespace meshlm {

int ckpt_export(const std::vector<std::string>&) {
  throw RankError("meshlm ckpt export: not built yet", MESHLM_HERE);
}
int ckpt_import(const std::vector<std::string>&) {
  throw RankError("meshlm ckpt import: not built yet", MESHLM_HERE);
}

}  // namespace meshlm
