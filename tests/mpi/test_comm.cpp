// comm::Communicator on MPI (run on 4 ranks by ctest; correct for any size >= 2).
// Every rank contributes small integers that differ per rank and per element,
// so sums and maxima are exact in float and the expected value of each element
// is computed here by looping over the ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_comm.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"

using namespace meshlm;
using namespace meshlm::comm;

namespace {

constexpr size_t kCount = 1001;  // elements per rank; odd, so no chunk is aligned by luck
constexpr int kUnset = -99;      // what a buffer holds where nothing should be written

// Rank r's element i, in [-4, 8].
int value(int r, size_t i) { return static_cast<int>((r * 7 + i * 3) % 13) - 4; }

int reduced(ReduceOp op, int size, size_t i) {
  int acc = value(0, i);
  for (int r = 1; r < size; ++r)
    acc = op == ReduceOp::sum   ? acc + value(r, i)
          : op == ReduceOp::min ? std::min(acc, value(r, i))
                                : std::max(acc, value(r, i));
  return acc;
}

template <typename T>
constexpr DType kType = std::is_same_v<T, float>    ? DType::f32
                        : std::is_same_v<T, double> ? DType::f64
                                                    : DType::i32;

// got[i] == want(i) for i in [0, n).
template <typename T, typename F>
::testing::AssertionResult matches(const T* got, size_t n, F want) {
  for (size_t i = 0; i < n; ++i)
    if (got[i] != static_cast<T>(want(i)))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want(i);
  return ::testing::AssertionSuccess();
}

const char* op_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::min ? "min" : "max";
}

// Each test gets its own duplicate of the world, so a message left over by a
// failed test cannot be matched by the next one.
class CommTest : public ::testing::Test {
protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi_);
    comm_ = make_mpi_communicator(mpi_);
    rank_ = comm_->rank();
    size_ = comm_->size();
    ASSERT_GE(size_, 2) << "run this test on several ranks";
  }
  void TearDown() override {
    comm_.reset();
    MPI_Comm_free(&mpi_);
  }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0, size_ = 1;
};

template <typename T>
class CommTyped : public CommTest {
protected:
  // This rank's values for elements [first, first + n).
  std::vector<T> mine(size_t n, size_t first = 0) const {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value(rank_, first + i));
    return v;
  }
};
using Types = ::testing::Types<float, double, int32_t>;
TYPED_TEST_SUITE(CommTyped, Types);

// Runs `body` once per way a reduction can go (mpi_comm.h): MPI's own
// collective; the ring in pieces of 200 bytes (many pieces: 21 of floats
// and 41 of doubles to a rank's 1001 elements, the last one short, blocks of
// unequal length); the ring in one piece per block; each with waits that
// poll and waits that sleep (comm.wait).
template <typename F>
void for_each_reduction_path(F body) {
  const struct {
    const char* name;
    size_t bucket, ring_min;
  } paths[] = {{"MPI collective", 0, kRingMinBytes}, {"ring, 200-byte pieces", 400, 0},
               {"ring, whole blocks", size_t{1} << 20, 0}};
  for (WaitPolicy wait : {WaitPolicy::poll, WaitPolicy::sleep}) {
    SCOPED_TRACE(std::string("comm.wait = ") + name_of(wait));
    set_wait_policy(wait);
    for (const auto& p : paths) {
      SCOPED_TRACE(p.name);
      set_bucket_bytes(p.bucket, p.ring_min);
      body();
    }
  }
  set_bucket_bytes(kDefaultBucketBytes);
  set_wait_policy(WaitPolicy::poll);
}

// This thread's CPU seconds.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

