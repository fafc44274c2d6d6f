#include "train/engine.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "comm/pipeline_links.h"
#include "core/error.h"
#include "core/log.h"
#include "load/base_source.h"
#include "plan/memory.h"
#include "train/backend.h"
#include "train/param_gather.h"
#include "train/report.h"

namespace meshlm {

RankPlan Engine::plan_of(const RunConfig& cfg, const MeshCoords& c) {
  RankPlan r = plan_rank(cfg.model, cfg.parallel, cfg.finetune, cfg.train.micro_batch_size,
                         cfg.train.seq_len, c, cfg.train.attention);
  apply_work_sizes(backend_caps(cfg.runtime.backend),
                   size_t(cfg.model.padded_vocab_size()) / size_t(cfg.parallel.tp), r.model);
  return r;
}

Engine::Engine(const RunConfig& cfg, const ProcessMesh& mesh, SectionTimers& timers,
               const load::FrozenBase* base, const ops::Kernels& kernels,
               const quant::Dequantizer& dequantizer, debug::Faults faults,
               const DeviceRoute& route)
    : cfg_(cfg), mesh_(mesh), timers_(timers), faults_(std::move(faults)),
      scaler_(cfg.train.precision == ops::Precision::fp16, cfg.train.loss_scale) {
  make_communicators(kernels, route);
  const MeshCoords c = mesh.coords();
  shape_ = plan_of(cfg, c);
  shape_.model.kernels = &kernels;
  shape_.model.dequantizer = &dequantizer;
  const int B = cfg.train.micro_batch_size, T = cfg.train.seq_len, m = cfg.parallel.micro_batches;

  model_ = std::make_unique<GPT>(cfg.model, shape_.shard, shape_.model,
                                 shape_.shard.tp_size > 1 ? tp_.get() : nullptr);
  model_->set_timers(&timers_);
  if (model_->lora()) {
    MESHLM_CHECK(base != nullptr, "finetune.mode = lora needs the frozen base model");
    model_->attach_base([base](const ParamSpec& p) { return base->tensor(p); });
  }
  model_->init_weights(cfg.train.seed);
  if (!model_->lora() && !cfg.quant.base.empty()) load_base_params();
  // Activations up front: the pipeline receives into them before the first
  // forward, and the memory is all there from the start.
  model_->ensure_activations(B, T);

  zero_ = std::make_unique<Zero>(shape_.zero_stage, *dp_, *model_, zero_layout(cfg.model, shape_),
                                 zero2_wte_rows(cfg.model, shape_, model_->table()), timers_,
                                 dp_overlap_bytes(cfg, route.paths));
  const auto [opt_begin, opt_end] =
      optimizer_range(model_->table(), shape_, zero_layout(cfg.model, shape_));
  MESHLM_CHECK(opt_begin >= zero_->own_begin() && opt_end <= zero_->own_end(),
               "the optimizer's elements are among those ZeRO gives this rank");
  opt_ = std::make_unique<AdamW>(model_->table(), cfg.train.adamw, opt_begin, opt_end,
                                 model_->kernels());
  if (emb_ && emb_->size() > 1 && shape_.zero_stage == 2 && cfg.model.tied_classifier() &&
      find_role(model_->table(), ParamRole::token_embedding)) {
    // Where wte lies in the first and the last stage's flat buffers.
    auto stage = [&](int pp) {
      const RankPlan r = plan_of(cfg, {0, c.tp, pp});
      const std::vector<ParamSpec> t = trainable_table(cfg.model, r.shard, r.model);
      const ParamSpec* wte = find_role(t, ParamRole::token_embedding);
      MESHLM_CHECK(wte != nullptr, "a stage of the embedding group holds no tied embedding");
      if (pp == 0) {
        tied_.n = wte->numel();
        tied_.piece = zero2_bucket_numel(t, zero2_wte_rows(cfg.model, r, t));
      }
      if (pp == c.pp && world_through_host_) {
        // Through the host: pieces of one block of wte's gradient rows (at
        // most the first stage's bucket; the same on both stages), in a
        // host buffer of that size (plan/memory.h, staged_comm_bytes).
        const size_t block = zero2_wte_block_numel(cfg.model, r, t);
        tied_host_ = Buffer(block * sizeof(float), MemCategory::comm, "zero2.tied_pieces");
      }
      return std::pair{wte->offset, zero_layout(cfg.model, r).shard};
    };
    tied_.first = stage(0);
    tied_.last = stage(cfg.parallel.pp - 1);
    if (tied_host_.data() != nullptr)
      tied_.piece = std::min(tied_.piece, tied_host_.bytes() / sizeof(float));
  }
  pipeline_ = std::make_unique<PipelineRunner>(
      *model_, build_schedule(cfg.parallel.schedule, c.pp, cfg.parallel.pp, m), *pp_send_,
      pp_recv_ ? *pp_recv_ : *pp_send_, B, T, 1.0f / static_cast<float>(m * cfg.parallel.dp),
      timers_, pp_through_host_);
  // The last micro-batch's backward completes each layer's gradients: ZeRO
  // may reduce them as it goes (comm.overlap).
  pipeline_->set_before_backward([this, m](int micro) {
    if (micro == m - 1) zero_->arm();
  });
}

Engine::~Engine() = default;

void Engine::make_communicators(const ops::Kernels& kernels, const DeviceRoute& route) {
  const ProcessMesh& mesh = mesh_;
  if (kernels.device() == Device::cpu) {
    tp_ = comm::make_mpi_communicator(mesh.tp());
    dp_ = comm::make_mpi_communicator(mesh.dp());
    pp_send_ = comm::make_mpi_communicator(mesh.pp());
    pp_recv_ = comm::make_mpi_communicator(mesh.pp());
    world_ = comm::make_mpi_communicator(mesh.world());
    if (mesh.embedding() != MPI_COMM_NULL) emb_ = comm::make_mpi_communicator(mesh.embedding());
    return;
  }
  device_access_ = std::make_unique<KernelsDeviceAccess>(kernels);
  // Each group's path, resolved on every rank alike (route.paths,
  // train/group_paths.h).
  const MPI_Comm groups[kNumMeshGroups] = {mesh.dp(), mesh.tp(), mesh.pp(), mesh.embedding(),
                                           mesh.world()};
  const auto& paths = route.paths.path;
  auto make = [&](int g) {
    return make_group_communicator(groups[g], paths[g], *device_access_, route,
                                   fmt::format("the {} group of rank {}", mesh_group_name(g),
                                               mesh.rank()));
  };
  pp_through_host_ = !route.paths.nccl(kGroupPp);
  world_through_host_ = !route.paths.nccl(kGroupWorld);
  dp_ = make(kGroupDp);
  tp_ = make(kGroupTp);
  if (route.paths.nccl(kGroupPp)) {
    // A communicator per neighbour and direction (comm/pipeline_links.h),
    // which the runner's sends and receives share.
    pp_send_ = comm::make_pipeline_links(
        mesh.pp(),
        [&](MPI_Comm pair, const std::string& link) {
          return make_group_communicator(pair, comm::DeviceComm::nccl, *device_access_, route,
                                         fmt::format("{} of rank {}", link, mesh.rank()));
        },
        fmt::format("the pp group of rank {}", mesh.rank()));
  } else {
    pp_send_ = make(kGroupPp);
    pp_recv_ = make(kGroupPp);
  }
  world_ = make(kGroupWorld);
  if (mesh.embedding() != MPI_COMM_NULL) emb_ = make(kGroupEmbedding);
  log::info("# comm: device buffers between ranks (comm.device = {}): {}; host = staged through "
            "host memory and MPI in pieces of at most {}",
            name_of(route.asked), describe_group_paths(route.paths, mesh, *world_),
            format_bytes(static_cast<double>(route.staging_bytes)));
}

void Engine::load_base_params() {
  // Full training from given weights: every rank reads the logical tensors
  // of its shard, a block of rows at a time, and keeps its part.
  try_all(mesh_.world(), "quant.base: ", [&] {
    // A checkpoint's checksums: each rank hashes its share of the datasets.
    std::unique_ptr<load::BaseSource> src =
        load::open_base_source(cfg_.quant.base, cfg_.model, cfg_.train.seed, mesh_.rank(),
                               mesh_.layout().world());
    model_->set_weights([&](const ParamSpec& p, int64_t row0, int64_t nrows, float* x) {
      src->read_rows(p, row0, nrows, x);
    });
  }, MESHLM_HERE);
}

void Engine::sum_tied_gradients() {
  // The first and last stage hold the same wte: the first stage (rank 0 of
  // the embedding group, which is ordered by stage) gets the sum of their
  // gradients and alone updates it (plan/memory.h, optimizer_range).
  if (!emb_ || emb_->size() == 1 || !cfg_.model.tied_classifier()) return;  // (untied: lm_head)
  const std::vector<ParamSpec>& table = model_->table();
  if (!find_role(table, ParamRole::token_embedding)) return;  // LoRA: the base's wte is frozen
  if (zero_->stage() == 2) {
    // Each stage has reduced its part over DP already (the lookup's on the
    // first, the classifier's on the last), into shards that differ between
    // the stages' flat buffers.
    const MeshCoords c = mesh_.coords();
    const int last = cfg_.parallel.pp - 1;
    zero_->sum_tied_between_stages(*world_, {tied_host_.as<float>(), tied_host_.bytes() / sizeof(float)},
                                   shape_.shard.first_stage, tied_.first, tied_.last,
                                   tied_.n, tied_.piece, [&](bool on_first, int dp) {
                                     return mesh_.layout().rank({dp, c.tp, on_first ? 0 : last});
                                   });
    return;
  }
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].tied != TiedGroup::embedding) continue;
    ScopedTimer t(timers_, Section::pp_comm);
    float* g = zero_->gradient(i);
    emb_->reduce(g, g, table[i].numel(), DType::f32, comm::ReduceOp::sum, 0).wait();
  }
}

