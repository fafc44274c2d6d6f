// OrderedCommunicator: see comm/ordered_comm.h.
#include "comm/ordered_comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "comm/stall_watchdog.h"
#include "core/error.h"
#include "core/heartbeat.h"

namespace meshlm::comm {

namespace {

// One operation: what it does when it starts (read its input from the
// device, issue its MPI call into `req`) and when its request completes
// (write its result to the device).
struct Op {
  const char* what = "";
  int peer = -1;  // the group rank it waits for; -1: all (a collective)
  std::function<void(Op&)> start;
  std::function<void(Op&)> finish;
  std::vector<std::byte> in, out;  // host copies
  MPI_Request req = MPI_REQUEST_NULL;
  bool started = false, done = false;
};

// The operations of one Communicator not yet completed, in issue order: its
// "stream".
class Queue {
public:
  Queue(std::string name, std::vector<int> members)
      : name_(std::move(name)), members_(std::move(members)) {}
  const std::string& name() const { return name_; }
  const std::vector<int>* members() const { return &members_; }
  bool pending() const { return !ops_.empty(); }
  void push(std::shared_ptr<Op> op) { ops_.push_back(std::move(op)); }

  // Starts the oldest operation, completes it when MPI has, and goes on to
  // the next: one at a time, in issue order.
  void advance() {
    while (!ops_.empty()) {
      Op& op = *ops_.front();
      if (!op.started) {
        op.started = true;
        op.start(op);
      }
      int flag = 0;
      const int rc = MPI_Test(&op.req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        throw RankError(std::string(op.what) + " on " + name_ + ": MPI_Test failed", MESHLM_HERE);
      if (!flag) return;
      if (op.finish) op.finish(op);
      op.done = true;
      ops_.pop_front();
      heartbeat::beat();
    }
  }

private:
  std::string name_;
  std::vector<int> members_;
  std::deque<std::shared_ptr<Op>> ops_;
};

// The queues of this thread, which its waits advance.
struct Registry {
  std::vector<std::weak_ptr<Queue>> queues;
  bool advancing = false;
};
thread_local Registry t_registry;

bool advance_all() {
  Registry& r = t_registry;
  if (r.advancing) return true;  // (a wait inside an advance: the outer one goes on)
  r.advancing = true;
  bool pending = false;
  try {
    std::erase_if(r.queues, [](const std::weak_ptr<Queue>& q) { return q.expired(); });
    // (advance() may not add or remove queues: a copy of the pointers.)
    std::vector<std::shared_ptr<Queue>> live;
    for (const auto& w : r.queues)
      if (auto q = w.lock()) live.push_back(std::move(q));
    for (const auto& q : live) {
      q->advance();
      pending = pending || q->pending();
    }
  } catch (...) {
    r.advancing = false;
    throw;
  }
  r.advancing = false;
  return pending;
}

class OrderedHandle final : public HandleImpl {
public:
  OrderedHandle(std::shared_ptr<Queue> queue, std::shared_ptr<Op> op)
      : queue_(std::move(queue)), op_(std::move(op)) {}
  void wait() override {
    if (op_->done) return;
    note_wait(op_->what, queue_->members(), op_->peer);
    int pause_us = 0;
    try {
      for (;;) {
        advance_all();
        if (op_->done) break;
        if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
        pause_us = pause_us == 0 ? 1 : std::min(2 * pause_us, 100);
      }
    } catch (...) {
      note_wait_done();
      throw;
    }
    note_wait_done();
  }
  bool test() override {
    if (!op_->done) advance_all();
    return op_->done;
  }

private:
  std::shared_ptr<Queue> queue_;
  std::shared_ptr<Op> op_;
};

int checked_int(size_t count, const char* what, const std::string& name) {
  if (count > static_cast<size_t>(INT_MAX))
    throw RankError(std::string(what) + " on " + name + ": " + std::to_string(count) +
                        " elements exceed INT_MAX, the largest count MPI takes",
                    MESHLM_HERE);
  return static_cast<int>(count);
}

void mpi_check(int rc, const char* what, const char* call, const std::string& name) {
  if (rc != MPI_SUCCESS)
    throw RankError(std::string(what) + " on " + name + ": " + call + " failed", MESHLM_HERE);
}

class OrderedCommunicator final : public Communicator {
public:
  OrderedCommunicator(std::unique_ptr<Communicator> host, MPI_Comm group,
                      const DeviceAccess& device, std::string name)
      : host_(std::move(host)), comm_(group), dev_(device),
        queue_(std::make_shared<Queue>(std::move(name), world_ranks_of(group))) {
    MESHLM_CHECK(host_ != nullptr, "an ordered communicator needs its group's host communicator");
    t_registry.queues.push_back(queue_);
  }
  ~OrderedCommunicator() override {
    // As a stream is synchronized before its communicator goes: every
    // operation issued completes. Not while an error unwinds the rank (its
    // peers may be gone): the pending operations are then left as they are,
    // their buffers kept, until the job ends.
    if (std::uncaught_exceptions() > 0) {
      abandoned().push_back(queue_);
      return;
    }
    try {
      drain();
    } catch (const std::exception& e) {
      fatal_one(std::string("ordered communicator of ") + queue_->name() + ": " + e.what(),
                MESHLM_HERE);
    }
  }
  OrderedCommunicator(const OrderedCommunicator&) = delete;
  OrderedCommunicator& operator=(const OrderedCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return "nccl (emulated: MPI in NCCL's stream order)"; }

