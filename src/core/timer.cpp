#include "core/timer.h"

#include <ctime>

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

std::string utc_timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace meshlm
