#include "model/linear_slot.h"

#include <sstream>

namespace meshlm {

std::string slots_text(LinearSlots s) {
  std::string out;
  for (const EnumName<LinearSlot>& n : kLinearSlotNames) {
    if (!s.has(n.value)) continue;
    if (!out.empty()) out += ',';
    out += n.name;
  }
  return out;
}

bool parse_slots(const std::string& text, LinearSlots& out, std::string& bad) {
  out = {};
  if (text.find_first_not_of(" \t") == std::string::npos) return true;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    const std::optional<LinearSlot> s = enum_from_name<LinearSlot>(item);
    if (!s) {
      bad = item;
      return false;
    }
    out.add(*s);
  }
  return true;
}

}  // namespace meshlm
