#include "comm/mpi_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/ordered_comm.h"
#include "comm/stall_watchdog.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/heartbeat.h"

namespace meshlm::comm {

namespace {

// Throws the MPI error string of `rc`. With MPI's default handler
// (MPI_ERRORS_ARE_FATAL) a failing call aborts before returning; this covers
// communicators whose handler returns errors.
void check(int rc, const char* op, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw RankError(std::string("comm::") + op + ": " + call + " failed: " + std::string(text, len),
                  MESHLM_HERE);
}

// MPI counts are int.
int to_int(size_t count, const char* op) {
  if (count > static_cast<size_t>(INT_MAX))
    throw RankError(std::string("comm::") + op + ": count " + std::to_string(count) +
                        " exceeds INT_MAX, the largest count MPI takes",
                    MESHLM_HERE);
  return static_cast<int>(count);
}

void check_host(Stream stream, const char* op) {
  if (stream != nullptr)
    throw RankError(std::string("comm::") + op +
                        ": the MPI backend moves host buffers; stream must be nullptr",
                    MESHLM_HERE);
}

std::atomic<WaitPolicy> g_wait_policy{WaitPolicy::poll};

// Where a wait waits: the world ranks of the group, and the group rank it
// waits for (-1: all of them). The stall watchdog reports it.
struct WaitSite {
  const std::vector<int>* members = nullptr;
  int peer = -1;
};

// Completes `n` requests under the process's wait policy (mpi_comm.h); each
// completion is progress (core/heartbeat.h).
void wait_requests(int n, MPI_Request* reqs, const char* op, const char* call, WaitSite site) {
  note_wait(op, site.members, site.peer);
  // While operations of an ordered communicator are pending, they advance
  // between the tests (comm/ordered_comm.h): an NCCL stream would go on.
  if (advance_ordered_communicators()) {
    for (;;) {
      int flag = 0;
      check(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE), op, call);
      if (flag) break;
      advance_ordered_communicators();
      std::this_thread::yield();
    }
  } else if (g_wait_policy.load(std::memory_order_relaxed) == WaitPolicy::poll) {
    check(n == 1 ? MPI_Wait(reqs, MPI_STATUS_IGNORE) : MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE),
          op, call);
  } else {
    int pause_us = kWaitSleepFirstUs;
    for (;;) {
      int flag = 0;
      check(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE), op, call);
      if (flag) break;
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      pause_us = std::min(2 * pause_us, kWaitSleepMostUs);
    }
  }
  note_wait_done();
  heartbeat::beat();
}

// The pending requests of one Communicator, oldest first. Completing request
// `seq` completes every older one first: that is the issue-order guarantee.
// `done` runs on completion (the in-place reduce_scatter moves its result).
class RequestQueue {
public:
  explicit RequestQueue(std::vector<int> members) : members_(std::move(members)) {}
  const std::vector<int>* members() const { return &members_; }

  uint64_t push(MPI_Request req, const char* op, std::function<void()> done, int peer = -1) {
    pending_.push_back({next_, req, op, std::move(done), peer});
    return next_++;
  }

  void wait_through(uint64_t seq) {
    while (!pending_.empty() && pending_.front().seq <= seq) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      wait_requests(1, &p.req, p.op, "MPI_Wait", {&members_, p.peer});
      if (p.done) p.done();
    }
  }

  void wait_all() {
    if (!pending_.empty()) wait_through(pending_.back().seq);
  }

  bool test_through(uint64_t seq) {
    while (!pending_.empty() && pending_.front().seq <= seq) {
      Pending& p = pending_.front();
      int flag = 0;
      check(MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE), p.op, "MPI_Test");
      if (!flag) return false;
      heartbeat::beat();
      std::function<void()> done = std::move(p.done);
      pending_.pop_front();
      if (done) done();
    }
    return true;
  }

private:
  struct Pending {
    uint64_t seq;
    MPI_Request req;
    const char* op;
    std::function<void()> done;
    int peer;  // the group rank waited for; -1: all (a collective)
  };
  std::vector<int> members_;  // the group's world ranks
  std::deque<Pending> pending_;
  uint64_t next_ = 0;
};


// The scratch of the ring reductions: one per process (its communicators
// are driven by one thread at a time; the mutex makes that sure), in the
// comm category, grown to the largest need and kept.
struct RingScratch {
  std::mutex mutex;
  Buffer buffer;
  char* at_least(size_t bytes) {
    if (buffer.bytes() < bytes) {
      buffer = Buffer();  // the old one goes first: never both at once
      buffer = Buffer(bytes, MemCategory::comm, "comm.ring_scratch");
    }
    return buffer.as<char>();
  }
};
RingScratch& ring_scratch() {
  static RingScratch s;
  return s;
}

