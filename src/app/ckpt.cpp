#include "app/ckpt.h"

#include "core/error.h"

namespace meshlm {

int cmd_ckpt(const std::vector<std::string>& args) {
  throw CollectiveError("meshlm ckpt: not built yet", MESHLM_HERE);
}

}  // namespace meshlm
