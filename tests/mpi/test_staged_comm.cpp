// meshlm-test-ranks: 3
// Host staging of device buffers (comm/staged_comm.h), without a GPU: a
// region of host memory plays the device (the DeviceAccess below counts
// every byte that crosses and checks it stays inside the region). Every
// collective and point-to-point operation on "device" buffers, in place and
// not, with a staging buffer of one element up to more than the message,
// gives what the ranks' values say (small integers, exact in every type),
// and what the device must not receive it does not (a poison value stays).
// Three ranks: no piece is a power of two by luck.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_comm.h"
#include "comm/staged_comm.h"
#include "mpi/fake_device.h"

using namespace meshlm;
using namespace meshlm::comm;
using namespace meshlm::testing;

namespace {

class StagedTest : public ::testing::Test {
protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi_);
    rank_ = 0;
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    ASSERT_GE(size_, 2) << "run this test on several ranks";
  }
  void TearDown() override { MPI_Comm_free(&mpi_); }
  std::unique_ptr<Communicator> staged(size_t staging_bytes) {
    return make_staged_communicator(make_mpi_communicator(mpi_), dev_, staging_bytes);
  }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  FakeDevice dev_{size_t{1} << 20};
};

template <typename T>
class StagedTyped : public StagedTest {};
using Types = ::testing::Types<float, double, int32_t>;
TYPED_TEST_SUITE(StagedTyped, Types);

// Staging from one element to more than any message here; counts from one
// element to several pieces with a short last one.
const size_t kStaging[] = {1, 24, 100, 4096};
const size_t kCounts[] = {1, 5, 97, 600};

TYPED_TEST(StagedTyped, AllReduceReduceAndBroadcastGiveTheRanksValues) {
  using T = TypeParam;
  const int me = this->rank_, p = this->size_;
  for (size_t staging : kStaging)
    for (size_t n : kCounts)
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max})
        for (bool in_place : {true, false}) {
          SCOPED_TRACE("staging " + std::to_string(staging) + " count " + std::to_string(n) +
                       (in_place ? " in place" : ""));
          auto c = this->staged(staging);
          T* send = this->dev_.template at<T>(0);
          T* recv = in_place ? send : this->dev_.template at<T>(8 * n * sizeof(T));
          for (size_t i = 0; i < n; ++i) send[i] = T(value(me, i));
          c->all_reduce(send, recv, n, kType<T>, op).wait();
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(recv[i], T(reduced(op, p, i))) << i;

          // reduce to the last rank: the others' recv untouched.
          for (size_t i = 0; i < n; ++i) send[i] = T(value(me, i));
          T* out = this->dev_.template at<T>(16 * n * sizeof(T));
          std::fill(out, out + n, T(kPoison));
          const int root = p - 1;
          c->reduce(send, in_place && me == root ? send : out, n, kType<T>, op, root).wait();
          const T* got = in_place && me == root ? send : out;
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(got[i], me == root ? T(reduced(op, p, i)) : T(kPoison)) << i;
        }
  for (size_t staging : kStaging)
    for (int root = 0; root < p; ++root) {
      auto c = this->staged(staging);
      T* buf = this->dev_.template at<T>(0);
      for (size_t i = 0; i < 600; ++i) buf[i] = me == root ? T(value(root, i)) : T(kPoison);
      c->broadcast(buf, 600, kType<T>, root).wait();
      for (size_t i = 0; i < 600; ++i) ASSERT_EQ(buf[i], T(value(root, i))) << i;
    }
}

