// The linear layers of a transformer block, as the parameter table, the
// linear dispatch (fp32, quantized base, LoRA adapter) and the
// finetune.lora_targets keyword name them: GPT-2's four and Llama's seven.
#pragma once

#include <span>
#include <string>

#include "core/enum_names.h"
#include "model/gpt_config.h"

namespace meshlm {

enum class LinearSlot : int {
  // GPT-2
  qkv = 0,       // attn.c_attn    (3C, C)  column-parallel
  attn_out = 1,  // attn.c_proj    (C, C)   row-parallel
  mlp_up = 2,    // mlp.c_fc       (4C, C)  column-parallel
  mlp_down = 3,  // mlp.c_proj     (C, 4C)  row-parallel
  // Llama (HS = C / NH, NKV key/value heads, F = intermediate_size)
  q = 4,     // self_attn.q_proj    (C, C)         column-parallel
  k = 5,     // self_attn.k_proj    (NKV HS, C)    column-parallel (replicated when NKV < tp)
  v = 6,     // self_attn.v_proj    (NKV HS, C)    likewise
  o = 7,     // self_attn.o_proj    (C, C)         row-parallel
  gate = 8,  // mlp.gate_proj       (F, C)         column-parallel
  up = 9,    // mlp.up_proj         (F, C)         column-parallel
  down = 10,  // mlp.down_proj      (C, F)         row-parallel
};
inline constexpr int kLinearSlots = 11;
inline constexpr EnumName<LinearSlot> kLinearSlotNames[] = {
    {LinearSlot::qkv, "qkv"},   {LinearSlot::attn_out, "attn-out"},
    {LinearSlot::mlp_up, "mlp-up"}, {LinearSlot::mlp_down, "mlp-down"},
    {LinearSlot::q, "q"},       {LinearSlot::k, "k"},
    {LinearSlot::v, "v"},       {LinearSlot::o, "o"},
    {LinearSlot::gate, "gate"}, {LinearSlot::up, "up"},
    {LinearSlot::down, "down"},
};
constexpr std::span<const EnumName<LinearSlot>> enum_names(LinearSlot) { return kLinearSlotNames; }

// A set of slots, written in the parameter file as a comma-separated list
// of their names ("qkv,mlp-down"; any order, spaces allowed).
struct LinearSlots {
  unsigned bits = 0;

  // Every linear layer of a block of `arch`.
  static constexpr LinearSlots of(ModelArch arch) {
    return arch == ModelArch::gpt2 ? LinearSlots{0xFu} : LinearSlots{0x7Fu << 4};
  }
  bool has(LinearSlot s) const { return (bits >> static_cast<int>(s)) & 1u; }
  void add(LinearSlot s) { bits |= 1u << static_cast<int>(s); }
  bool empty() const { return bits == 0; }
  // The slots of this set that `arch` does not have.
  LinearSlots outside(ModelArch arch) const { return {bits & ~of(arch).bits}; }
  auto operator<=>(const LinearSlots&) const = default;
};

// "qkv,attn-out": the names of the slots in table order.
std::string slots_text(LinearSlots s);
// The list's slots; false (and `bad` = the first unknown item, possibly
// empty) when an item names no slot. An empty list parses to an empty set.
bool parse_slots(const std::string& text, LinearSlots& out, std::string& bad);

}  // namespace meshlm
