// GPT: building one rank's shard — its table, flat buffers and weights, and
// the frozen base under LoRA.
#include "model/gpt.h"

#include <cstring>

#include "comm/comm.h"
#include "core/error.h"
#include "core/kept.h"

namespace meshlm {

std::vector<ParamSpec> trainable_table(const GPTConfig& cfg, const ModelShard& shard,
                                       const GPTOptions& opts) {
  return opts.lora.enabled ? lora_param_table(cfg, shard, opts.lora) : model_param_table(cfg, shard);
}

std::shared_ptr<const std::vector<ParamSpec>> shared_trainable_table(const GPTConfig& cfg,
                                                                     const ModelShard& shard,
                                                                     const GPTOptions& opts) {
  if (!opts.lora.enabled) return shared_param_table(cfg, shard);
  // Kept as shared_param_table keeps the model's tables.
  thread_local KeptValues<std::pair<GPTConfig, LoraOptions>, ModelShard,
                          std::shared_ptr<const std::vector<ParamSpec>>>
      kept(kKeptTables);
  return kept.get({cfg, opts.lora}, shard, [&] {
    return std::make_shared<const std::vector<ParamSpec>>(lora_param_table(cfg, shard, opts.lora));
  });
}

GPT::GPT(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts,
         comm::Communicator* tp)
    : cfg_(cfg),
      shard_(shard),
      opts_(opts),
      k_(opts.kernels != nullptr ? opts.kernels : &ops::Kernels::cpu()),
      dq_(opts.dequantizer != nullptr ? opts.dequantizer : &quant::Dequantizer::cpu()),
      tp_(tp, nullptr) {
  cfg_.validate();
  llama_ = cfg_.arch == ModelArch::llama;
  if (shard_.layer_end < 0) shard_.layer_end = cfg_.n_layer;
  MESHLM_CHECK(shard_.tp_size == 1 || (tp != nullptr && tp->size() == shard_.tp_size),
               "tensor parallelism needs its group");
  MESHLM_CHECK(cfg_.n_head % shard_.tp_size == 0, "heads must split evenly over TP");
  MESHLM_CHECK(cfg_.padded_vocab_size() % shard_.tp_size == 0, "vocabulary must split over TP");
  MESHLM_CHECK(opts_.slots >= 1 && opts_.pad_multiple >= 1, "bad GPT options");
  MESHLM_CHECK(opts_.attention != Attention::automatic,
               "GPTOptions::attention must be probabilities or flash (auto is resolved earlier)");
  MESHLM_CHECK(opts_.attention != Attention::flash ||
                   k_->supports_flash_attention(cfg_.n_embd / cfg_.n_head),
               "train.attention = flash: this backend has no flash attention for a head size of " +
                   std::to_string(cfg_.n_embd / cfg_.n_head) + " at " +
                   std::string(name_of(k_->precision())));
  MESHLM_CHECK(!opts_.lora.enabled || dq_->device() == k_->device(),
               "LoRA: the dequantizer and the kernels are of two backends");
  base_table_ = model_param_table(cfg_, shard_);
  table_ = opts_.lora.enabled ? lora_param_table(cfg_, shard_, opts_.lora) : base_table_;
  n_local_ = shard_.layer_end - shard_.layer_begin;

  // Where each tensor the forward needs sits in the tables, by role.
  block_range_.assign(n_local_, {0, 0});
  linear_index_.assign(n_local_, {});
  for (size_t i = 0; i < base_table_.size(); ++i) {
    const ParamSpec& p = base_table_[i];
    switch (p.role) {
      case ParamRole::token_embedding: idx_wte_ = static_cast<int>(i); break;
      case ParamRole::position_embedding: idx_wpe_ = static_cast<int>(i); break;
      case ParamRole::lnf_weight: idx_lnfw_ = static_cast<int>(i); break;
      case ParamRole::lnf_bias: idx_lnfb_ = static_cast<int>(i); break;
      case ParamRole::lm_head: idx_lm_head_ = static_cast<int>(i); break;
      case ParamRole::linear_weight:
        linear_index_[p.layer - shard_.layer_begin][static_cast<int>(*p.slot)] = i;
        break;
      default: break;
    }
    if (p.layer >= 0) {
      auto& r = block_range_[p.layer - shard_.layer_begin];
      if (r.first == r.second) r.first = i;
      r.second = i + 1;
    }
  }
  idx_cls_ = cfg_.tied_classifier() ? idx_wte_ : idx_lm_head_;
  adapter_.assign(n_local_, {});
  for (size_t i = 0; i < table_.size() && opts_.lora.enabled; ++i) {
    const ParamSpec& p = table_[i];
    AdapterIndex& ai = adapter_[p.layer - shard_.layer_begin][static_cast<int>(*p.slot)];
    (p.role == ParamRole::lora_a ? ai.a : ai.b) = static_cast<int>(i);
  }

  num_params_ = table_numel(table_);
  padded_params_ = (num_params_ + opts_.pad_multiple - 1) / opts_.pad_multiple * opts_.pad_multiple;
  params_ = Buffer(padded_params_ * sizeof(float), MemCategory::params,
                   opts_.lora.enabled ? "lora.params" : "gpt.params", k_->device());
  if (opts_.own_grads)
    grads_ = Buffer(padded_params_ * sizeof(float), MemCategory::grads,
                    opts_.lora.enabled ? "lora.grads" : "gpt.grads", k_->device());
}

size_t GPT::frozen_numel(const GPTConfig& cfg, const ModelShard& shard) {
  size_t n = 0;
  const auto table = shared_param_table(cfg, shard);
  for (const ParamSpec& p : *table)
    if (p.shape.ndim == 1) n += p.numel();
  return n;
}

size_t GPT::quantized_matrix_bytes(const GPTConfig& cfg, const ModelShard& shard,
                                   quant::QuantType type) {
  size_t bytes = 0;
  const auto table = shared_param_table(cfg, shard);
  for (const ParamSpec& p : *table)
    if (p.shape.ndim != 1)
      bytes += quant::qlayout(type, static_cast<size_t>(p.full_shape.numel())).total_bytes;
  return bytes;
}

void GPT::attach_base(const std::function<quant::QTensor(const ParamSpec&)>& tensor_of) {
  MESHLM_CHECK(opts_.lora.enabled, "attach_base() is for LoRA fine-tuning (a frozen base)");
  qbase_.assign(base_table_.size(), quant::QSlice{});
  frozen_offset_.assign(base_table_.size(), SIZE_MAX);
  size_t n = 0;
  for (size_t i = 0; i < base_table_.size(); ++i)
    if (base_table_[i].shape.ndim == 1) {
      frozen_offset_[i] = n;
      n += base_table_[i].numel();
    }
  const bool host = k_->device() == Device::cpu;
  frozen_ = Buffer(n * sizeof(float), MemCategory::params, "lora.frozen_vectors", k_->device());
  // On a GPU: one device buffer for the quantized matrices, each at a
  // multiple of kQAlign bytes, as in the host store.
  std::vector<quant::QTensor> host_q(base_table_.size());
  size_t device_bytes = 0;
  std::optional<quant::QuantType> type;
  for (size_t i = 0; i < base_table_.size(); ++i) {
    const ParamSpec& p = base_table_[i];
    host_q[i] = tensor_of(p);
    MESHLM_CHECK(host_q[i].n == static_cast<size_t>(p.full_shape.numel()),
                 "the frozen base's " + p.name + " has the wrong size");
    if (p.shape.ndim == 1) continue;
    device_bytes += quant::qlayout(host_q[i].type, host_q[i].n).total_bytes;
    if (!type) type = host_q[i].type;
  }
  if (!host && type) {
    // As the memory prediction has it (the store holds one format).
    MESHLM_CHECK(device_bytes == quantized_matrix_bytes(cfg_, shard_, *type),
                 "the frozen base's matrices are not all of one format");
    qdevice_ = Buffer(device_bytes, MemCategory::quantized, "lora.base_on_device", k_->device());
  }
  std::vector<float> whole, part;
  size_t at = 0;
  for (size_t i = 0; i < base_table_.size(); ++i) {
    const ParamSpec& p = base_table_[i];
    quant::QTensor q = host_q[i];
    if (p.shape.ndim == 1) {
      whole.resize(q.n);
      quant::dequantize_ref(q, 0, q.n, whole.data());
      part.resize(p.numel());
      shard_from_full(p, whole.data(), part.data(), shard_.tp_rank, shard_.tp_size);
      k_->upload(frozen_.as<float>() + frozen_offset_[i], part.data(), part.size() * sizeof(float));
      continue;
    }
    if (!host) {
      const quant::QLayout layout = quant::qlayout(q.type, q.n);
      uint8_t* dst = static_cast<uint8_t*>(qdevice_.data()) + at;
      for (int a = 0; a < layout.narrays; ++a) {
        const quant::QArray& arr = layout.arrays[a];
        const void* src = quant::qarray_data(q, arr.name);
        MESHLM_CHECK(src != nullptr, "the frozen base's " + p.name + " has no " + arr.name + " array");
        k_->upload(dst + arr.offset, src, arr.bytes());
      }
      q = quant::qtensor_at(layout, dst);
      at += layout.total_bytes;
    }
    qbase_[i] = quant::make_qslice(q, p.full_shape.dims[0], p.full_shape.dims[1], p.tp_dim,
                                   p.tp_parts, shard_.tp_rank, shard_.tp_size);
  }
}

const quant::QSlice* GPT::qbase(size_t i) const {
  // Vectors (and every tensor in full training) have no slice: R == 0.
  return i < qbase_.size() && qbase_[i].R > 0 ? &qbase_[i] : nullptr;
}

const ParamSpec& GPT::spec(const std::string& name) const {
  for (const auto& p : table_)
    if (p.name == name) return p;
  throw RankError("no parameter named '" + name + "' in this rank's table", MESHLM_HERE);
}

std::span<float> GPT::view(float* base, const std::string& name) const {
  const TensorView t = spec(name).in(base);
  return {t.as<float>(), static_cast<size_t>(t.numel())};
}

namespace {
// The field of BlockTensors that holds a block tensor of this role.
float* BlockTensors::*block_field(const ParamSpec& p) {
  static constexpr float* BlockTensors::*kWeight[kLinearSlots] = {
      &BlockTensors::qkvw, &BlockTensors::attprojw, &BlockTensors::fcw,
      &BlockTensors::fcprojw, &BlockTensors::qw, &BlockTensors::kw,
      &BlockTensors::vw, &BlockTensors::ow, &BlockTensors::gatew,
      &BlockTensors::upw, &BlockTensors::downw};
  // (Only GPT-2's linear layers have biases.)
  static constexpr float* BlockTensors::*kBias[kLinearSlots] = {
      &BlockTensors::qkvb, &BlockTensors::attprojb, &BlockTensors::fcb, &BlockTensors::fcprojb};
  switch (p.role) {
    case ParamRole::ln1_weight: return &BlockTensors::ln1w;
    case ParamRole::ln1_bias: return &BlockTensors::ln1b;
    case ParamRole::ln2_weight: return &BlockTensors::ln2w;
    case ParamRole::ln2_bias: return &BlockTensors::ln2b;
    case ParamRole::linear_weight: return kWeight[static_cast<int>(*p.slot)];
    case ParamRole::linear_bias: return kBias[static_cast<int>(*p.slot)];
    default: MESHLM_CHECK(false, p.name + " is not a tensor of a transformer block");
  }
  return nullptr;
}
}  // namespace

BlockTensors GPT::block_tensors(int l, const std::function<float*(size_t)>& at) const {
  BlockTensors t{};
  for (size_t i = block_range_[l].first; i < block_range_[l].second; ++i)
    t.*block_field(base_table_[i]) = at(i);
  return t;
}

GPTTensors GPT::tensors(float* base) const {
  // Full training: the flat buffer. LoRA: frozen vectors; matrices are null
  // (they are quantized, see qbase()).
  auto at = [&](size_t i) -> float* {
    if (!opts_.lora.enabled) return base + table_[i].offset;
    return frozen_offset_[i] == SIZE_MAX ? nullptr : frozen_.as<float>() + frozen_offset_[i];
  };
  GPTTensors t;
  if (idx_wte_ >= 0) t.wte = at(idx_wte_);
  if (idx_wpe_ >= 0) t.wpe = at(idx_wpe_);
  for (int l = 0; l < n_local_; ++l) t.blocks.push_back(block_tensors(l, at));
  if (idx_lnfw_ >= 0) t.lnfw = at(idx_lnfw_);
  if (idx_lnfb_ >= 0) t.lnfb = at(idx_lnfb_);
  if (idx_cls_ >= 0) t.cls = at(idx_cls_);
  return t;
}

float* GPT::grad_at(size_t index) {
  return opts_.own_grads ? grads() + table_[index].offset : grad_where_(index);
}

void GPT::set_grad_target(std::function<float*(size_t)> where, std::function<void(int)> block_done) {
  MESHLM_CHECK(!opts_.own_grads, "set_grad_target() needs GPTOptions::own_grads = false");
  grad_where_ = std::move(where);
  block_done_ = std::move(block_done);
}

void GPT::set_wte_grad_blocks(float* buffer, int rows, std::function<void(int, int)> done) {
  MESHLM_CHECK(grad_where_ != nullptr, "set_wte_grad_blocks() needs set_grad_target() first");
  MESHLM_CHECK(buffer != nullptr && rows > 0, "set_wte_grad_blocks() needs a buffer of rows");
  wte_block_ = buffer;
  wte_block_rows_ = rows;
  wte_block_done_ = std::move(done);
}

namespace {
// Whether set_weights writes `p` straight into place, whole.
bool set_in_place(const ParamSpec& p, int tp_size, bool host) {
  return host && (p.tp_dim < 0 || tp_size == 1);
}
int64_t weight_block_rows(const ParamSpec& p) {
  return rows_per_block(p, GPT::kWeightBlockBytes / sizeof(float));
}
}  // namespace

size_t GPT::weight_block_bytes(const std::vector<ParamSpec>& table, int tp_size, bool host) {
  size_t most = 0;
  for (const ParamSpec& p : table)
    if (!set_in_place(p, tp_size, host))
      most = std::max(most, static_cast<size_t>(weight_block_rows(p)) * row_floats(p));
  return most * sizeof(float);
}

void GPT::set_weights(const RowsOf& value_of) {
  float* base = params();
  const bool host = k_->device() == Device::cpu;
  // One block of rows of the logical tensor at a time; this rank keeps (or,
  // on a GPU, uploads) the runs of it that are its part.
  Buffer block(weight_block_bytes(table_, shard_.tp_size, host), MemCategory::workspace,
               "gpt.weight_rows");
  for (const ParamSpec& p : table_) {
    const int64_t rows = p.full_shape[0];
    if (set_in_place(p, shard_.tp_size, host)) {
      value_of(p, 0, rows, base + p.offset);
      continue;
    }
    const int64_t step = weight_block_rows(p);
    float* x = block.as<float>();
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t nr = std::min(step, rows - r0);
      value_of(p, r0, nr, x);
      for_each_part_run(p, r0, nr, shard_.tp_rank, shard_.tp_size,
                        [&](size_t from, size_t to, size_t n) {
                          if (host)
                            std::memcpy(base + p.offset + to, x + from, n * sizeof(float));
                          else
                            k_->upload(base + p.offset + to, x + from, n * sizeof(float));
                        });
    }
  }
}

