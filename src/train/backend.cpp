#include "train/backend.h"

#include "comm/errors.h"
#include "core/error.h"
#ifdef MESHLM_HAVE_CUDA
#include "cuda/context.h"
#else
namespace meshlm::cuda {
class DeviceContext {};  // never made: a build without CUDA refuses runtime.backend = cuda
}  // namespace meshlm::cuda
#endif

namespace meshlm {

Backend::Backend(ComputeBackend kind, const ProcessMesh& mesh, ops::Precision precision,
                 bool op_timings)
    : kind_(kind), precision_(precision) {
  if (kind_ == ComputeBackend::cuda) {
#ifdef MESHLM_HAVE_CUDA
    try_all(mesh.world(), "", [&] {
      gpu_ = std::make_unique<cuda::DeviceContext>(mesh.node_rank(), mesh.rank(), precision_);
    }, MESHLM_HERE);
#else
    throw CollectiveError(
        "runtime.backend = cuda, but this meshlm was built without the CUDA backend", MESHLM_HERE);
#endif
  }
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
  return ops::Kernels::cpu(precision_);
}

const quant::Dequantizer& Backend::dequantizer() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->dequantizer();
#endif
  return quant::Dequantizer::cpu();
}

std::string Backend::describe() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return "cuda:" + std::to_string(gpu_->device()) + " (" + gpu_->name() + ")";
#endif
  return "cpu";
}

size_t Backend::device_used_bytes() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->used_bytes();
#endif
  return 0;
}

size_t Backend::device_total_bytes() const {
#ifdef MESHLM_HAVE_CUDA
  if (gpu_) return gpu_->total_bytes();
#endif
  return 0;
}

}  // namespace meshlm
