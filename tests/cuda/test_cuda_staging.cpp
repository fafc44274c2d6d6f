// Host staging (comm/staged_comm.h) of buffers in a GPU's memory, through
// the CUDA backend's copies (train/device_access.h): the backend tells its
// device buffers from host memory, and every collective and a send to
// itself, on one rank, cut into pieces smaller than the message at odd
// offsets, bring the device buffers back as the values say. (Several ranks
// are tested on the CPU, test_staged_comm, with host memory playing the
// device.) Skips, with the reason, where no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/mpi_comm.h"
#include "comm/staged_comm.h"
#include "core/alloc.h"
#include "cuda/device_memory.h"
#include "cuda/kernels_cuda.h"
#include "cuda_test.h"
#include "train/device_access.h"

using namespace meshlm;

namespace {

class CudaStaging : public CudaTest {
protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cuda::install_device_memory();
    gpu_ = cuda::make_kernels(stream_);
    access_ = std::make_unique<KernelsDeviceAccess>(*gpu_);
    MPI_Comm_dup(MPI_COMM_SELF, &self_);
  }
  void TearDown() override {
    if (self_ != MPI_COMM_NULL) MPI_Comm_free(&self_);
    access_.reset();
    gpu_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::vector<float> get(const Buffer& b, size_t n) const {
    std::vector<float> h(n);
    gpu_->download(h.data(), b.data(), n * sizeof(float));
    return h;
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<ops::Kernels> gpu_;
  std::unique_ptr<KernelsDeviceAccess> access_;
  MPI_Comm self_ = MPI_COMM_NULL;
};

TEST_F(CudaStaging, DeviceBuffersGoThroughTheHostInPieces) {
  const size_t n = 1001;
  Buffer a(n * sizeof(float), MemCategory::other, "test.a", Device::cuda);
  Buffer b(n * sizeof(float), MemCategory::other, "test.b", Device::cuda);
  std::vector<float> host = uniform_floats(n, 7);
  EXPECT_TRUE(access_->on_device(a.data()));
  EXPECT_FALSE(access_->on_device(host.data()));
  auto c = comm::make_staged_communicator(comm::make_mpi_communicator(self_), *access_, 40);
  gpu_->upload(a.data(), host.data(), n * sizeof(float));
  c->all_reduce(a.data(), b.data(), n, DType::f32, comm::ReduceOp::sum).wait();
  EXPECT_EQ(get(b, n), host);
  gpu_->zero(b.as<float>(), n);
  c->reduce_scatter(a.data(), b.data(), n, DType::f32, comm::ReduceOp::max).wait();
  EXPECT_EQ(get(b, n), host);
  gpu_->zero(b.as<float>(), n);
  c->all_gather(a.data(), b.data(), n, DType::f32).wait();
  EXPECT_EQ(get(b, n), host);
  gpu_->zero(b.as<float>(), n);
  comm::Handle r = c->recv(b.data(), n, DType::f32, 0);
  comm::Handle s = c->send(a.data(), n, DType::f32, 0);
  s.wait();
  EXPECT_EQ(get(b, n), host);
  // A host scalar on the same communicator goes to MPI as it is.
  double x = 2.5, y = 0;
  c->all_reduce(&x, &y, 1, DType::f64, comm::ReduceOp::sum).wait();
  EXPECT_EQ(y, 2.5);
}

}  // namespace