TEST_F(CommTest, Basics) {
  int r = 0, s = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  EXPECT_EQ(rank_, r);
  EXPECT_EQ(size_, s);
  EXPECT_STREQ(comm_->backend(), "mpi");
  EXPECT_EQ(mpi_type(DType::f32), MPI_FLOAT);
  EXPECT_EQ(mpi_type(DType::f64), MPI_DOUBLE);
  EXPECT_EQ(mpi_type(DType::i32), MPI_INT32_T);
  EXPECT_EQ(mpi_type(DType::u8), MPI_UINT8_T);
  EXPECT_EQ(mpi_type(DType::u16), MPI_UINT16_T);
  EXPECT_EQ(mpi_type(DType::u32), MPI_UINT32_T);
  EXPECT_EQ(mpi_type(DType::i8), MPI_INT8_T);
  comm_->barrier();
}

TEST_F(CommTest, FirstRanksMakeACommunicatorOfTheirOwn) {
  for (const int n : {1, 2, size_}) {
    SCOPED_TRACE("first " + std::to_string(n) + " ranks");
    const auto part = OwnedComm::first_ranks(MPI_COMM_WORLD, n);
    if (rank_ >= n) {
      EXPECT_EQ(part->get(), MPI_COMM_NULL);
      continue;
    }
    ASSERT_NE(part->get(), MPI_COMM_NULL);
    int r = -1, s = 0;
    MPI_Comm_rank(part->get(), &r);
    MPI_Comm_size(part->get(), &s);
    EXPECT_EQ(r, rank_);
    EXPECT_EQ(s, std::min(n, size_));
    // A sum over the part counts only its ranks.
    auto c = make_mpi_communicator(part->get());
    int one = 1, sum = 0;
    c->all_reduce(&one, &sum, 1, DType::i32, ReduceOp::sum).wait();
    EXPECT_EQ(sum, std::min(n, size_));
  }
  comm_->barrier();
}

TYPED_TEST(CommTyped, AllReduce) {
  using T = TypeParam;
  for_each_reduction_path([&] {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(op_name(op)) + (in_place ? " in place" : " out of place"));
        std::vector<T> send = this->mine(kCount), out(kCount, T(kUnset));
        T* recv = in_place ? send.data() : out.data();
        this->comm_->all_reduce(send.data(), recv, kCount, kType<T>, op).wait();
        EXPECT_TRUE(matches(recv, kCount, [&](size_t i) { return reduced(op, this->size_, i); }));
        if (!in_place)
          EXPECT_TRUE(matches(send.data(), kCount, [&](size_t i) { return value(this->rank_, i); }))
              << "send was modified";
      }
  });
}

TYPED_TEST(CommTyped, Reduce) {
  using T = TypeParam;
  for_each_reduction_path([&] {
    for (int root : {0, this->size_ - 1})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max})
        for (bool in_place : {false, true}) {
          SCOPED_TRACE("root " + std::to_string(root) + " " + op_name(op) +
                       (in_place ? " in place" : " out of place"));
          std::vector<T> send = this->mine(kCount), out(kCount, T(kUnset));
          T* recv = in_place ? send.data() : out.data();
          this->comm_->reduce(send.data(), recv, kCount, kType<T>, op, root).wait();
          if (this->rank_ == root)
            EXPECT_TRUE(matches(recv, kCount, [&](size_t i) { return reduced(op, this->size_, i); }));
          else if (!in_place)
            EXPECT_TRUE(matches(recv, kCount, [](size_t) { return kUnset; })) << "non-root recv";
        }
  });
}

TYPED_TEST(CommTyped, ReduceScatter) {
  using T = TypeParam;
  const size_t n = kCount, first = this->rank_ * n;
  for_each_reduction_path([&] {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(op_name(op)) + (in_place ? " in place" : " out of place"));
        std::vector<T> send = this->mine(this->size_ * n), out(n, T(kUnset));
        // In place: NCCL's convention, the result lands in this rank's chunk of send.
        T* recv = in_place ? send.data() + first : out.data();
        this->comm_->reduce_scatter(send.data(), recv, n, kType<T>, op).wait();
        EXPECT_TRUE(matches(recv, n, [&](size_t i) { return reduced(op, this->size_, first + i); }));
      }
  });
}