size_t g_bucket_bytes = kDefaultBucketBytes;
size_t g_ring_min_bytes = kRingMinBytes;

// Elements of one piece of a ring reduction: half the bucket.
size_t piece_elements(size_t bucket_bytes, size_t element_bytes) {
  return std::max<size_t>(1, bucket_bytes / (2 * element_bytes));
}

// Block j of n elements cut into p nearly equal blocks: [begin, end).
size_t block_begin(size_t n, int p, int j) { return n / p * j + std::min<size_t>(j, n % p); }

// Shares the queue, so a Handle may outlive its Communicator.
class MpiHandle : public HandleImpl {
public:
  MpiHandle(std::shared_ptr<RequestQueue> queue, uint64_t seq)
      : queue_(std::move(queue)), seq_(seq) {}
  void wait() override { queue_->wait_through(seq_); }
  bool test() override { return queue_->test_through(seq_); }

private:
  std::shared_ptr<RequestQueue> queue_;
  uint64_t seq_;
};

class MpiCommunicator : public Communicator {
public:
  MpiCommunicator(MPI_Comm comm, size_t piece_bytes) : comm_(comm), piece_bytes_(piece_bytes) {
    if (comm == MPI_COMM_NULL)
      throw RankError("make_mpi_communicator: MPI_COMM_NULL (this rank is not in the group)",
                      MESHLM_HERE);
    check(MPI_Comm_rank(comm, &rank_), "make_mpi_communicator", "MPI_Comm_rank");
    check(MPI_Comm_size(comm, &size_), "make_mpi_communicator", "MPI_Comm_size");
    queue_ = std::make_shared<RequestQueue>(world_ranks_of(comm));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  Handle all_reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                    Stream stream) override {
    const char* name = "all_reduce";
    check_host(stream, name);
    if (use_ring(Reduction::all_reduce, count, type)) {
      ring_all_reduce(static_cast<const char*>(send), static_cast<char*>(recv), count, type, op);
      return Handle();
    }
    const void* sbuf = (send == recv) ? MPI_IN_PLACE : send;
    MPI_Request req;
    check(MPI_Iallreduce(sbuf, recv, to_int(count, name), mpi_type(type), mpi_op(op), comm_, &req),
          name, "MPI_Iallreduce");
    return enqueue(req, name);
  }

