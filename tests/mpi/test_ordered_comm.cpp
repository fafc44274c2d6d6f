// meshlm-test-ranks: 3
// NCCL's ordering without a GPU (comm/ordered_comm.h), on host memory that
// plays the device: every collective and message on device buffers gives
// what the ranks' values say, in place and not; an operation starts only
// when the one issued before it on its communicator has completed, and
// advances while the rank waits on another communicator (an MPI one too);
// the pipeline's links (comm/pipeline_links.h) carry an exchange that one
// ordered communicator per stage could not.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_comm.h"
#include "comm/ordered_comm.h"
#include "comm/pipeline_links.h"
#include "mpi/fake_device.h"

using namespace meshlm;
using namespace meshlm::comm;
using namespace meshlm::testing;

namespace {

class OrderedTest : public ::testing::Test {
protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi_);
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    ASSERT_GE(size_, 3) << "run this test on three ranks or more";
  }
  void TearDown() override { MPI_Comm_free(&mpi_); }
  std::unique_ptr<Communicator> ordered(MPI_Comm c = MPI_COMM_NULL) {
    if (c == MPI_COMM_NULL) c = mpi_;
    return make_ordered_communicator(make_mpi_communicator(c), c, dev_, "the test group");
  }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  FakeDevice dev_{size_t{1} << 20};
};