TYPED_TEST(CommTyped, AllGather) {
  using T = TypeParam;
  const size_t n = kCount;
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    std::vector<T> recv(this->size_ * n, T(kUnset)), out = this->mine(n);
    T* send = out.data();
    if (in_place) {
      send = recv.data() + this->rank_ * n;
      std::copy(out.begin(), out.end(), send);
    }
    this->comm_->all_gather(send, recv.data(), n, kType<T>).wait();
    EXPECT_TRUE(matches(recv.data(), recv.size(), [&](size_t j) {
      return value(static_cast<int>(j / n), j % n);
    }));
  }
}

TYPED_TEST(CommTyped, BroadcastFromLastRank) {
  using T = TypeParam;
  const int root = this->size_ - 1;
  std::vector<T> buf = this->rank_ == root ? this->mine(kCount) : std::vector<T>(kCount, T(kUnset));
  this->comm_->broadcast(buf.data(), kCount, kType<T>, root).wait();
  EXPECT_TRUE(matches(buf.data(), kCount, [&](size_t i) { return value(root, i); }));
}

// A broadcast larger than one piece of the backend goes out in pieces (MPI
// counts are int: the real pieces are 1 GiB); here pieces of 40 bytes cut
// 1001 floats into 26 pieces, the last one short.
// The ring's additions go along one path per block, so every rank ends with
// the same bits, and the sum is the sum (checked in double) whatever the
// pieces.
TEST_F(CommTest, RingAllReduceGivesEveryRankTheSameBits) {
  const size_t n = 100003;  // blocks of unequal length on 3 or 4 ranks
  std::vector<std::vector<float>> all(size_, std::vector<float>(n));
  for (int r = 0; r < size_; ++r) {
    Rng rng(1234 + r);
    for (float& x : all[r]) x = rng.normal();
  }
  for (size_t bucket : {size_t{4096}, size_t{1} << 20}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    set_bucket_bytes(bucket, 0);
    std::vector<float> sum = all[rank_];
    comm_->all_reduce(sum.data(), sum.data(), n, DType::f32, ReduceOp::sum).wait();
    std::vector<float> every(size_ * n);
    comm_->all_gather(sum.data(), every.data(), n, DType::f32).wait();
    for (int r = 1; r < size_; ++r)
      ASSERT_EQ(std::memcmp(every.data(), every.data() + r * n, n * sizeof(float)), 0)
          << "rank " << r << " holds other bits than rank 0";
    for (size_t i = 0; i < n; ++i) {
      double want = 0, scale = 0;
      for (int r = 0; r < size_; ++r) {
        want += all[r][i];
        scale += std::abs(all[r][i]);
      }
      ASSERT_NEAR(sum[i], want, 1e-6 * scale + 1e-30) << "element " << i;
    }
  }
  set_bucket_bytes(kDefaultBucketBytes);
}

