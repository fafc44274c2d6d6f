#include "core/timer.h"

namespace meshlm {

const char* section_name(Section s) {
  switch (s) {
    case Section::forward: return "forward";
    case Section::backward: return "backward";
    case Section::tp_comm: return "tp-comm";
    case Section::pp_comm: return "pp-comm";
    case Section::dp_comm: return "dp-comm";
    case Section::optimizer: return "optimizer";
    case Section::data: return "data";
    case Section::checkpoint: return "checkpoint";
    case Section::other: return "other";
    case Section::count: break;
  }
  return "?";
}

}  // namespace meshlm