// Calls `check` every millisecond for 100 ms.
template <typename F>
void for_100_ms(F&& check) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) {
    check();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

template <typename T>
class OrderedTyped : public OrderedTest {};
using Types = ::testing::Types<float, double, int32_t>;
TYPED_TEST_SUITE(OrderedTyped, Types);

const size_t kCounts[] = {1, 5, 97, 600};

// Every collective, issued all at once before any wait, each reading what
// the one before it wrote: so each must start after the one before it.
TYPED_TEST(OrderedTyped, CollectivesInPlaceAndNotGiveTheRanksValues) {
  using T = TypeParam;
  const int me = this->rank_, p = this->size_;
  auto c = this->ordered();
  for (size_t n : kCounts)
    for (bool in_place : {true, false}) {
      SCOPED_TRACE("count " + std::to_string(n) + (in_place ? " in place" : ""));
      const size_t block = 8 * p * n * sizeof(T);
      T* send = this->dev_.template at<T>(0);
      T* sum = in_place ? send : this->dev_.template at<T>(block);
      T* maxed = this->dev_.template at<T>(2 * block);
      T* at_root = this->dev_.template at<T>(3 * block);
      T* bcast = this->dev_.template at<T>(4 * block);
      T* scattered_from = this->dev_.template at<T>(5 * block);
      T* gathered = this->dev_.template at<T>(6 * block);
      T* mine = this->dev_.template at<T>(7 * block);
      for (size_t i = 0; i < n; ++i) send[i] = T(value(me, i));
      std::fill(at_root, at_root + n, T(kPoison));
      for (size_t i = 0; i < n; ++i) bcast[i] = me == 1 ? T(value(1, i)) : T(kPoison);
      for (size_t i = 0; i < p * n; ++i) scattered_from[i] = T(value(me, i));
      std::fill(gathered, gathered + p * n, T(kPoison));
      T* rs_out = in_place ? scattered_from + me * n : mine;
      // all_reduce, then a max over its result, then a reduce of that to
      // the last rank, a broadcast from rank 1, a reduce_scatter and an
      // all_gather of its result.
      Handle h1 = c->all_reduce(send, sum, n, kType<T>, ReduceOp::sum);
      Handle h2 = c->all_reduce(sum, maxed, n, kType<T>, ReduceOp::max);
      Handle h3 = c->reduce(maxed, at_root, n, kType<T>, ReduceOp::sum, p - 1);
      Handle h4 = c->broadcast(bcast, n, kType<T>, 1);
      Handle h5 = c->reduce_scatter(scattered_from, rs_out, n, kType<T>, ReduceOp::sum);
      Handle h6 = c->all_gather(rs_out, gathered, n, kType<T>);
      h6.wait();  // completes the five before it
      for (size_t i = 0; i < n; ++i) {
        const T s = T(reduced(ReduceOp::sum, p, i));
        ASSERT_EQ(sum[i], s) << i;
        ASSERT_EQ(maxed[i], s) << i;
        ASSERT_EQ(at_root[i], me == p - 1 ? T(p * s) : T(kPoison)) << i;
        ASSERT_EQ(bcast[i], T(value(1, i))) << i;
      }
      for (int r = 0; r < p; ++r)
        for (size_t j = 0; j < n; ++j)
          ASSERT_EQ(gathered[r * n + j], T(reduced(ReduceOp::sum, p, r * n + j))) << r << " " << j;
      EXPECT_TRUE(h1.test() && h3.test());
      h2.wait();
      h4.wait();
      h5.wait();
    }
}

// Rank 0 sends A to rank 1, then receives B from rank 2; rank 2 sends B at
// once, rank 1 receives A only when rank 0 says so. B is on its way, yet
// rank 0's receive has not started (B's send does not complete, and B is
// not on rank 0's device): it waits behind the send, as on an NCCL stream.
// Under MPI (or host staging) both would complete at once.
TEST_F(OrderedTest, AReceiveIssuedAfterASendWaitsForIt) {
  auto c = ordered();
  auto host = make_mpi_communicator(mpi_);
  const size_t n = 65536;  // 256 KiB: above MPI's eager sizes, A waits for its receive
  float* a = dev_.at<float>(0);
  float* b = dev_.at<float>(n * sizeof(float));
  int flag = 0;
  if (rank_ == 0) {
    for (size_t i = 0; i < n; ++i) a[i] = float(value(0, i)), b[i] = float(kPoison);
    Handle send_a = c->send(a, n, DType::f32, 1);
    Handle recv_b = c->recv(b, n, DType::f32, 2);
    host->recv(&flag, 1, DType::i32, 2).wait();  // B is on its way
    for_100_ms([&] { EXPECT_FALSE(recv_b.test()) << "the receive completed before the send"; });
    EXPECT_EQ(b[0], float(kPoison));
    host->recv(&flag, 1, DType::i32, 2).wait();  // rank 2 has looked at its send
    host->send(&flag, 1, DType::i32, 1).wait();  // now take A
    recv_b.wait();
    EXPECT_TRUE(send_a.test());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(b[i], float(value(2, i))) << i;
  } else if (rank_ == 1) {
    std::fill(a, a + n, float(kPoison));
    host->recv(&flag, 1, DType::i32, 0).wait();
    c->recv(a, n, DType::f32, 0).wait();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], float(value(0, i))) << i;
  } else if (rank_ == 2) {
    for (size_t i = 0; i < n; ++i) b[i] = float(value(2, i));
    Handle send_b = c->send(b, n, DType::f32, 0);
    host->send(&flag, 1, DType::i32, 0).wait();
    for_100_ms([&] { EXPECT_FALSE(send_b.test()) << "rank 0's receive started before its send"; });
    host->send(&flag, 1, DType::i32, 0).wait();
    send_b.wait();
  }
  c->barrier();
}

