// The CUDA backend behind ops::Kernels (ops/kernels.h) and
// quant::Dequantizer (quant/dequantizer.h): every op of cuda/ops_cuda.h
// queued on one stream, pointers in device memory.
#pragma once

#include <memory>

#include "cuda/ops_cuda.h"
#include "ops/kernels.h"
#include "quant/dequantizer.h"

namespace meshlm::cuda {

// Kernels on `stream` (which must outlive them) of the current device, at
// precision `p`.
std::unique_ptr<ops::Kernels> make_kernels(cudaStream_t stream,
                                           ops::Precision p = ops::Precision::fp32);
// The frozen base's dequantization on `stream`, for the kernels above.
std::unique_ptr<quant::Dequantizer> make_dequantizer(cudaStream_t stream);

}  // namespace meshlm::cuda