std::vector<float> GPT::host_params() const {
  std::vector<float> out(num_params_);
  k_->download(out.data(), params(), num_params_ * sizeof(float));
  return out;
}

void GPT::init_weights(uint64_t seed) {
  set_weights([&](const ParamSpec& p, int64_t row0, int64_t nrows, float* x) {
    init_tensor_rows(cfg_, p, seed, row0, nrows, x);
  });
}

void GPT::ensure_activations(int B, int Tn) {
  if (B == B_ && Tn == T_) return;
  MESHLM_CHECK(Tn <= cfg_.max_seq_len, "sequence longer than the position table");
  act_buf_ = Buffer();
  grad_act_buf_ = Buffer();
  ActLayout L;
  plan_activations(cfg_, shard_, opts_, B, Tn, L);
  act_buf_ = Buffer(L.act_floats * sizeof(float), MemCategory::activations, "gpt.activations",
                    k_->device());
  grad_act_buf_ = Buffer(L.grad_floats * sizeof(float), MemCategory::activations,
                         "gpt.activation_grads", k_->device());
  L.bind(act_buf_.as<float>(), grad_act_buf_.as<float>(), opts_.checkpointing);
  slots_ = std::move(L.slots);
  gacts_ = L.g;
  B_ = B;
  T_ = Tn;
  if (llama_) fill_rope_tables(Tn);
}

void GPT::fill_rope_tables(int Tn) {
  const int HS = cfg_.head_size();
  std::vector<float> inv(HS / 2), cos(static_cast<size_t>(Tn) * HS / 2), sin(cos.size());
  ops::rope_inv_freq(inv.data(), HS, cfg_.rope_theta, cfg_.rope_scaling);
  ops::rope_tables(cos.data(), sin.data(), inv.data(), Tn, HS);
  k_->upload(gacts_.rope_cos, cos.data(), cos.size() * sizeof(float));
  k_->upload(gacts_.rope_sin, sin.data(), sin.size() * sizeof(float));
}

float* GPT::stage_input(int slot) { return slots_.at(slot).input; }

const float* GPT::stage_output(int slot) const {
  const SlotActs& s = slots_.at(slot);
  return s.blocks.empty() ? s.input : s.blocks.back().res3;
}

void GPT::zero_grads() {
  if (opts_.own_grads) k_->zero(grads(), padded_params_);
}

}  // namespace meshlm