// Rank 0 sends A then B to rank 1 and then waits in an MPI Communicator for
// rank 1's word that both arrived: B starts only once A is taken, while
// rank 0 is inside that wait, as its GPU would go on meanwhile.
TEST_F(OrderedTest, OperationsAdvanceWhileTheRankWaitsInMpi) {
  for (WaitPolicy policy : {WaitPolicy::poll, WaitPolicy::sleep}) {
    set_wait_policy(policy);
    auto c = ordered();
    auto host = make_mpi_communicator(mpi_);
    const size_t n = 65536;  // above MPI's eager sizes: a send waits for its receive
    float* a = dev_.at<float>(0);
    float* b = dev_.at<float>(n * sizeof(float));
    int word = 0;
    if (rank_ == 0) {
      for (size_t i = 0; i < n; ++i) a[i] = 1.0f, b[i] = 2.0f;
      Handle ha = c->send(a, n, DType::f32, 1);
      Handle hb = c->send(b, n, DType::f32, 1);
      host->recv(&word, 1, DType::i32, 1).wait();
      EXPECT_EQ(word, 2);
      EXPECT_TRUE(hb.test());
    } else if (rank_ == 1) {
      std::fill(a, a + 2 * n, 0.0f);
      c->recv(a, n, DType::f32, 0).wait();
      c->recv(b, n, DType::f32, 0).wait();
      word = int(a[n - 1] + b[n - 1] - 1.0f);
      host->send(&word, 1, DType::i32, 0).wait();
    }
    c->barrier();
  }
  set_wait_policy(WaitPolicy::poll);
}

// A host buffer goes to MPI once the device operations issued before it
// have completed; nothing of it crosses to the device.
TEST_F(OrderedTest, HostBuffersFollowTheDeviceOperationsIssuedBefore) {
  auto c = ordered();
  float* g = dev_.at<float>(0);
  std::fill(g, g + 1000, 1.0f);
  Handle h = c->all_reduce(g, g, 1000, DType::f32, ReduceOp::sum);
  double local = rank_ + 1.0, sum = 0;
  c->all_reduce(&local, &sum, 1, DType::f64, ReduceOp::sum).wait();
  EXPECT_TRUE(h.test()) << "the host reduction overtook the device one";
  EXPECT_EQ(g[999], float(size_));
  EXPECT_EQ(sum, size_ * (size_ + 1) / 2.0);
  EXPECT_EQ(dev_.down, 1000 * sizeof(float));
  EXPECT_EQ(dev_.up, 1000 * sizeof(float));
}

// Every stage of a pipeline over all ranks posts its sends (activations
// down, gradients up) before its receives, then waits. One ordered
// communicator per stage would hang (each stage's first receive behind its
// sends, each send waiting for a receive behind the peer's sends); the
// links carry it, in order, twice.
TEST_F(OrderedTest, PipelineLinksCarryBothDirectionsAtOnce) {
  auto links = make_pipeline_links(
      mpi_, [&](MPI_Comm pair, const std::string& name) {
        return make_ordered_communicator(make_mpi_communicator(pair), pair, dev_, name);
      },
      "the test pipeline");
  ASSERT_EQ(links->rank(), rank_);
  ASSERT_EQ(links->size(), size_);
  const int s = rank_, last = size_ - 1;
  const size_t n = 500;
  for (int round = 0; round < 2; ++round) {
    float* down_out = dev_.at<float>(0);
    float* up_out = dev_.at<float>(n * sizeof(float));
    float* down_in = dev_.at<float>(2 * n * sizeof(float));
    float* up_in = dev_.at<float>(3 * n * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      down_out[i] = float(value(s, i + round));
      up_out[i] = float(-value(s, i + round));
      down_in[i] = up_in[i] = float(kPoison);
    }
    std::vector<Handle> hs;
    if (s < last) hs.push_back(links->send(down_out, n, DType::f32, s + 1));
    if (s > 0) hs.push_back(links->send(up_out, n, DType::f32, s - 1));
    if (s > 0) hs.push_back(links->recv(down_in, n, DType::f32, s - 1));
    if (s < last) hs.push_back(links->recv(up_in, n, DType::f32, s + 1));
    for (Handle& h : hs) h.wait();
    for (size_t i = 0; i < n; ++i) {
      if (s > 0) ASSERT_EQ(down_in[i], float(value(s - 1, i + round))) << i;
      if (s < last) ASSERT_EQ(up_in[i], float(-value(s + 1, i + round))) << i;
    }
  }
  EXPECT_THROW(links->send(dev_.at<float>(0), 1, DType::f32, s), RankError);
  EXPECT_THROW(links->barrier(), RankError);
  MPI_Barrier(mpi_);
}

}  // namespace