// The scratch is a Buffer of the comm category, of ring_scratch_bytes: two
// pieces of half the bucket, or two blocks where a block is shorter; freed
// on request.
TEST_F(CommTest, RingScratchIsBookedInTheCommCategory) {
  const MemTracker& t = MemTracker::get();
  release_ring_scratch();
  const size_t before = t.current(MemCategory::comm);
  const size_t n = 1001, block = (n + size_ - 1) / size_;
  std::vector<double> x(n, 1.0);
  set_bucket_bytes(64, 0);  // pieces of 4 doubles
  comm_->all_reduce(x.data(), x.data(), n, DType::f64, ReduceOp::sum).wait();
  EXPECT_EQ(t.current(MemCategory::comm) - before, 64u);
  EXPECT_EQ(ring_scratch_bytes(block, sizeof(double), 64), 64u);
  release_ring_scratch();
  set_bucket_bytes(size_t{1} << 20, 0);  // one piece per block
  release_ring_scratch();
  comm_->all_reduce(x.data(), x.data(), n, DType::f64, ReduceOp::sum).wait();
  EXPECT_EQ(t.current(MemCategory::comm) - before, 2 * block * sizeof(double));
  EXPECT_EQ(ring_scratch_bytes(block, sizeof(double), size_t{1} << 20), 2 * block * sizeof(double));
  EXPECT_EQ(ring_scratch_bytes_of(Reduction::all_reduce, n, DType::f64, size_), 2 * block * 8);
  EXPECT_EQ(ring_scratch_bytes_of(Reduction::reduce, n, DType::f64, size_), 2 * n * 8);
  EXPECT_EQ(ring_scratch_bytes_of(Reduction::reduce_scatter, n, DType::f64, size_), 2 * n * 8);
  EXPECT_EQ(ring_scratch_bytes_of(Reduction::all_reduce, n, DType::f64, 1), 0u) << "one rank";
  set_bucket_bytes(size_t{1} << 20);  // the default floor: 1001 doubles go to MPI
  EXPECT_EQ(ring_scratch_bytes_of(Reduction::all_reduce, n, DType::f64, size_), 0u);
  ASSERT_LE(size_, 4);
  EXPECT_EQ(ring_scratch_bytes_of(Reduction::all_reduce, 1 << 18, DType::f64, size_),
            size_t{1} << 20)
      << "2 MiB, above the floor, blocks longer than a piece: two pieces of half the bucket";
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], std::pow(size_, 2)) << "element " << i;
  release_ring_scratch();
  EXPECT_EQ(t.current(MemCategory::comm), before);
  set_bucket_bytes(kDefaultBucketBytes);
}

// A reduce's chain starts at the rank after the root, which only sends: it
// books no scratch; every other rank books what ring_scratch_bytes_of says
// for its own rank and the root.
TEST_F(CommTest, ReduceScratchIsOnEveryRankOfTheChainButTheFirst) {
  const MemTracker& t = MemTracker::get();
  const size_t n = 1001;
  set_bucket_bytes(size_t{1} << 20, 0);
  for (int root = 0; root < size_; ++root) {
    release_ring_scratch();
    const size_t before = t.current(MemCategory::comm);
    std::vector<double> x(n, 1.0 + rank_), out(n, 0.0);
    comm_->reduce(x.data(), out.data(), n, DType::f64, ReduceOp::sum, root).wait();
    const size_t booked = t.current(MemCategory::comm) - before;
    EXPECT_EQ(booked, ring_scratch_bytes_of(Reduction::reduce, n, DType::f64, size_, rank_, root))
        << "rank " << rank_ << ", root " << root;
    if (size_ > 1) {
      EXPECT_EQ(booked == 0, rank_ == (root + 1) % size_) << "rank " << rank_ << ", root " << root;
    }
    if (rank_ == root) {
      ASSERT_EQ(out[0], size_ * (size_ + 1) / 2.0) << "root " << root;
    }
  }
  release_ring_scratch();
  set_bucket_bytes(kDefaultBucketBytes);
}

