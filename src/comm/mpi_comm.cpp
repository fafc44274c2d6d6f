#include "comm/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "core/error.h"

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

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
  }
  throw RankError("comm: unknown ReduceOp", MESHLM_HERE);
}

// The pending requests of one Communicator, oldest first. Completing request
// `seq` completes every older one first: that is the issue-order guarantee.
// `done` runs on completion (the in-place reduce_scatter moves its result).
class RequestQueue {
public:
  uint64_t push(MPI_Request req, const char* op, std::function<void()> done) {
    pending_.push_back({next_, req, op, std::move(done)});
    return next_++;
  }

  void wait_through(uint64_t seq) {
    while (!pending_.empty() && pending_.front().seq <= seq) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      check(MPI_Wait(&p.req, MPI_STATUS_IGNORE), p.op, "MPI_Wait");
      if (p.done) p.done();
    }
  }

  bool test_through(uint64_t seq) {
    while (!pending_.empty() && pending_.front().seq <= seq) {
      Pending& p = pending_.front();
      int flag = 0;
      check(MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE), p.op, "MPI_Test");
      if (!flag) return false;
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
  };
  std::deque<Pending> pending_;
  uint64_t next_ = 0;
};

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
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  Handle all_reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                    Stream stream) override {
    const char* name = "all_reduce";
    check_host(stream, name);
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
    return enqueue(req, name);
  }

  Handle recv(void* buf, size_t count, DType type, int peer, Stream stream) override {
    const char* name = "recv";
    check_host(stream, name);
    check_rank(peer, name, "peer");
    MPI_Request req;
    check(MPI_Irecv(buf, to_int(count, name), mpi_type(type), peer, kTag, comm_, &req), name,
          "MPI_Irecv");
    return enqueue(req, name);
  }

  void barrier() override { check(MPI_Barrier(comm_), "barrier", "MPI_Barrier"); }

private:
  // One tag for all point-to-point traffic: MPI keeps messages with the same
  // (source, tag, communicator) in order, which is the order comm.h promises.
  static constexpr int kTag = 0;

  void check_rank(int r, const char* op, const char* what) const {
    if (r < 0 || r >= size_)
      throw RankError(std::string("comm::") + op + ": " + what + " " + std::to_string(r) +
                          " is not a rank of this group of " + std::to_string(size_),
                      MESHLM_HERE);
  }

  Handle enqueue(MPI_Request req, const char* op, std::function<void()> done = {}) {
    const uint64_t seq = queue_->push(req, op, std::move(done));
    return Handle(std::make_unique<MpiHandle>(queue_, seq));
  }

  MPI_Comm comm_;
  size_t piece_bytes_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<RequestQueue> queue_ = std::make_shared<RequestQueue>();
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, size_t broadcast_piece_bytes) {
  MESHLM_CHECK(broadcast_piece_bytes > 0, "broadcast pieces must not be empty");
  return std::make_unique<MpiCommunicator>(comm, broadcast_piece_bytes);
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

}  // namespace meshlm::comm