  Handle reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op, int root,
                Stream stream) override {
    const char* name = "reduce";
    check_host(stream, name);
    check_rank(root, name, "root");
    if (use_ring(Reduction::reduce, count, type)) {
      ring_reduce(static_cast<const char*>(send), static_cast<char*>(recv), count, type, op, root);
      return Handle();
    }
    const bool at_root = rank_ == root;
    const void* sbuf = (at_root && send == recv) ? MPI_IN_PLACE : send;
    // recv is insignificant elsewhere; passing null keeps a non-root send ==
    // recv from looking like aliased buffers to MPI.
    void* rbuf = at_root ? recv : nullptr;
    MPI_Request req;
    check(MPI_Ireduce(sbuf, rbuf, to_int(count, name), mpi_type(type), mpi_op(op), root, comm_,
                      &req),
          name, "MPI_Ireduce");
    return enqueue(req, name);
  }

  Handle reduce_scatter(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                        Stream stream) override {
    const char* name = "reduce_scatter";
    check_host(stream, name);
    if (use_ring(Reduction::reduce_scatter, count, type)) {
      const size_t bytes = count * dtype_size(type);
      ring_reduce_scatter(static_cast<const char*>(send), static_cast<char*>(recv),
                          [count](int j) { return count * j; }, [count](int) { return count; },
                          bytes, type, op);
      return Handle();
    }
    const int n = to_int(count, name);
    const size_t chunk = count * dtype_size(type);
    char* mine = const_cast<char*>(static_cast<const char*>(send)) + rank_ * chunk;
    MPI_Request req;
    if (recv != mine) {
      check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(type), mpi_op(op), comm_, &req),
            name, "MPI_Ireduce_scatter_block");
      return enqueue(req, name);
    }
    // In place, NCCL's convention: the result belongs in this rank's chunk, but
    // MPI_IN_PLACE leaves it at the start of the buffer. Move it on completion
    // (in the Handle's wait/test), so the operation stays asynchronous.
    char* base = const_cast<char*>(static_cast<const char*>(send));
    check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, n, mpi_type(type), mpi_op(op), comm_,
                                    &req),
          name, "MPI_Ireduce_scatter_block");
    std::function<void()> done;
    if (rank_ != 0 && chunk != 0)  // (no memmove of nullptr, even of 0 bytes)
      done = [base, mine, chunk] { std::memmove(mine, base, chunk); };
    return enqueue(req, name, std::move(done));
  }

  Handle all_gather(const void* send, void* recv, size_t count, DType type,
                    Stream stream) override {
    const char* name = "all_gather";
    check_host(stream, name);
    const int n = to_int(count, name);
    const char* mine = static_cast<const char*>(recv) + rank_ * count * dtype_size(type);
    const MPI_Datatype t = mpi_type(type);
    MPI_Request req;
    check(send == mine ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, t, comm_, &req)
                   : MPI_Iallgather(send, n, t, recv, n, t, comm_, &req),
          name, "MPI_Iallgather");
    return enqueue(req, name);
  }

  Handle broadcast(void* buf, size_t count, DType type, int root, Stream stream) override {
    const char* name = "broadcast";
    check_host(stream, name);
    check_rank(root, name, "root");
    // MPI counts are int: a large buffer goes out in pieces of at most
    // kBroadcastPieceBytes, queued one after the other. The Handle of the
    // last piece completes them all (issue order).
    const size_t esize = dtype_size(type), piece = std::max<size_t>(1, piece_bytes_ / esize);
    char* p = static_cast<char*>(buf);
    uint64_t last = 0;
    size_t done = 0;
    do {
      const size_t n = std::min(piece, count - done);
      MPI_Request req;
      check(MPI_Ibcast(p + done * esize, to_int(n, name), mpi_type(type), root, comm_, &req),
            name, "MPI_Ibcast");
      last = queue_->push(req, name, {});
      done += n;
    } while (done < count);
    return Handle(std::make_unique<MpiHandle>(queue_, last));
  }

  Handle send(const void* buf, size_t count, DType type, int peer, Stream stream) override {
    const char* name = "send";
    check_host(stream, name);
    check_rank(peer, name, "peer");
    MPI_Request req;
    check(MPI_Isend(buf, to_int(count, name), mpi_type(type), peer, kTag, comm_, &req), name,
          "MPI_Isend");
    return enqueue(req, name, {}, peer);
  }

  Handle recv(void* buf, size_t count, DType type, int peer, Stream stream) override {
    const char* name = "recv";
    check_host(stream, name);
    check_rank(peer, name, "peer");
    MPI_Request req;
    check(MPI_Irecv(buf, to_int(count, name), mpi_type(type), peer, kTag, comm_, &req), name,
          "MPI_Irecv");
    return enqueue(req, name, {}, peer);
  }

  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier", "MPI_Ibarrier");
    wait_requests(1, &req, "barrier", "MPI_Wait", site());
  }