  Handle all_reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                    Stream) override {
    if (!device(send, recv, "all_reduce")) return host().all_reduce(send, recv, count, type, op);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(count, "all_reduce", name());
    const MPI_Datatype t = mpi_type(type);
    const MPI_Op o = mpi_op(op);
    return issue("all_reduce", -1, [=, this](Op& x) {
      x.in.resize(bytes);
      fetch(x.in.data(), send, bytes);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, x.in.data(), n, t, o, comm_.get(), &x.req),
                x.what, "MPI_Iallreduce", name());
    }, [=, this](Op& x) { store(recv, x.in.data(), bytes); });
  }

  Handle reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op, int root,
                Stream) override {
    if (!device(send, rank() == root ? recv : send, "reduce"))
      return host().reduce(send, recv, count, type, op, root);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(count, "reduce", name());
    const MPI_Datatype t = mpi_type(type);
    const MPI_Op o = mpi_op(op);
    const bool at_root = rank() == root;
    return issue("reduce", -1, [=, this](Op& x) {
      x.in.resize(bytes);
      fetch(x.in.data(), send, bytes);
      mpi_check(MPI_Ireduce(at_root ? MPI_IN_PLACE : x.in.data(), at_root ? x.in.data() : nullptr,
                            n, t, o, root, comm_.get(), &x.req),
                x.what, "MPI_Ireduce", name());
    }, [=, this](Op& x) {
      if (at_root) store(recv, x.in.data(), bytes);
    });
  }

  Handle reduce_scatter(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                        Stream) override {
    if (!device(send, recv, "reduce_scatter"))
      return host().reduce_scatter(send, recv, count, type, op);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(count, "reduce_scatter", name());
    const MPI_Datatype t = mpi_type(type);
    const MPI_Op o = mpi_op(op);
    const size_t ranks = static_cast<size_t>(size());
    return issue("reduce_scatter", -1, [=, this](Op& x) {
      x.in.resize(bytes * ranks);
      x.out.resize(bytes);
      fetch(x.in.data(), send, bytes * ranks);
      mpi_check(MPI_Ireduce_scatter_block(x.in.data(), x.out.data(), n, t, o, comm_.get(), &x.req),
                x.what, "MPI_Ireduce_scatter_block", name());
    }, [=, this](Op& x) { store(recv, x.out.data(), bytes); });
  }

  Handle all_gather(const void* send, void* recv, size_t count, DType type, Stream) override {
    if (!device(send, recv, "all_gather")) return host().all_gather(send, recv, count, type);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(bytes, "all_gather", name());
    const size_t ranks = static_cast<size_t>(size());
    return issue("all_gather", -1, [=, this](Op& x) {
      x.in.resize(bytes);
      x.out.resize(bytes * ranks);
      fetch(x.in.data(), send, bytes);
      mpi_check(MPI_Iallgather(x.in.data(), n, MPI_BYTE, x.out.data(), n, MPI_BYTE, comm_.get(),
                               &x.req),
                x.what, "MPI_Iallgather", name());
    }, [=, this](Op& x) { store(recv, x.out.data(), bytes * ranks); });
  }

  Handle broadcast(void* buf, size_t count, DType type, int root, Stream) override {
    if (!device(buf, nullptr, "broadcast")) return host().broadcast(buf, count, type, root);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(bytes, "broadcast", name());
    const bool at_root = rank() == root;
    return issue("broadcast", -1, [=, this](Op& x) {
      x.in.resize(bytes);
      if (at_root) fetch(x.in.data(), buf, bytes);
      mpi_check(MPI_Ibcast(x.in.data(), n, MPI_BYTE, root, comm_.get(), &x.req), x.what,
                "MPI_Ibcast", name());
    }, [=, this](Op& x) {
      if (!at_root) store(buf, x.in.data(), bytes);
    });
  }

  Handle send(const void* buf, size_t count, DType type, int peer, Stream) override {
    check_peer(peer, "send");
    if (!device(buf, nullptr, "send")) return host().send(buf, count, type, peer);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(bytes, "send", name());
    return issue("send", peer, [=, this](Op& x) {
      x.in.resize(bytes);
      fetch(x.in.data(), buf, bytes);
      // Synchronous: complete once the peer's receive has started, never
      // sooner, whatever the size (NCCL's may wait so at any size).
      mpi_check(MPI_Issend(x.in.data(), n, MPI_BYTE, peer, 0, comm_.get(), &x.req), x.what,
                "MPI_Issend", name());
    }, {});
  }

  Handle recv(void* buf, size_t count, DType type, int peer, Stream) override {
    check_peer(peer, "recv");
    if (!device(buf, nullptr, "recv")) return host().recv(buf, count, type, peer);
    const size_t bytes = count * dtype_size(type);
    const int n = checked_int(bytes, "recv", name());
    return issue("recv", peer, [=, this](Op& x) {
      x.in.resize(bytes);
      mpi_check(MPI_Irecv(x.in.data(), n, MPI_BYTE, peer, 0, comm_.get(), &x.req), x.what,
                "MPI_Irecv", name());
    }, [=, this](Op& x) { store(buf, x.in.data(), bytes); });
  }

  void barrier() override { host().barrier(); }

