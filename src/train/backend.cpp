#include "train/backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "comm/errors.h"
#include "core/error.h"
#include "ops/gpu_workspace.h"
#include "ops/ops.h"
#include "train/emulated_device.h"
#ifdef MESHLM_HAVE_CUDA
#include "cuda/context.h"
#else
namespace meshlm::cuda {
class DeviceContext {};  // never made: a build without CUDA refuses runtime.backend = cuda
}  // namespace meshlm::cuda
#endif

namespace meshlm {

namespace {

bool flash_anywhere(ops::Precision, int) { return true; }
bool flash_on_gpu(ops::Precision p, int head_size) { return ops::flash_attention_on_gpu(p, head_size); }

BackendCaps cpu_caps() {
  BackendCaps c;
  c.kind = ComputeBackend::cpu;
  c.openblas_warm_up = true;
  c.flash_attention = flash_anywhere;
  return c;
}

BackendCaps cuda_caps() {
  BackendCaps c;
  c.kind = ComputeBackend::cuda;
#ifdef MESHLM_HAVE_CUDA
  c.built = true;
#else
  c.built = false;
#endif
  c.missing_build = "this meshlm was built without the CUDA backend (no nvcc found, or "
                    "-DMESHLM_CUDA=OFF); rebuild with -DMESHLM_CUDA=ON";
  c.device_memory = true;
  c.device_workspace = true;
  c.device_used_source = "cudaMemGetInfo";
  c.nccl = true;  // (a build without CUDA refuses the backend: `built`)
  c.native_16bit_gemm = true;
  c.fp32_note = " (TF32 off)";
  c.qtile_rows = ops::kGpuQTileRows;
  c.classifier_chunk_floats = ops::kGpuClassifierChunkFloats;
  c.whole_classifier_tile = true;
  c.flash_attention = flash_on_gpu;
  c.flash_max_batch_heads = 65535;  // cuda/flash_attention.cu: gridDim.y = B x heads
  return c;
}

// The CPU's arithmetic with the CUDA backend's device memory and work sizes
// (train/emulated_device.h).
BackendCaps emulated_caps() {
  BackendCaps c = cuda_caps();
  c.kind = ComputeBackend::emulated;
  c.built = true;
  c.missing_build = "";
  c.device_workspace = false;  // the CPU's ops need none
  c.nccl_emulated = true;
  c.device_used_source = "the emulated device's pages handed out";
  c.native_16bit_gemm = false;
  c.fp32_note = "";
  c.flash_attention = flash_anywhere;
  c.flash_max_batch_heads = 0;
  return c;
}

}  // namespace

const BackendCaps& backend_caps(ComputeBackend kind) {
  static const BackendCaps cpu = cpu_caps(), gpu = cuda_caps(), emulated = emulated_caps();
  switch (kind) {
    case ComputeBackend::cuda: return gpu;
    case ComputeBackend::emulated: return emulated;
    case ComputeBackend::cpu: break;
  }
  return cpu;
}

void apply_work_sizes(const BackendCaps& caps, size_t vocab_part, GPTOptions& o) {
  o.qtile_rows = caps.qtile_rows;
  o.whole_classifier_tile = caps.whole_classifier_tile;
  if (caps.classifier_chunk_floats > 0)
    o.classifier_rows = static_cast<int>(
        std::max<size_t>(1, caps.classifier_chunk_floats / std::max<size_t>(vocab_part, 1)));
}

int rounding_threads(const BackendCaps& caps, ops::Precision precision, int threads) {
  return !caps.native_16bit_gemm && precision != ops::Precision::fp32 ? threads : 0;
}

Backend::Backend(ComputeBackend kind, const ProcessMesh& mesh, ops::Precision precision,
                 bool op_timings, int gpus_per_node)
    : kind_(kind), precision_(precision), node_rank_(mesh.node_rank()),
      emulated_ordinal_(emulated_device_ordinal(mesh.node_rank(), gpus_per_node)) {
  if (kind_ == ComputeBackend::cuda) {
#ifdef MESHLM_HAVE_CUDA
    try_all(mesh.world(), "", [&] {
      gpu_ = std::make_unique<cuda::DeviceContext>(mesh.node_rank(), mesh.rank(), precision_);
    }, MESHLM_HERE);
#else
    throw CollectiveError(std::string("runtime.backend = cuda, but ") + caps().missing_build,
                          MESHLM_HERE);
#endif
  }
  if (kind_ == ComputeBackend::emulated) emulated_ = std::make_unique<EmulatedDevice>(precision_);
  if (op_timings) timed_ = std::make_unique<ops::TimedKernels>(untimed_kernels());
}

Backend::~Backend() = default;

const ops::Kernels& Backend::kernels() const {
  if (timed_) return *timed_;
  return untimed_kernels();
}

const ops::Kernels& Backend::untimed_kernels() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->kernels();
#endif
  if (emulated_) return emulated_->kernels();
  return ops::Kernels::cpu(precision_);
}

const quant::Dequantizer& Backend::dequantizer() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->dequantizer();
#endif
  if (emulated_) return emulated_->dequantizer();
  return quant::Dequantizer::cpu();
}

std::string Backend::describe() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return "cuda:" + std::to_string(gpu_->device()) + " (" + gpu_->name() + ")";
#endif
  if (emulated_)
    return fmt::format("emulated GPU {} (the CPU's kernels on device memory the host cannot touch)",
                       emulated_ordinal_);
  return "cpu";
}

std::string Backend::device_name() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->name();
#endif
  if (emulated_) return "emulated";
  return "cpu";
}

int Backend::device_ordinal() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->device();
#endif
  return emulated_ ? emulated_ordinal_ : 0;
}

void* Backend::device_stream() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->stream();
#endif
  return nullptr;
}

DeviceRoute device_route(const RunConfig& cfg, const ProcessMesh& mesh, const Backend& backend) {
  DeviceRoute r;
  r.asked = cfg.comm.device;
  r.paths = gather_group_paths(cfg, mesh, backend.device_ordinal());
  r.nccl_emulated = backend_caps(cfg.runtime.backend).nccl_emulated;
  r.stream = backend.device_stream();
  r.backend = name_of(backend.kind());
  r.slot = {mesh.node_index(), backend.device_ordinal(), mesh.rank()};
  r.staging_bytes = cfg.comm.staging_bytes();
  return r;
}

size_t dp_overlap_bytes(const RunConfig& cfg, const GroupPaths& paths) {
  if (cfg.parallel.zero_stage >= 2 || cfg.parallel.dp <= 1) return 0;
  bool on = cfg.comm.overlap == Overlap::on;
  if (cfg.comm.overlap == Overlap::automatic) on = paths.nccl(kGroupDp);
  return on ? cfg.comm.staging_bytes() : 0;
}

size_t Backend::device_reserved_bytes() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->reserved_bytes();
#endif
  if (emulated_) return emulated_->memory().in_use();
  return 0;
}

size_t Backend::device_used_bytes() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->used_bytes();
#endif
  if (emulated_) return emulated_->memory().in_use();
  return 0;
}

size_t Backend::device_total_bytes() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->total_bytes();
#endif
  if (emulated_) return emulated_->memory().capacity();
  return 0;
}

}  // namespace meshlm