private:
  // One tag for all point-to-point traffic: MPI keeps messages with the same
  // (source, tag, communicator) in order, which is the order comm.h promises.
  static constexpr int kTag = 0;
  // The ring reductions' own messages, apart from the callers'.
  static constexpr int kRingTag = 1;

  // Reductions of more than kRingMinBytes over two ranks or more run in the
  // ring (ring_scratch_bytes in mpi_comm.h says why); the smaller ones, and
  // every reduction when the bucket is 0, in MPI's own collectives.
  bool use_ring(Reduction kind, size_t count, DType type) const {
    return ring_scratch_bytes_of(kind, count, type, size_) > 0;
  }

  // One exchange of a ring: `n_send` elements to the next rank while `n_recv`
  // come from the previous one.
  void ring_exchange(const char* out, size_t n_send, char* in, size_t n_recv, MPI_Datatype t,
                     const char* name) {
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    MPI_Request reqs[2];
    check(MPI_Irecv(in, to_int(n_recv, name), t, prev, kRingTag, comm_, &reqs[0]), name,
          "MPI_Irecv");
    check(MPI_Isend(out, to_int(n_send, name), t, next, kRingTag, comm_, &reqs[1]), name,
          "MPI_Isend");
    wait_requests(2, reqs, name, "MPI_Waitall", site(prev));
  }

  // A blocking send or receive of the ring, waited for under the policy.
  void ring_send(const char* buf, int n, MPI_Datatype t, int to, const char* name) {
    MPI_Request req;
    check(MPI_Isend(buf, n, t, to, kRingTag, comm_, &req), name, "MPI_Isend");
    wait_requests(1, &req, name, "MPI_Wait", site(to));
  }
  void ring_recv(char* buf, int n, MPI_Datatype t, int from, const char* name) {
    MPI_Request req;
    check(MPI_Irecv(buf, n, t, from, kRingTag, comm_, &req), name, "MPI_Irecv");
    wait_requests(1, &req, name, "MPI_Wait", site(from));
  }

  // Reduce-scatter in a ring: block j of `src` is [begin(j), begin(j) +
  // len(j)) elements; this rank's reduced block goes to `dst` (which may be
  // its block of src: the in-place forms). Each block is reduced along one
  // path, starting at the rank after its owner and ending at the owner, in
  // pieces of at most half the bucket; the partial sums travel through two
  // scratch pieces, so src is only read. `max_len_bytes` is the longest
  // block, in bytes.
  template <typename Begin, typename Len>
  void ring_reduce_scatter(const char* src, char* dst, Begin begin, Len len, size_t max_len_bytes,
                           DType type, ReduceOp op) {
    const char* name = "reduce_scatter";
    queue_->wait_all();  // issue order: what came before completes first
    const size_t es = dtype_size(type);
    const size_t piece = piece_elements(g_bucket_bytes, es);
    const MPI_Datatype t = mpi_type(type);
    const MPI_Op mop = mpi_op(op);
    RingScratch& scratch = ring_scratch();
    std::lock_guard<std::mutex> lock(scratch.mutex);
    char* a = scratch.at_least(ring_scratch_bytes(max_len_bytes / es, es, g_bucket_bytes));
    char* b = a + std::min(piece, max_len_bytes / es) * es;
    auto mod = [this](int j) { return ((j % size_) + size_) % size_; };
    for (size_t k = 0; k * es < max_len_bytes; k += piece) {
      auto piece_len = [&](int j) { return len(j) > k ? std::min(piece, len(j) - k) : size_t{0}; };
      auto own = [&](int j) { return src + (begin(j) + k) * es; };
      char* cur = a;
      char* nxt = b;
      for (int s = 0; s < size_ - 1; ++s) {
        const int out = mod(rank_ - 1 - s), in = mod(rank_ - 2 - s);
        ring_exchange(s == 0 ? own(out) : cur, piece_len(out), nxt, piece_len(in), t, name);
        if (piece_len(in) > 0)  // nxt = own op nxt
          check(MPI_Reduce_local(own(in), nxt, to_int(piece_len(in), name), t, mop), name,
                "MPI_Reduce_local");
        std::swap(cur, nxt);
      }
      if (piece_len(rank_) > 0) std::memmove(dst + k * es, cur, piece_len(rank_) * es);
    }
  }

  // All-reduce: the ring reduce-scatter into this rank's block of recv, then
  // the blocks passed round the ring into every rank's recv. Every rank
  // ends with the same bits.
  void ring_all_reduce(const char* send, char* recv, size_t count, DType type, ReduceOp op) {
    const char* name = "all_reduce";
    const size_t es = dtype_size(type);
    const int p = size_;
    auto begin = [count, p](int j) { return block_begin(count, p, j); };
    auto len = [count, p](int j) { return block_begin(count, p, j + 1) - block_begin(count, p, j); };
    ring_reduce_scatter(send, recv + begin(rank_) * es, begin, len, len(0) * es, type, op);
    const MPI_Datatype t = mpi_type(type);
    for (int s = 0; s < p - 1; ++s) {
      const int out = (rank_ - s + p) % p, in = (rank_ - s - 1 + 2 * p) % p;
      ring_exchange(recv + begin(out) * es, len(out), recv + begin(in) * es, len(in), t, name);
    }
  }

  // Reduce to `root` along a chain that starts at the rank after it and ends
  // at it, in pieces of at most half the bucket.
  void ring_reduce(const char* send, char* recv, size_t count, DType type, ReduceOp op, int root) {
    const char* name = "reduce";
    queue_->wait_all();
    const size_t es = dtype_size(type);
    const size_t piece = piece_elements(g_bucket_bytes, es);
    const MPI_Datatype t = mpi_type(type);
    const MPI_Op mop = mpi_op(op);
    const int pos = (rank_ - root - 1 + 2 * size_) % size_;  // root is last: size_ - 1
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    RingScratch& scratch = ring_scratch();
    std::lock_guard<std::mutex> lock(scratch.mutex);
    char* a = pos == 0 ? nullptr : scratch.at_least(ring_scratch_bytes(count, es, g_bucket_bytes));
    for (size_t k = 0; k < count; k += piece) {
      const size_t n = std::min(piece, count - k);
      const int ni = to_int(n, name);
      if (pos == 0) {
        ring_send(send + k * es, ni, t, next, name);
        continue;
      }
      ring_recv(a, ni, t, prev, name);
      check(MPI_Reduce_local(send + k * es, a, ni, t, mop), name, "MPI_Reduce_local");
      if (rank_ == root)
        std::memmove(recv + k * es, a, n * es);
      else
        ring_send(a, ni, t, next, name);
    }
  }

  void check_rank(int r, const char* op, const char* what) const {
    if (r < 0 || r >= size_)
      throw RankError(std::string("comm::") + op + ": " + what + " " + std::to_string(r) +
                          " is not a rank of this group of " + std::to_string(size_),
                      MESHLM_HERE);
  }

  WaitSite site(int peer = -1) const { return {queue_->members(), peer}; }

  Handle enqueue(MPI_Request req, const char* op, std::function<void()> done = {}, int peer = -1) {
    const uint64_t seq = queue_->push(req, op, std::move(done), peer);
    return Handle(std::make_unique<MpiHandle>(queue_, seq));
  }

  MPI_Comm comm_;
  size_t piece_bytes_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<RequestQueue> queue_;
};

}  // namespace