TEST_F(CommTest, BroadcastInPieces) {
  std::unique_ptr<Communicator> small = make_mpi_communicator(mpi_, 40);
  const int root = size_ - 1;
  std::vector<float> buf(kCount, float(kUnset));
  if (rank_ == root)
    for (size_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>(value(root, i));
  Handle h = small->broadcast(buf.data(), kCount, DType::f32, root);
  h.wait();
  EXPECT_TRUE(matches(buf.data(), kCount, [&](size_t i) { return value(root, i); }));
}

// Each rank sends to the next and receives from the previous, both posted
// before either is waited for: 4 MiB is far above any eager limit, so a
// blocking send would deadlock here.
TEST_F(CommTest, SendRecvRing) {
  const size_t n = size_t(1) << 20;
  const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
  for (WaitPolicy wait : {WaitPolicy::poll, WaitPolicy::sleep}) {
    SCOPED_TRACE(std::string("comm.wait = ") + name_of(wait));
    set_wait_policy(wait);
    std::vector<float> out(n), in(n, float(kUnset));
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(value(rank_ + int(wait), i));
    Handle s = comm_->send(out.data(), n, DType::f32, next);
    Handle r = comm_->recv(in.data(), n, DType::f32, prev);
    r.wait();
    s.wait();
    EXPECT_TRUE(matches(in.data(), n, [&](size_t i) { return value(prev + int(wait), i); }));
    comm_->barrier();
  }
  set_wait_policy(WaitPolicy::poll);
}

// comm.wait = sleep: rank 1 waits 0.3 s for a message that rank 0 sends
// late, and spends on it a small part of its CPU, where a polling wait
// would spend what the scheduler gives it; the message arrives whole.
TEST_F(CommTest, ASleepingWaitGivesItsCoreAway) {
  EXPECT_THROW(set_wait_policy(WaitPolicy::automatic), RankError) << "auto is the run's to resolve";
  set_wait_policy(WaitPolicy::sleep);
  EXPECT_EQ(wait_policy(), WaitPolicy::sleep);
  const size_t n = size_t(1) << 18;
  std::vector<float> buf(n, float(kUnset));
  if (rank_ == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(value(0, i));
    comm_->send(buf.data(), n, DType::f32, 1).wait();
  } else if (rank_ == 1) {
    const double wall0 = MPI_Wtime(), cpu0 = thread_cpu_seconds();
    comm_->recv(buf.data(), n, DType::f32, 0).wait();
    const double wall = MPI_Wtime() - wall0, cpu = thread_cpu_seconds() - cpu0;
    EXPECT_GE(wall, 0.2);
    EXPECT_LT(cpu, 0.25 * wall) << "the waiting rank used " << cpu << " s of CPU in " << wall
                                << " s";
    EXPECT_TRUE(matches(buf.data(), n, [](size_t i) { return value(0, i); }));
  }
  comm_->barrier();
  set_wait_policy(WaitPolicy::poll);
}

TEST_F(CommTest, MessagesBetweenTwoRanksArriveInOrder) {
  constexpr int kMessages = 5;
  const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
  std::vector<std::vector<int32_t>> out(kMessages), in(kMessages);
  std::vector<Handle> handles;
  for (int k = 0; k < kMessages; ++k) {
    out[k].assign(kCount, 100 * rank_ + k);
    in[k].assign(kCount, kUnset);
    handles.push_back(comm_->send(out[k].data(), kCount, DType::i32, next));
  }
  for (int k = 0; k < kMessages; ++k)
    handles.push_back(comm_->recv(in[k].data(), kCount, DType::i32, prev));
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) it->wait();  // any order
  for (int k = 0; k < kMessages; ++k)
    EXPECT_TRUE(matches(in[k].data(), kCount, [&](size_t) { return 100 * prev + k; }))
        << "message " << k;
}

TEST_F(CommTest, HandleStates) {
  Handle none;
  EXPECT_TRUE(none.test()) << "a default Handle is complete";
  none.wait();

  std::vector<double> buf = {double(rank_)};
  Handle h = comm_->all_reduce(buf.data(), buf.data(), 1, DType::f64, ReduceOp::sum);
  while (!h.test()) {
  }
  EXPECT_EQ(buf[0], size_ * (size_ - 1) / 2.0);
  EXPECT_TRUE(h.test());
  h.wait();
  h.wait();  // twice is fine

  Handle moved = std::move(h);
  EXPECT_TRUE(moved.test());
}

// Rank 1 posts a receive that cannot complete before rank 0 passes the
// barrier, so test() is false at first and true later.
TEST_F(CommTest, TestIsFalseUntilTheMessageArrives) {
  int32_t x = kUnset;
  if (rank_ == 1) {
    Handle h = comm_->recv(&x, 1, DType::i32, 0);
    EXPECT_FALSE(h.test());
    comm_->barrier();
    while (!h.test()) {
    }
    EXPECT_EQ(x, 42);
  } else {
    comm_->barrier();
    if (rank_ == 0) {
      x = 42;
      comm_->send(&x, 1, DType::i32, 1).wait();
    }
  }
}

