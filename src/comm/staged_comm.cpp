#include "comm/staged_comm.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <utility>

#include "core/alloc.h"
#include "core/error.h"

namespace meshlm::comm {

DeviceAccess::~DeviceAccess() = default;

size_t staged_piece_elements(size_t element_bytes, int parts, int ranks, size_t staging_bytes) {
  // At least one element of the widest type per rank, for the pieces of
  // reduce_scatter and all_gather.
  const size_t cap = std::max(staging_bytes, size_t(ranks) * sizeof(double));
  return std::max<size_t>(1, cap / element_bytes / size_t(parts));
}

namespace {

// The operations of one staged Communicator not yet completed, in issue
// order: each the host Communicator's Handle, the message's host buffer
// (point to point) and what follows its completion (a receive's copy to the
// device).
class Pending {
public:
  uint64_t add(Handle inner, Buffer buffer = {}, std::function<void()> after = {}) {
    ops_.push_back({next_, std::move(inner), std::move(buffer), std::move(after)});
    return next_++;
  }
  // Completes every operation up to `seq`, oldest first.
  void wait_through(uint64_t seq) {
    while (!ops_.empty() && ops_.front().seq <= seq) {
      Op& op = ops_.front();
      op.inner.wait();
      if (op.after) op.after();
      ops_.pop_front();
    }
  }
  bool test_through(uint64_t seq) {
    while (!ops_.empty() && ops_.front().seq <= seq) {
      Op& op = ops_.front();
      if (!op.inner.test()) return false;
      if (op.after) op.after();
      ops_.pop_front();
    }
    return true;
  }

private:
  struct Op {
    uint64_t seq;
    Handle inner;
    Buffer buffer;
    std::function<void()> after;
  };
  std::deque<Op> ops_;
  uint64_t next_ = 0;
};

// Host <- a buffer of the caller, and back.
void copy_to_host(const DeviceAccess& dev, void* host, const void* src, size_t bytes,
                  Stream stream) {
  if (bytes == 0) return;
  if (dev.on_device(src)) dev.to_host(host, src, bytes, stream);
  else std::memcpy(host, src, bytes);
}
void copy_from_host(const DeviceAccess& dev, void* dst, const void* host, size_t bytes,
                    Stream stream) {
  if (bytes == 0) return;
  if (dev.on_device(dst)) dev.to_device(dst, host, bytes, stream);
  else std::memcpy(dst, host, bytes);
}

class StagedHandle : public HandleImpl {
public:
  StagedHandle(std::shared_ptr<Pending> pending, uint64_t seq)
      : pending_(std::move(pending)), seq_(seq) {}
  void wait() override { pending_->wait_through(seq_); }
  bool test() override { return pending_->test_through(seq_); }

private:
  std::shared_ptr<Pending> pending_;
  uint64_t seq_;
};

class StagedCommunicator : public Communicator {
public:
  StagedCommunicator(std::unique_ptr<Communicator> host, const DeviceAccess& device,
                     size_t staging_bytes)
      : host_(std::move(host)), dev_(device), pending_(std::make_shared<Pending>()),
        staging_bytes_(staging_bytes) {
    MESHLM_CHECK(host_ != nullptr && staging_bytes > 0,
                 "a staged communicator needs a host communicator and a staging buffer");
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return "mpi (host staging)"; }

  Handle all_reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                    Stream stream) override {
    if (!staged(send, recv)) return track(host_->all_reduce(send, recv, count, type, op));
    const size_t e = dtype_size(type);
    pieces(count, type, 1, [&](size_t off, size_t n) {
      fetch(stage(), at(send, off, e), n * e, stream);
      host_->all_reduce(stage(), stage(), n, type, op).wait();
      store(at(recv, off, e), stage(), n * e, stream);
    });
    return track(Handle());
  }

  Handle reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op, int root,
                Stream stream) override {
    if (!staged(send, recv)) return track(host_->reduce(send, recv, count, type, op, root));
    const size_t e = dtype_size(type);
    const bool at_root = rank() == root;
    pieces(count, type, 1, [&](size_t off, size_t n) {
      fetch(stage(), at(send, off, e), n * e, stream);
      host_->reduce(stage(), stage(), n, type, op, root).wait();
      if (at_root) store(at(recv, off, e), stage(), n * e, stream);
    });
    return track(Handle());
  }

  Handle reduce_scatter(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                        Stream stream) override {
    if (!staged(send, recv)) return track(host_->reduce_scatter(send, recv, count, type, op));
    const size_t e = dtype_size(type);
    const int p = size(), me = rank();
    // Piece [off, off + n) of every rank's block, side by side in the stage.
    // In place (recv = send + me * count), the piece written back is one
    // already read.
    pieces(count, type, p, [&](size_t off, size_t n) {
      for (int r = 0; r < p; ++r)
        fetch(stage() + r * n * e, at(send, r * count + off, e), n * e, stream);
      host_->reduce_scatter(stage(), stage() + me * n * e, n, type, op).wait();
      store(at(recv, off, e), stage() + me * n * e, n * e, stream);
    });
    return track(Handle());
  }