void set_bucket_bytes(size_t bytes, size_t ring_min_bytes) {
  g_bucket_bytes = bytes;
  g_ring_min_bytes = ring_min_bytes;
}
size_t bucket_bytes() { return g_bucket_bytes; }

void set_wait_policy(WaitPolicy policy) {
  if (policy == WaitPolicy::automatic)
    throw RankError("comm::set_wait_policy: auto must be resolved to poll or sleep first",
                    MESHLM_HERE);
  g_wait_policy.store(policy, std::memory_order_relaxed);
}
WaitPolicy wait_policy() { return g_wait_policy.load(std::memory_order_relaxed); }

size_t ring_scratch_bytes_of(Reduction kind, size_t count, DType type, int ranks, int rank,
                             int root) {
  const size_t es = dtype_size(type);
  const size_t total = kind == Reduction::reduce_scatter ? count * ranks : count;
  if (ranks < 2 || g_bucket_bytes == 0 || total * es <= g_ring_min_bytes) return 0;
  if (kind == Reduction::reduce && rank >= 0 && rank == (root + 1) % ranks) return 0;
  const size_t block = kind == Reduction::all_reduce ? (count + ranks - 1) / ranks : count;
  return ring_scratch_bytes(block, es, g_bucket_bytes);
}

void release_ring_scratch() {
  RingScratch& scratch = ring_scratch();
  std::lock_guard<std::mutex> lock(scratch.mutex);
  scratch.buffer = Buffer();
}

size_t ring_scratch_bytes(size_t block_elements, size_t element_bytes, size_t bucket_bytes) {
  return 2 * std::min(piece_elements(bucket_bytes, element_bytes), block_elements) * element_bytes;
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, size_t broadcast_piece_bytes) {
  MESHLM_CHECK(broadcast_piece_bytes > 0, "broadcast pieces must not be empty");
  return std::make_unique<MpiCommunicator>(comm, broadcast_piece_bytes);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
  }
  throw RankError("comm: unknown ReduceOp", MESHLM_HERE);
}

MPI_Datatype mpi_type(DType type) {
  switch (type) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::u16: return MPI_UINT16_T;
    case DType::u32: return MPI_UINT32_T;
    case DType::i8: return MPI_INT8_T;
    case DType::bf16: break;
  }
  throw RankError(std::string("comm: no MPI type for dtype ") + dtype_name(type) +
                      " (the MPI backend reduces f32, f64 and integers only)",
                  MESHLM_HERE);
}

bool threads_may_call_mpi() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

OwnedComm::OwnedComm(MPI_Comm comm) { MPI_Comm_dup(comm, &comm_); }

std::unique_ptr<OwnedComm> OwnedComm::first_ranks(MPI_Comm comm, int n) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  auto c = std::make_unique<OwnedComm>();
  MPI_Comm_split(comm, rank < n ? 0 : MPI_UNDEFINED, rank, &c->comm_);
  return c;
}

OwnedComm::~OwnedComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 1;
  check(MPI_Comm_size(comm, &size), "world_ranks_of", "MPI_Comm_size");
  std::vector<int> mine(static_cast<size_t>(size)), world(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) mine[static_cast<size_t>(i)] = i;
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  check(MPI_Comm_group(comm, &g), "world_ranks_of", "MPI_Comm_group");
  check(MPI_Comm_group(MPI_COMM_WORLD, &wg), "world_ranks_of", "MPI_Comm_group");
  check(MPI_Group_translate_ranks(g, size, mine.data(), wg, world.data()), "world_ranks_of",
        "MPI_Group_translate_ranks");
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return world;
}

}  // namespace meshlm::comm
