#include "model/lora.h"

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "ops/blas.h"

namespace meshlm {

namespace {
constexpr const char* kTargetNames[kLoraTargets] = {"qkv", "attn-out", "mlp-up", "mlp-down"};
constexpr const char* kTargetTensors[kLoraTargets] = {"attn.c_attn.weight", "attn.c_proj.weight",
                                                     "mlp.c_fc.weight", "mlp.c_proj.weight"};
// Adapter streams are kept apart from the base model's (seeded by table index).
constexpr uint64_t kLoraSeedSalt = 0x4c6f5241'00000000ull;
}  // namespace

std::string lora_base_name(int layer, int target) {
  return "h." + std::to_string(layer) + "." + kTargetTensors[target];
}

unsigned parse_lora_targets(const std::string& s) {
  unsigned bits = 0;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    int found = -1;
    for (int t = 0; t < kLoraTargets; ++t)
      if (item == kTargetNames[t]) found = t;
    if (found < 0)
      throw CollectiveError("finetune.lora_targets: unknown target '" + item +
                                "' (a comma-separated list of qkv, attn-out, mlp-up, mlp-down)",
                            MESHLM_HERE);
    bits |= 1u << found;
  }
  if (bits == 0)
    throw CollectiveError("finetune.lora_targets must name at least one of qkv, attn-out, mlp-up, mlp-down",
                          MESHLM_HERE);
  return bits;
}

std::string lora_targets_text(unsigned targets) {
  std::string s;
  for (int t = 0; t < kLoraTargets; ++t) {
    if (!(targets & (1u << t))) continue;
    if (!s.empty()) s += ',';
    s += kTargetNames[t];
  }
  return s;
}

std::vector<ParamSpec> lora_param_table(const GPTConfig& cfg, const ModelShard& shard,
                                        const LoraOptions& lora) {
  MESHLM_CHECK(lora.rank >= 1, "LoRA rank must be >= 1");
  const std::vector<ParamSpec> full = gpt_param_table(cfg);
  const int tp = shard.tp_size, le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  const int64_t r = lora.rank;
  TableBuilder t(tp);  // index: position in the whole model's adapter table
  for (const ParamSpec& w : full) {
    if (w.layer < 0) continue;
    int target = -1;
    for (int k = 0; k < kLoraTargets; ++k)
      if (w.name == lora_base_name(w.layer, k)) target = k;
    if (target < 0 || !(lora.targets & (1u << target))) continue;
    const int64_t OC = w.full_shape.dims[0], IC = w.full_shape.dims[1];
    const bool mine = shard.layer_begin <= w.layer && w.layer < le;
    const bool column_parallel = w.tp_dim == 0;
    t.add(w.name + ".lora_A", {r, IC}, column_parallel ? -1 : 1, 1, w.layer, mine);
    t.add(w.name + ".lora_B", {OC, r}, column_parallel ? 0 : -1, column_parallel ? w.tp_parts : 1,
        w.layer, mine);
  }
  return t.take();
}

void lora_init_tensor(const ParamSpec& spec, uint64_t seed, float* out) {
  const size_t n = static_cast<size_t>(spec.full_shape.numel());
  if (spec.name.ends_with(".lora_B")) {
    for (size_t i = 0; i < n; ++i) out[i] = 0.0f;
    return;
  }
  // Kaiming-uniform with a = sqrt(5), as torch.nn.Linear and PEFT: bound 1/sqrt(IC).
  const double bound = 1.0 / std::sqrt(static_cast<double>(spec.full_shape.dims[1]));
  Rng rng(Rng::mix_seed(seed ^ kLoraSeedSalt, static_cast<uint64_t>(spec.index)));
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(bound * (2.0 * rng.uniform() - 1.0));
}

void lora_forward(float* out, const float* inp, const float* A, const float* B, float s, int N,
                  int IC, int OC, int r, float* u) {
  ops::gemm(false, true, N, r, IC, 1.0f, inp, IC, A, IC, 0.0f, u, r);    // u = inp A^T
  ops::gemm(false, true, N, OC, r, s, u, r, B, r, 1.0f, out, OC);        // out += s u B^T
}

void lora_backward(float* dinp, float* dA, float* dB, const float* dout, const float* inp,
                   const float* A, const float* B, float s, int N, int IC, int OC, int r, float* u,
                   float* du) {
  ops::gemm(false, true, N, r, IC, 1.0f, inp, IC, A, IC, 0.0f, u, r);    // u = inp A^T
  if (dB) ops::gemm(true, false, OC, r, N, s, dout, OC, u, r, 1.0f, dB, r);  // dB += s dout^T u
  ops::gemm(false, false, N, r, OC, s, dout, OC, B, r, 0.0f, du, r);     // du = s dout B
  if (dA) ops::gemm(true, false, r, IC, N, 1.0f, du, r, inp, IC, 1.0f, dA, IC);  // dA += du^T inp
  if (dinp) ops::gemm(false, false, N, IC, r, 1.0f, du, r, A, IC, 1.0f, dinp, IC);  // dinp += du A
}

}  // namespace meshlm