  Handle all_gather(const void* send, void* recv, size_t count, DType type,
                    Stream stream) override {
    if (!staged(send, recv)) return track(host_->all_gather(send, recv, count, type));
    const size_t e = dtype_size(type);
    const int p = size(), me = rank();
    pieces(count, type, p, [&](size_t off, size_t n) {
      fetch(stage() + me * n * e, at(send, off, e), n * e, stream);
      host_->all_gather(stage() + me * n * e, stage(), n, type).wait();
      for (int r = 0; r < p; ++r)
        store(at(recv, r * count + off, e), stage() + r * n * e, n * e, stream);
    });
    return track(Handle());
  }

  Handle broadcast(void* buf, size_t count, DType type, int root, Stream stream) override {
    if (!staged(buf, nullptr)) return track(host_->broadcast(buf, count, type, root));
    const size_t e = dtype_size(type);
    const bool at_root = rank() == root;
    pieces(count, type, 1, [&](size_t off, size_t n) {
      if (at_root) fetch(stage(), at(buf, off, e), n * e, stream);
      host_->broadcast(stage(), n, type, root).wait();
      if (!at_root) store(at(buf, off, e), stage(), n * e, stream);
    });
    return track(Handle());
  }

  Handle send(const void* buf, size_t count, DType type, int peer, Stream stream) override {
    if (!staged(buf, nullptr)) return track(host_->send(buf, count, type, peer));
    const size_t bytes = count * dtype_size(type);
    Buffer msg(bytes, MemCategory::comm, "comm.staged_message");
    fetch(msg.data(), buf, bytes, stream);
    Handle inner = host_->send(msg.data(), count, type, peer);
    return handle(pending_->add(std::move(inner), std::move(msg)));
  }

  Handle recv(void* buf, size_t count, DType type, int peer, Stream stream) override {
    if (!staged(buf, nullptr)) return track(host_->recv(buf, count, type, peer));
    const size_t bytes = count * dtype_size(type);
    Buffer msg(bytes, MemCategory::comm, "comm.staged_message");
    void* host = msg.data();
    Handle inner = host_->recv(host, count, type, peer);
    // The receive may complete after the Communicator is gone (its Handle
    // outlives it): the copy holds the DeviceAccess, which must outlive both.
    const DeviceAccess* dev = &dev_;
    auto after = [dev, buf, host, bytes, stream] {
      copy_from_host(*dev, buf, host, bytes, stream);
    };
    return handle(pending_->add(std::move(inner), std::move(msg), after));
  }

  void barrier() override {
    pending_->wait_through(UINT64_MAX);
    host_->barrier();
  }

private:
  bool staged(const void* a, const void* b) const {
    return (a != nullptr && dev_.on_device(a)) || (b != nullptr && dev_.on_device(b));
  }
  char* stage() { return stage_.as<char>(); }
  static const char* at(const void* p, size_t elements, size_t e) {
    return static_cast<const char*>(p) + elements * e;
  }
  static char* at(void* p, size_t elements, size_t e) {
    return static_cast<char*>(p) + elements * e;
  }
  void fetch(void* host, const void* src, size_t bytes, Stream stream) const {
    copy_to_host(dev_, host, src, bytes, stream);
  }
  void store(void* dst, const void* host, size_t bytes, Stream stream) const {
    copy_from_host(dev_, dst, host, bytes, stream);
  }
  // [0, count) in pieces (off, n) of at most what staging_bytes_ holds for
  // `parts` ranks' pieces side by side; the stage made as large as the
  // largest piece (once: it grows to what the group's collectives need).
  template <typename F>
  void pieces(size_t count, DType type, int parts, F&& piece) {
    const size_t e = dtype_size(type);
    const size_t most = staged_piece_elements(e, parts, host_->size(), staging_bytes_);
    const size_t need = std::min(most, count) * e * size_t(parts);
    if (stage_.bytes() < need) {
      stage_ = Buffer();  // the old stage gone before the new one is made
      stage_ = Buffer(need, MemCategory::comm, "comm.staging");
    }
    for (size_t off = 0; off < count; off += most) piece(off, std::min(most, count - off));
  }
  Handle handle(uint64_t seq) { return Handle(std::make_unique<StagedHandle>(pending_, seq)); }
  Handle track(Handle inner) { return handle(pending_->add(std::move(inner))); }

  std::unique_ptr<Communicator> host_;
  const DeviceAccess& dev_;
  std::shared_ptr<Pending> pending_;
  size_t staging_bytes_ = 0;
  Buffer stage_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                       const DeviceAccess& device,
                                                       size_t staging_bytes) {
  return std::make_unique<StagedCommunicator>(std::move(host), device, staging_bytes);
}

}  // namespace meshlm::comm