TYPED_TEST(StagedTyped, ReduceScatterAndAllGatherInPlaceAndNot) {
  using T = TypeParam;
  const int me = this->rank_, p = this->size_;
  for (size_t staging : kStaging)
    for (size_t n : kCounts)
      for (bool in_place : {true, false}) {
        SCOPED_TRACE("staging " + std::to_string(staging) + " count " + std::to_string(n) +
                     (in_place ? " in place" : ""));
        auto c = this->staged(staging);
        // send: p blocks of n; rank r's element j of block k is value(r, k n + j).
        T* send = this->dev_.template at<T>(0);
        for (size_t i = 0; i < p * n; ++i) send[i] = T(value(me, i));
        T* recv = in_place ? send + me * n : this->dev_.template at<T>(8 * p * n * sizeof(T));
        c->reduce_scatter(send, recv, n, kType<T>, ReduceOp::sum).wait();
        for (size_t j = 0; j < n; ++j)
          ASSERT_EQ(recv[j], T(reduced(ReduceOp::sum, p, me * n + j))) << j;

        // all_gather: block r of recv from rank r.
        T* all = this->dev_.template at<T>(16 * p * n * sizeof(T));
        std::fill(all, all + p * n, T(kPoison));
        T* mine = in_place ? all + me * n : this->dev_.template at<T>(24 * p * n * sizeof(T));
        for (size_t j = 0; j < n; ++j) mine[j] = T(value(me, j));
        c->all_gather(mine, all, n, kType<T>).wait();
        for (int r = 0; r < p; ++r)
          for (size_t j = 0; j < n; ++j) ASSERT_EQ(all[r * n + j], T(value(r, j))) << r << " " << j;
      }
}

// A ring where each rank posts its send and its receive before waiting for
// either (a pipeline exchange), messages larger than the staging buffer:
// no rank waits on a piece its peer has not posted. Two messages to the
// same peer arrive in order, and waiting for the second completes the
// first's copy to the device.
TEST_F(StagedTest, PointToPointPostsBothWaysBeforeWaitingAndKeepsOrder) {
  const int me = rank_, p = size_;
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  auto c = staged(16);
  const size_t n = 1000;
  float* out1 = dev_.at<float>(0);
  float* out2 = dev_.at<float>(n * sizeof(float));
  float* in1 = dev_.at<float>(2 * n * sizeof(float));
  float* in2 = dev_.at<float>(3 * n * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    out1[i] = float(value(me, i));
    out2[i] = float(value(me, i + n));
    in1[i] = in2[i] = float(kPoison);
  }
  Handle r1 = c->recv(in1, n, DType::f32, prev);
  Handle s1 = c->send(out1, n, DType::f32, next);
  Handle r2 = c->recv(in2, n, DType::f32, prev);
  Handle s2 = c->send(out2, n, DType::f32, next);
  // The send copied its message when posted: the device buffer is free.
  std::fill(out1, out1 + n, float(kPoison));
  s2.wait();  // completes r1, s1 and r2 too
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(in1[i], float(value(prev, i))) << i;
    ASSERT_EQ(in2[i], float(value(prev, i + n))) << i;
  }
  r1.wait();  // again: nothing left
  r2.wait();
  s1.wait();
}

// Host buffers go to MPI as they are: nothing crosses the device boundary,
// and a host scalar and a device vector mix in one communicator.
TEST_F(StagedTest, HostBuffersPassThroughAndDeviceBytesCrossOnceEachWay) {
  auto c = staged(64);
  double local = rank_ + 1.0, sum = 0;
  c->all_reduce(&local, &sum, 1, DType::f64, ReduceOp::sum).wait();
  EXPECT_EQ(sum, size_ * (size_ + 1) / 2.0);
  EXPECT_EQ(dev_.down, 0u);
  EXPECT_EQ(dev_.up, 0u);
  float* g = dev_.at<float>(0);
  std::fill(g, g + 1000, 1.0f);
  c->all_reduce(g, g, 1000, DType::f32, ReduceOp::sum).wait();
  EXPECT_EQ(g[999], float(size_));
  EXPECT_EQ(dev_.down, 1000 * sizeof(float));
  EXPECT_EQ(dev_.up, 1000 * sizeof(float));
  c->barrier();
}

}  // namespace