void Engine::share_tied_params() {
  // After the update: the last stage takes the first stage's wte.
  if (!emb_ || emb_->size() == 1) return;
  for (const ParamSpec& p : model_->table()) {
    if (p.tied != TiedGroup::embedding) continue;
    ScopedTimer t(timers_, Section::pp_comm);
    emb_->broadcast(model_->params() + p.offset, p.numel(), DType::f32, 0).wait();
  }
}

double Engine::global_grad_norm() {
  // Each logical element counts once in the norm (counted_in_grad_norm),
  // the DP replicas as ZeRO says.
  const MeshCoords c = mesh_.coords();
  const bool first_stage = shape_.shard.first_stage;
  const double local = zero_->sum_of_squares(
      [&](const ParamSpec& p) { return counted_in_grad_norm(p, c.tp, first_stage); });
  double total = 0;
  {
    ScopedTimer t(timers_, Section::dp_comm);
    world_->all_reduce(&local, &total, 1, DType::f64, comm::ReduceOp::sum).wait();
  }
  return std::sqrt(total);
}

StepResult Engine::step(const int32_t* tokens, const int32_t* targets, float lr, int step_number) {
  model_->zero_grads();
  zero_->zero_grads();
  const double S = scaler_.scale();
  pipeline_->set_loss_scale(
      static_cast<float>(S / (cfg_.parallel.micro_batches * cfg_.parallel.dp)));
  pipeline_->run(tokens, targets, [&](int) { faults_.in_forward(step_number); });
  sum_tied_gradients();
  zero_->reduce();
  if (faults_.poisons_gradients(step_number))
    model_->kernels().fill(zero_->owned_grads(), std::numeric_limits<float>::quiet_NaN(), 1);

  StepResult r;
  r.loss_scale = S;
  {
    ScopedTimer t(timers_, Section::optimizer);
    // The step's two waits for the backend, both after the backward: the
    // gradient norm, then the micro-batches' losses (the queue is empty by
    // then). Both decide whether the update runs.
    const double scaled_norm = global_grad_norm();
    r.loss = global_mean_loss(pipeline_->losses());
    r.grad_norm = scaled_norm / S;
    // Both are the same on every rank: every rank takes the same branch.
    const bool finite = std::isfinite(r.loss) && std::isfinite(scaled_norm);
    if (!finite && scaler_.enabled()) {
      scaler_.overflowed();
      r.overflow = true;
      // Not finite at any scale: no longer an overflow but a divergence.
      if (!scaler_.exhausted()) return r;
    }
    if (!finite) {
      r.nonfinite = true;
      r.nonfinite_tensor = first_nonfinite_tensor();
      return r;
    }
    // The loss scale undone and the clip applied inside the update, one pass.
    opt_->step(model_->params(), zero_->owned_grads() + (opt_->begin() - zero_->own_begin()), lr,
               S != 1.0 ? static_cast<float>(1.0 / S) : 1.0f,
               clip_coefficient(r.grad_norm, cfg_.train.grad_clip));
    scaler_.applied();
  }
  zero_->share_params();
  share_tied_params();
  return r;
}

