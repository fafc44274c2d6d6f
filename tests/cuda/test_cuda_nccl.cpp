// comm.device = nccl (cuda/nccl_comm.h): each collective of
// comm::Communicator and a message between two ranks through NCCL on device
// buffers, against the values every rank can work out; host buffers (the
// losses and norms the engine reduces) through the same communicator go to
// MPI; and the pipeline's links (comm/pipeline_links.h), a pair of NCCL
// communicators per neighbouring ranks. Every rank on a GPU of its own (rank
// r on GPU r): run as one rank (cuda_nccl: every code path on a
// communicator of one) and under mpiexec -n 2 (cuda_nccl_two_gpus), which
// skips, saying why, where the machine has one GPU. Skips without a CUDA
// device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_comm.h"
#include "comm/pipeline_links.h"
#include "cuda/nccl_comm.h"
#include "cuda_test.h"

using namespace meshlm;

namespace {

class CudaNccl : public CudaTest {
protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    int gpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&gpus));
    // Every rank must skip alike, or the others wait in a collective.
    if (gpus < size_)
      GTEST_SKIP() << size_ << " ranks need a GPU each; this machine has " << gpus;
    CUDA_CHECK(cudaSetDevice(rank_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    comm_ = cuda::make_nccl_communicator(comm::make_mpi_communicator(MPI_COMM_WORLD), compute_,
                                         "the test group", comm::world_ranks_of(MPI_COMM_WORLD));
  }
  void TearDown() override {
    comm_.reset();
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
  }
  // Rank r's element i of a message: distinct for every rank and element.
  static float value(int r, size_t i) { return static_cast<float>(r + 1) + 0.25f * static_cast<float>(i); }
  // a = rank r's message.
  static void fill(DeviceArray<float>& a, int r) {
    std::vector<float> h(a.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = value(r, i);
    a.upload(h);
  }
  static std::vector<float> host_of(const DeviceArray<float>& a) { return a.download(); }

  int rank_ = 0, size_ = 1;
  cudaStream_t compute_ = nullptr;
  std::unique_ptr<comm::Communicator> comm_;
};

TEST_F(CudaNccl, AllReduceReduceAndBroadcast) {
  const size_t n = 1000;
  DeviceArray<float> x(n);
  fill(x, rank_);
  comm_->all_reduce(x.get(), x.get(), n, DType::f32, comm::ReduceOp::sum).wait();
  const std::vector<float> sum = host_of(x);
  for (size_t i = 0; i < n; i += 97) {
    float want = 0;
    for (int r = 0; r < size_; ++r) want += value(r, i);
    EXPECT_FLOAT_EQ(sum[i], want) << i;
  }
  DeviceArray<float> y(n);
  fill(y, rank_);
  comm_->all_reduce(y.get(), y.get(), n, DType::f32, comm::ReduceOp::max).wait();
  EXPECT_FLOAT_EQ(host_of(y)[5], value(size_ - 1, 5));
  DeviceArray<float> z(n);
  fill(z, rank_);
  comm_->reduce(z.get(), z.get(), n, DType::f32, comm::ReduceOp::sum, 0).wait();
  if (rank_ == 0) EXPECT_FLOAT_EQ(host_of(z)[7], sum[7]);
  DeviceArray<float> b(n);
  fill(b, rank_);
  const int root = size_ - 1;
  comm_->broadcast(b.get(), n, DType::f32, root).wait();
  EXPECT_FLOAT_EQ(host_of(b)[11], value(root, 11));
}

TEST_F(CudaNccl, ReduceScatterAndAllGatherInPlace) {
  const size_t count = 257;  // per rank
  DeviceArray<float> x(count * size_);
  fill(x, rank_);
  float* mine = x.get() + rank_ * count;
  comm_->reduce_scatter(x.get(), mine, count, DType::f32, comm::ReduceOp::sum).wait();
  comm_->all_gather(mine, x.get(), count, DType::f32).wait();
  const std::vector<float> all = host_of(x);
  for (size_t i = 0; i < all.size(); i += 31) {
    float want = 0;
    for (int r = 0; r < size_; ++r) want += value(r, i);
    EXPECT_FLOAT_EQ(all[i], want) << i;
  }
}

TEST_F(CudaNccl, AMessageToTheNextRank) {
  if (size_ < 2) GTEST_SKIP() << "a message between two ranks needs two";
  const size_t n = 4096;
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  DeviceArray<float> out(n), in(n);
  fill(out, rank_);
  // Even ranks send first: one communicator matches each send with its
  // receive in the order both were issued.
  if (rank_ % 2 == 0) {
    comm_->send(out.get(), n, DType::f32, next).wait();
    comm_->recv(in.get(), n, DType::f32, prev).wait();
  } else {
    comm_->recv(in.get(), n, DType::f32, prev).wait();
    comm_->send(out.get(), n, DType::f32, next).wait();
  }
  EXPECT_FLOAT_EQ(host_of(in)[n - 1], value(prev, n - 1));
}

// The pipeline's links (comm/pipeline_links.h) over NCCL: every stage posts
// its sends (down to the next, up to the previous) before its receives, and
// waits for all four; one NCCL communicator per stage would hang here.
TEST_F(CudaNccl, PipelineLinksCarryBothDirectionsAtOnce) {
  if (size_ < 2) GTEST_SKIP() << "a pipeline of one stage has no links";
  auto links = comm::make_pipeline_links(
      MPI_COMM_WORLD,
      [&](MPI_Comm pair, const std::string& name) {
        return cuda::make_nccl_communicator(comm::make_mpi_communicator(pair), compute_, name,
                                            comm::world_ranks_of(pair));
      },
      "the test pipeline");
  const int s = rank_, last = size_ - 1;
  const size_t n = size_t{1} << 20;  // 4 MiB each way: past NCCL's buffers
  DeviceArray<float> down_out(n), up_out(n), down_in(n), up_in(n);
  fill(down_out, 2 * rank_);
  fill(up_out, 2 * rank_ + 1);
  std::vector<comm::Handle> hs;
  if (s < last) hs.push_back(links->send(down_out.get(), n, DType::f32, s + 1));
  if (s > 0) hs.push_back(links->send(up_out.get(), n, DType::f32, s - 1));
  if (s > 0) hs.push_back(links->recv(down_in.get(), n, DType::f32, s - 1));
  if (s < last) hs.push_back(links->recv(up_in.get(), n, DType::f32, s + 1));
  for (comm::Handle& h : hs) h.wait();
  if (s > 0) EXPECT_FLOAT_EQ(host_of(down_in)[n - 1], value(2 * (s - 1), n - 1));
  if (s < last) EXPECT_FLOAT_EQ(host_of(up_in)[n - 1], value(2 * (s + 1) + 1, n - 1));
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(CudaNccl, HostBuffersGoToMpi) {
  double mine = rank_ + 0.5, sum = 0;
  comm_->all_reduce(&mine, &sum, 1, DType::f64, comm::ReduceOp::sum).wait();
  EXPECT_DOUBLE_EQ(sum, size_ * (size_ - 1) / 2.0 + 0.5 * size_);
  EXPECT_STREQ(comm_->backend(), "nccl");
}

}  // namespace
