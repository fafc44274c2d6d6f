// The four linear layers of a transformer block, as the parameter table,
// the linear dispatch (fp32, quantized base, LoRA adapter) and the
// finetune.lora_targets keyword name them.
#pragma once

#include <span>
#include <string>

#include "core/enum_names.h"

namespace meshlm {

enum class LinearSlot : int {
  qkv = 0,       // attn.c_attn    (3C, C)  column-parallel
  attn_out = 1,  // attn.c_proj    (C, C)   row-parallel
  mlp_up = 2,    // mlp.c_fc       (4C, C)  column-parallel
  mlp_down = 3,  // mlp.c_proj     (C, 4C)  row-parallel
};
inline constexpr int kLinearSlots = 4;
inline constexpr EnumName<LinearSlot> kLinearSlotNames[] = {
    {LinearSlot::qkv, "qkv"},
    {LinearSlot::attn_out, "attn-out"},
    {LinearSlot::mlp_up, "mlp-up"},
    {LinearSlot::mlp_down, "mlp-down"},
};
constexpr std::span<const EnumName<LinearSlot>> enum_names(LinearSlot) { return kLinearSlotNames; }

// A set of slots, written in the parameter file as a comma-separated list
// of their names ("qkv,mlp-down"; any order, spaces allowed).
struct LinearSlots {
  unsigned bits = 0;

  static LinearSlots all() { return {(1u << kLinearSlots) - 1}; }
  bool has(LinearSlot s) const { return (bits >> static_cast<int>(s)) & 1u; }
  void add(LinearSlot s) { bits |= 1u << static_cast<int>(s); }
  bool empty() const { return bits == 0; }
  bool operator==(const LinearSlots&) const = default;
};

// "qkv,attn-out": the names of the slots in table order.
std::string slots_text(LinearSlots s);
// The list's slots; false (and `bad` = the first unknown item, possibly
// empty) when an item names no slot. An empty list parses to an empty set.
bool parse_slots(const std::string& text, LinearSlots& out, std::string& bad);

}  // namespace meshlm
