#include "train/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/mpi_comm.h"
#include "load/base_source.h"
#include "comm/errors.h"
#include "core/error.h"
#include "plan/rank_plan.h"

namespace meshlm {

RankPlan Engine::plan_of(const RunConfig& cfg, const MeshCoords& c) {
  return plan_rank(cfg.model, cfg.parallel, cfg.finetune, cfg.train.micro_batch_size,
                   cfg.train.seq_len, c);
}

Engine::Engine(const RunConfig& cfg, const ProcessMesh& mesh, SectionTimers& timers,
               const load::FrozenBase* base)
    : cfg_(cfg), mesh_(mesh), timers_(timers) {
  tp_ = comm::make_mpi_communicator(mesh.tp());
  dp_ = comm::make_mpi_communicator(mesh.dp());
  pp_send_ = comm::make_mpi_communicator(mesh.pp());
  pp_recv_ = comm::make_mpi_communicator(mesh.pp());
  world_ = comm::make_mpi_communicator(mesh.world());
  if (mesh.embedding() != MPI_COMM_NULL) emb_ = comm::make_mpi_communicator(mesh.embedding());
  const MeshCoords c = mesh.coords();
  shape_ = plan_of(cfg, c);
  m_ = cfg.parallel.micro_batches;
  B_ = cfg.train.micro_batch_size;
  T_ = cfg.train.seq_len;
  schedule_ = build_schedule(cfg.parallel.schedule, c.pp, cfg.parallel.pp, m_);
  zero_ = zero_layout(cfg.model, shape_);

  model_ = std::make_unique<GPT>(cfg.model, shape_.shard, shape_.model,
                                 shape_.shard.tp_size > 1 ? tp_.get() : nullptr);
  model_->set_timers(&timers_);
  if (model_->lora()) {
    MESHLM_CHECK(base != nullptr, "finetune.mode = lora needs the frozen base model");
    model_->attach_base([base](const ParamSpec& p) { return base->tensor(p.name); });
  }
  model_->init_weights(cfg.train.seed);
  if (!model_->lora() && !cfg.quant.base.empty()) load_base_params();
  // Activations up front: the pipeline receives into them before the first
  // forward, and the memory is all there from the start.
  model_->ensure_activations(B_, T_);

  if (shape_.zero_stage == 0) {
    own_begin_ = 0;
    own_end_ = zero_.n;
  } else {
    own_begin_ = static_cast<size_t>(c.dp) * zero_.shard;
    own_end_ = own_begin_ + zero_.shard;
  }
  opt_ = std::make_unique<AdamW>(model_->table(), cfg.train.adamw, own_begin_, own_end_);

  if (shape_.zero_stage == 2) {
    // Gradients: the owned shard, one block's bucket, and the tensors
    // outside the blocks (reduced at the end of the step, after the tied
    // embedding's sum between stages).
    const auto& table = model_->table();
    shard_grads_ = Buffer(zero_.shard * sizeof(float), MemCategory::grads, "zero2.shard_grads");
    bucket_ = Buffer(largest_block_numel(table) * sizeof(float), MemCategory::grads, "zero2.bucket");
    edge_grads_ = Buffer(edge_numel(table) * sizeof(float), MemCategory::grads, "zero2.edge_grads");
    edge_offset_.assign(table.size(), 0);
    size_t e = 0;
    for (size_t i = 0; i < table.size(); ++i) {
      const ParamSpec& p = table[i];
      if (p.layer < 0) {
        edge_offset_[i] = e;
        e += p.numel();
        continue;
      }
      const size_t l = p.layer - shape_.shard.layer_begin;
      if (block_range_.size() <= l) block_range_.resize(l + 1, {p.offset, p.offset});
      block_range_[l].second = p.offset + p.numel();
    }
    model_->set_grad_target(
        [this](size_t i) {
          const ParamSpec& p = model_->table()[i];
          if (p.layer < 0) return edge_grads_.as<float>() + edge_offset_[i];
          const auto& r = block_range_[p.layer - shape_.shard.layer_begin];
          return bucket_.as<float>() + (p.offset - r.first);
        },
        [this](int layer) {
          const auto& r = block_range_[layer - shape_.shard.layer_begin];
          reduce_to_owners(bucket_.as<float>(), r.first, r.second);
          std::memset(bucket_.data(), 0, (r.second - r.first) * sizeof(float));
        });
  }
  if (!shape_.shard.first_stage)
    send_back_ = Buffer(static_cast<size_t>(shape_.model.slots) * B_ * T_ * cfg.model.n_embd *
                            sizeof(float),
                        MemCategory::comm, "pipeline.send_back");
  fwd_sends_.resize(shape_.model.slots);
  bwd_sends_.resize(shape_.model.slots);
}

Engine::~Engine() = default;

void Engine::load_base_params() {
  // Full training from given weights: every rank reads the logical tensors
  // of its shard, one at a time, and keeps its part.
  try_all(mesh_.world(), "quant.base: ", [&] {
    std::unique_ptr<load::BaseSource> src =
        load::open_base_source(cfg_.quant.base, cfg_.model, cfg_.train.seed);
    model_->set_weights([&](const ParamSpec& p, float* x) { src->read(p, x); });
  }, MESHLM_HERE);
}

void Engine::reduce_to_owners(float* src, size_t a, size_t b) {
  ScopedTimer t(timers_, Section::dp_comm);
  const size_t S = zero_.shard;
  const int me = dp_->rank();
  for (int k = 0; k < dp_->size(); ++k) {
    const size_t lo = std::max(a, k * S), hi = std::min(b, (k + 1) * S);
    if (lo >= hi) continue;
    float* part = src + (lo - a);
    float* owned = shard_grads_.as<float>() + (lo - k * S);
    // The owner adds what it accumulated so far to its own contribution, so
    // the reduction lands straight in the shard.
    if (me == k)
      for (size_t i = 0; i < hi - lo; ++i) part[i] += owned[i];
    dp_->reduce(part, owned, hi - lo, DType::f32, comm::ReduceOp::sum, k).wait();
  }
}

void Engine::run_schedule(const int32_t* tokens, const int32_t* targets, int step_number,
                          double& loss_sum) {
  const size_t BT = static_cast<size_t>(B_) * T_;
  const size_t act = BT * cfg_.model.n_embd;
  const int stage = mesh_.coords().pp;
  const int slots = shape_.model.slots;
  const float scale = 1.0f / static_cast<float>(m_ * cfg_.parallel.dp);
  for (const Action& a : schedule_) {
    // In-flight micro-batches are consecutive, so micro % slots never
    // collides with one still in flight.
    const int slot = a.micro % slots;
    switch (a.kind) {
      case ActionKind::recv_forward: {
        ScopedTimer t(timers_, Section::pp_comm);
        pp_recv_->recv(model_->stage_input(slot), act, DType::f32, stage - 1).wait();
        break;
      }
      case ActionKind::forward: {
        {
          ScopedTimer t(timers_, Section::pp_comm);
          fwd_sends_[slot].wait();  // the slot's output is about to be overwritten
        }
        ScopedTimer t(timers_, Section::forward);
        if (cfg_.debug.fail_rank == mesh_.rank() && cfg_.debug.fail_step == step_number)
          throw RankError("failure injected by debug.fail_rank = " +
                              std::to_string(cfg_.debug.fail_rank) + " at step " +
                              std::to_string(step_number),
                          MESHLM_HERE);
        loss_sum += model_->forward(slot, tokens + a.micro * BT, targets + a.micro * BT, B_, T_);
        break;
      }
      case ActionKind::send_forward: {
        ScopedTimer t(timers_, Section::pp_comm);
        fwd_sends_[slot] = pp_send_->send(model_->stage_output(slot), act, DType::f32, stage + 1);
        break;
      }
      case ActionKind::recv_backward: {
        ScopedTimer t(timers_, Section::pp_comm);
        pp_recv_->recv(model_->grad_stream(), act, DType::f32, stage + 1).wait();
        break;
      }
      case ActionKind::backward: {
        ScopedTimer t(timers_, Section::backward);
        model_->backward(slot, scale);
        break;
      }
      case ActionKind::send_backward: {
        ScopedTimer t(timers_, Section::pp_comm);
        bwd_sends_[slot].wait();
        float* buf = send_back_.as<float>() + slot * act;
        std::memcpy(buf, model_->grad_stream(), act * sizeof(float));
        bwd_sends_[slot] = pp_send_->send(buf, act, DType::f32, stage - 1);
        break;
      }
    }
  }
  ScopedTimer t(timers_, Section::pp_comm);
  for (auto& h : fwd_sends_) h.wait();
  for (auto& h : bwd_sends_) h.wait();
}

void Engine::reduce_gradients() {
  // wte, where the stage holds it, is the first tensor of the table.
  const bool has_wte = model_->has("wte.weight");
  const size_t wte_n = has_wte ? model_->table()[0].numel() : 0;
  float* wte_grad = nullptr;
  if (has_wte)
    wte_grad = shape_.zero_stage == 2 ? edge_grads_.as<float>() + edge_offset_[0] : model_->grads();
  // The first and last stage hold the same wte: sum their gradients.
  if (has_wte && emb_ && emb_->size() > 1) {
    ScopedTimer t(timers_, Section::pp_comm);
    emb_->all_reduce(wte_grad, wte_grad, wte_n, DType::f32, comm::ReduceOp::sum).wait();
  }
  ScopedTimer t(timers_, Section::dp_comm);
  switch (shape_.zero_stage) {
    case 0:
      if (dp_->size() > 1)
        dp_->all_reduce(model_->grads(), model_->grads(), zero_.n, DType::f32, comm::ReduceOp::sum)
            .wait();
      break;
    case 1: {
      float* g = model_->grads();
      dp_->reduce_scatter(g, g + own_begin_, zero_.shard, DType::f32, comm::ReduceOp::sum).wait();
      break;
    }
    case 2: {
      const auto& table = model_->table();
      for (size_t i = 0; i < table.size(); ++i)
        if (table[i].layer < 0)
          reduce_to_owners(edge_grads_.as<float>() + edge_offset_[i], table[i].offset,
                           table[i].offset + table[i].numel());
      break;
    }
  }
}

double Engine::clip_owned(double max_norm) {
  // The gradients this rank updates: [own_begin_, own_end_).
  float* g = shape_.zero_stage == 2 ? shard_grads_.as<float>() : model_->grads() + own_begin_;
  // Each logical element counts once in the norm: replicated tensors on TP
  // rank 0 only, the tied wte on the first stage only, and under ZeRO 0 (where
  // every DP rank holds all gradients) on DP rank 0 only.
  double local = 0;
  const MeshCoords c = mesh_.coords();
  if (shape_.zero_stage > 0 || c.dp == 0) {
    for (const ParamSpec& p : model_->table()) {
      const size_t lo = std::max(p.offset, own_begin_);
      const size_t hi = std::min(p.offset + p.numel(), own_end_);
      if (lo >= hi) continue;
      if (p.tp_dim < 0 && c.tp > 0) continue;
      if (p.name == "wte.weight" && !shape_.shard.first_stage) continue;
      local += sum_of_squares(g + (lo - own_begin_), hi - lo);
    }
  }
  double total = 0;
  {
    ScopedTimer t(timers_, Section::dp_comm);
    world_->all_reduce(&local, &total, 1, DType::f64, comm::ReduceOp::sum).wait();
  }
  const double norm = std::sqrt(total);
  clip_to_norm(g, own_end_ - own_begin_, norm, max_norm);
  return norm;
}

StepResult Engine::step(const int32_t* tokens, const int32_t* targets, float lr, int step_number) {
  model_->zero_grads();
  if (shape_.zero_stage == 2) {
    std::memset(shard_grads_.data(), 0, shard_grads_.bytes());
    std::memset(edge_grads_.data(), 0, edge_grads_.bytes());
  }
  double loss_sum = 0;
  run_schedule(tokens, targets, step_number, loss_sum);
  reduce_gradients();

  StepResult r;
  {
    ScopedTimer t(timers_, Section::optimizer);
    r.grad_norm = clip_owned(cfg_.train.grad_clip);
    const float* g = shape_.zero_stage == 2 ? shard_grads_.as<float>() : model_->grads() + own_begin_;
    opt_->step(model_->params(), g, lr);
  }
  if (shape_.zero_stage > 0) {
    ScopedTimer t(timers_, Section::dp_comm);
    float* p = model_->params();
    dp_->all_gather(p + own_begin_, p, zero_.shard, DType::f32).wait();
  }
  // The loss lives on the last stage; one rank per DP replica contributes.
  const MeshCoords c = mesh_.coords();
  double mine = (shape_.shard.last_stage && c.tp == 0) ? loss_sum / m_ : 0.0, sum = 0;
  world_->all_reduce(&mine, &sum, 1, DType::f64, comm::ReduceOp::sum).wait();
  r.loss = sum / cfg_.parallel.dp;
  return r;
}

std::vector<float> Engine::gather_params() {
  // Every rank of DP replica 0 sends its shard to world rank 0, which puts
  // each tensor's part into the logical tensor. Collective over the world.
  const MeshLayout& layout = mesh_.layout();
  const std::vector<ParamSpec> full_table = trainable_table(cfg_.model, {}, shape_.model);
  std::vector<float> full;
  const MeshCoords me = mesh_.coords();
  if (mesh_.rank() != 0) {
    if (me.dp == 0) world_->send(model_->params(), model_->num_params(), DType::f32, 0).wait();
    return full;
  }
  full.assign(table_numel(full_table), 0.0f);
  std::vector<float> part;
  for (int r = 0; r < layout.world(); ++r) {
    const MeshCoords c = layout.coords(r);
    if (c.dp != 0) continue;
    const RankPlan s = plan_of(cfg_, c);
    const std::vector<ParamSpec> table = trainable_table(cfg_.model, s.shard, s.model);
    const float* src = model_->params();
    if (r != 0) {
      part.resize(table_numel(table));
      world_->recv(part.data(), part.size(), DType::f32, r).wait();
      src = part.data();
    }
    for (const ParamSpec& p : table) {
      float* dst = full.data() + full_table[p.index].offset;
      if (p.name == "wte.weight" && !s.shard.first_stage) {
        // The tied wte of the last stage must equal the first stage's, bit
        // for bit (stage 0 comes first in rank order, so it is already here).
        std::vector<float> copy(full_table[p.index].numel());
        std::copy(dst, dst + copy.size(), copy.begin());
        shard_to_full(p, src + p.offset, copy.data(), c.tp, s.shard.tp_size);
        if (!std::equal(copy.begin(), copy.end(), dst))
          throw RankError("the tied wte.weight of the last pipeline stage (rank " +
                              std::to_string(r) + ") differs from the first stage's",
                          MESHLM_HERE);
        continue;
      }
      shard_to_full(p, src + p.offset, dst, c.tp, s.shard.tp_size);
    }
  }
  return full;
}

}  // namespace meshlm