double Engine::global_mean_loss(double stage_loss_sum) {
  // The loss lives on the last stage; one rank per DP replica contributes.
  const MeshCoords c = mesh_.coords();
  const int m = cfg_.parallel.micro_batches;
  double mine = (shape_.shard.last_stage && c.tp == 0) ? stage_loss_sum / m : 0.0, sum = 0;
  world_->all_reduce(&mine, &sum, 1, DType::f64, comm::ReduceOp::sum).wait();
  return sum / cfg_.parallel.dp;
}

double Engine::eval_loss(const int32_t* tokens, const int32_t* targets) {
  return global_mean_loss(pipeline_->forward_only(tokens, targets));
}

std::string Engine::first_nonfinite_tensor() {
  const int32_t none = std::numeric_limits<int32_t>::max();
  const int found = zero_->first_nonfinite();
  const int32_t mine = found < 0 ? none : found;
  int32_t first = none;
  world_->all_reduce(&mine, &first, 1, DType::i32, comm::ReduceOp::min).wait();
  if (first == none) return "";
  return trainable_table(cfg_.model, {}, model_->options()).at(static_cast<size_t>(first)).name;
}

std::vector<float> Engine::gather_params() {
  return meshlm::gather_params(cfg_, mesh_, *world_, *model_);
}

}  // namespace meshlm
