#include "core/log.h"

namespace meshlm::log {
namespace {
int g_rank = 0;
}
void set_rank(int world_rank) { g_rank = world_rank; }
int rank() { return g_rank; }
std::string printable(std::string_view text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (out.size() >= max && text.size() > max)
    out += "... (" + std::to_string(text.size()) + " bytes in all)";
  return out;
}

void write_line(std::FILE* to, const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), to);
  std::fflush(to);
}

}  // namespace meshlm::log