// Operations complete in issue order: waiting for the newest completes the
// older ones, including the move of an in-place reduce_scatter's result.
TEST_F(CommTest, WaitingCompletesOlderOperations) {
  const size_t n = kCount, first = rank_ * n;
  std::vector<float> a(size_ * n), b(n);
  for (size_t j = 0; j < a.size(); ++j) a[j] = static_cast<float>(value(rank_, j));
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<float>(value(rank_, i));
  Handle h1 = comm_->reduce_scatter(a.data(), a.data() + first, n, DType::f32, ReduceOp::sum);
  Handle h2 = comm_->all_reduce(b.data(), b.data(), n, DType::f32, ReduceOp::max);
  h2.wait();  // and nothing else touches h1 before the check
  EXPECT_TRUE(matches(a.data() + first, n, [&](size_t i) {
    return reduced(ReduceOp::sum, size_, first + i);
  }));
  EXPECT_TRUE(matches(b.data(), n, [&](size_t i) { return reduced(ReduceOp::max, size_, i); }));
  EXPECT_TRUE(h1.test());
}

// A pending Handle that goes out of scope waits for its operation; the other
// side completes it. The go-ahead travels on MPI_COMM_WORLD, outside comm_,
// so that rank 0 cannot complete the data transfer before the handle dies.
TEST_F(CommTest, DestroyingAPendingHandleWaits) {
  const size_t n = size_t(1) << 18;
  std::vector<float> buf(n, float(kUnset));
  if (rank_ == 0) {
    {
      Handle h = comm_->recv(buf.data(), n, DType::f32, 1);
      EXPECT_FALSE(h.test());
      MPI_Send(nullptr, 0, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
    }
    EXPECT_TRUE(matches(buf.data(), n, [](size_t i) { return value(1, i); }));
  } else if (rank_ == 1) {
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(value(1, i));
    MPI_Recv(nullptr, 0, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    Handle h = comm_->send(buf.data(), n, DType::f32, 0);  // dies pending, too
  }
  comm_->barrier();
}

TEST_F(CommTest, ZeroCountOperations) {
  const int last = size_ - 1;
  const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
  float x = 7;  // must not be touched
  for (float* p : {static_cast<float*>(nullptr), &x}) {
    comm_->all_reduce(p, p, 0, DType::f32, ReduceOp::sum).wait();
    comm_->reduce(p, p, 0, DType::f32, ReduceOp::max, last).wait();
    comm_->reduce_scatter(p, p, 0, DType::f32, ReduceOp::sum).wait();
    comm_->all_gather(p, p, 0, DType::f32).wait();
    comm_->broadcast(p, 0, DType::f32, last).wait();
    Handle s = comm_->send(p, 0, DType::f32, next);
    comm_->recv(p, 0, DType::f32, prev).wait();
  }
  EXPECT_EQ(x, 7);
}

// Rejected before any MPI call, on every rank, so no collective is left half posted.
TEST_F(CommTest, InvalidArgumentsThrowRankError) {
  float x = 1;
  const auto stream = reinterpret_cast<Stream>(uintptr_t(1));
  const size_t too_many = size_t(INT_MAX) + 1;
  EXPECT_THROW(mpi_type(DType::bf16), RankError);
  EXPECT_THROW((void)comm_->all_reduce(&x, &x, 1, DType::bf16, ReduceOp::sum), RankError);
  EXPECT_THROW((void)comm_->all_reduce(&x, &x, 1, DType::f32, ReduceOp::sum, stream), RankError);
  EXPECT_THROW((void)comm_->broadcast(&x, 1, DType::f32, 0, stream), RankError);
  EXPECT_THROW((void)comm_->send(&x, 1, DType::f32, 0, stream), RankError);
  EXPECT_THROW((void)comm_->broadcast(&x, 1, DType::f32, size_), RankError);
  EXPECT_THROW((void)comm_->recv(&x, 1, DType::f32, -1), RankError);
  try {
    (void)comm_->all_gather(&x, &x, too_many, DType::f32);
    ADD_FAILURE() << "no throw";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather: count 2147483648"), std::string::npos)
        << e.what();
  }
  comm_->barrier();
}
