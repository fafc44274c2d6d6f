#include "core/log.h"

namespace meshlm::log {
namespace {
int g_rank = 0;
}
void set_rank(int world_rank) { g_rank = world_rank; }
int rank() { return g_rank; }
}  // namespace meshlm::log