private:
  const std::string& name() const { return queue_->name(); }
  static std::vector<std::shared_ptr<Queue>>& abandoned() {
    static std::vector<std::shared_ptr<Queue>> queues;
    return queues;
  }

  // True for device buffers, false for host ones; a mix is the caller's error.
  bool device(const void* a, const void* b, const char* what) const {
    const bool da = dev_.on_device(a), db = b != nullptr && dev_.on_device(b);
    MESHLM_CHECK(b == nullptr || da == db, std::string(what) + " on " + name() +
                                                ": one buffer on the device, one on the host");
    return da;
  }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size())
      throw RankError(std::string(what) + " on " + name() + ": peer " + std::to_string(peer) +
                          " is not a rank of the group (size " + std::to_string(size()) + ")",
                      MESHLM_HERE);
  }
  void fetch(void* host, const void* device, size_t bytes) const {
    if (bytes > 0) dev_.to_host(host, device, bytes, nullptr);
  }
  void store(void* device, const void* host, size_t bytes) const {
    if (bytes > 0) dev_.to_device(device, host, bytes, nullptr);
  }
  // Every operation issued so far, completed.
  void drain() {
    while (queue_->pending()) {
      advance_all();
      if (queue_->pending()) std::this_thread::yield();
    }
  }
  // The host Communicator, once the operations issued before are done.
  Communicator& host() {
    drain();
    return *host_;
  }
  Handle issue(const char* what, int peer, std::function<void(Op&)> start,
               std::function<void(Op&)> finish) {
    auto op = std::make_shared<Op>();
    op->what = what;
    op->peer = peer;
    op->start = std::move(start);
    op->finish = std::move(finish);
    queue_->push(op);
    advance_all();  // it starts now when nothing is ahead of it
    return Handle(std::make_unique<OrderedHandle>(queue_, std::move(op)));
  }

  std::unique_ptr<Communicator> host_;
  OwnedComm comm_;
  const DeviceAccess& dev_;
  std::shared_ptr<Queue> queue_;
};

}  // namespace

std::unique_ptr<Communicator> make_ordered_communicator(std::unique_ptr<Communicator> host,
                                                        MPI_Comm group, const DeviceAccess& device,
                                                        std::string name) {
  return std::make_unique<OrderedCommunicator>(std::move(host), group, device, std::move(name));
}

bool advance_ordered_communicators() {
  if (t_registry.queues.empty()) return false;
  return advance_all();
}

}  // namespace meshlm::comm
