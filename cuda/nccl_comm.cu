// NcclCommunicator: see cuda/nccl_comm.h.
#include "cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "comm/stall_watchdog.h"
#include "core/error.h"
#include "core/heartbeat.h"
#include "cuda/cuda_check.cuh"

namespace meshlm::cuda {

namespace {

bool on_device(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

ncclRedOp_t nccl_op(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::sum: return ncclSum;
    case comm::ReduceOp::min: return ncclMin;
    case comm::ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// The NCCL type of `t` for a reduction; RankError where NCCL has none.
ncclDataType_t reduced_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::u8: return ncclUint8;
    case DType::u32: return ncclUint32;
    case DType::i8: return ncclInt8;
    case DType::u16: break;
  }
  throw RankError(std::string("NCCL cannot reduce elements of type ") + dtype_name(t), MESHLM_HERE);
}

// What moves without arithmetic (gathers, broadcasts, messages): bytes.
size_t bytes_of(size_t count, DType t) { return count * dtype_size(t); }

// What a wait names to the stall watchdog and in errors: the group's world
// ranks, its NCCL communicator and its name (shared by the communicator and
// its pending operations).
struct Group {
  std::vector<int> members;
  ncclComm_t comm = nullptr;
  std::string name;
};

// One operation queued on the communicator's stream: done when its event
// is. The wait polls the event, so that the stall watchdog sees what this
// rank waits in (comm/stall_watchdog.h) and an error NCCL reports meanwhile
// (a peer gone) ends it; completion is progress (core/heartbeat.h).
class NcclHandle final : public comm::HandleImpl {
public:
  NcclHandle(cudaEvent_t done, std::shared_ptr<const Group> group, const char* op, int peer)
      : done_(done), group_(std::move(group)), op_(op), peer_(peer) {}
  ~NcclHandle() override { cudaEventDestroy(done_); }
  void wait() override {
    comm::note_wait(op_, &group_->members, peer_);
    int pause_us = 0;
    while (!test()) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(group_->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        comm::note_wait_done();
        throw RankError(std::string(op_) + " on " + group_->name + " failed: NCCL error " +
                            ncclGetErrorString(async),
                        MESHLM_HERE);
      }
      if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      pause_us = pause_us == 0 ? 1 : std::min(2 * pause_us, 200);
    }
    comm::note_wait_done();
    heartbeat::beat();
  }
  bool test() override {
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
  }

private:
  cudaEvent_t done_;
  std::shared_ptr<const Group> group_;
  const char* op_;
  int peer_;
};

class NcclCommunicator final : public comm::Communicator {
public:
  NcclCommunicator(std::unique_ptr<comm::Communicator> host, void* compute, std::string name,
                   std::vector<int> members)
      : host_(std::move(host)), compute_(static_cast<cudaStream_t>(compute)),
        name_(std::move(name)) {
    MESHLM_CHECK(host_ != nullptr && compute_ != nullptr,
                 "an NCCL communicator needs its group's host communicator and the compute stream");
    ncclUniqueId id{};
    if (host_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_->broadcast(&id, sizeof(id), DType::u8, 0).wait();
    check(ncclCommInitRank(&comm_, host_->size(), id, host_->rank()), "ncclCommInitRank");
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    auto group = std::make_shared<Group>();
    group->members = std::move(members);
    group->comm = comm_;
    group->name = name_;
    group_ = std::move(group);
    // A stall aborts the communicator first: its kernels then give the
    // device back to the job's end.
    comm::on_stall(this, [c = comm_] { ncclCommAbort(c); });
  }
  ~NcclCommunicator() override {
    comm::forget_on_stall(this);
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return "nccl"; }

  comm::Handle all_reduce(const void* send, void* recv, size_t count, DType type,
                          comm::ReduceOp op, comm::Stream stream) override {
    if (!device(send, recv, "all_reduce")) return host().all_reduce(send, recv, count, type, op);
    return enqueue("ncclAllReduce", "all_reduce", -1, stream, [&] {
      return ncclAllReduce(send, recv, count, reduced_type(type), nccl_op(op), comm_, stream_);
    });
  }

  comm::Handle reduce(const void* send, void* recv, size_t count, DType type, comm::ReduceOp op,
                      int root, comm::Stream stream) override {
    if (!device(send, recv, "reduce")) return host().reduce(send, recv, count, type, op, root);
    return enqueue("ncclReduce", "reduce", -1, stream, [&] {
      return ncclReduce(send, recv, count, reduced_type(type), nccl_op(op), root, comm_, stream_);
    });
  }

  comm::Handle reduce_scatter(const void* send, void* recv, size_t count, DType type,
                              comm::ReduceOp op, comm::Stream stream) override {
    if (!device(send, recv, "reduce_scatter"))
      return host().reduce_scatter(send, recv, count, type, op);
    return enqueue("ncclReduceScatter", "reduce_scatter", -1, stream, [&] {
      return ncclReduceScatter(send, recv, count, reduced_type(type), nccl_op(op), comm_, stream_);
    });
  }

  comm::Handle all_gather(const void* send, void* recv, size_t count, DType type,
                          comm::Stream stream) override {
    if (!device(send, recv, "all_gather")) return host().all_gather(send, recv, count, type);
    return enqueue("ncclAllGather", "all_gather", -1, stream, [&] {
      return ncclAllGather(send, recv, bytes_of(count, type), ncclUint8, comm_, stream_);
    });
  }

  comm::Handle broadcast(void* buf, size_t count, DType type, int root,
                         comm::Stream stream) override {
    if (!device(buf, nullptr, "broadcast")) return host().broadcast(buf, count, type, root);
    return enqueue("ncclBroadcast", "broadcast", -1, stream, [&] {
      return ncclBroadcast(buf, buf, bytes_of(count, type), ncclUint8, root, comm_, stream_);
    });
  }

  comm::Handle send(const void* buf, size_t count, DType type, int peer,
                    comm::Stream stream) override {
    if (!device(buf, nullptr, "send")) return host().send(buf, count, type, peer);
    return enqueue("ncclSend", "send", peer, stream, [&] {
      return ncclSend(buf, bytes_of(count, type), ncclUint8, peer, comm_, stream_);
    });
  }

  comm::Handle recv(void* buf, size_t count, DType type, int peer, comm::Stream stream) override {
    if (!device(buf, nullptr, "recv")) return host().recv(buf, count, type, peer);
    return enqueue("ncclRecv", "recv", peer, stream, [&] {
      return ncclRecv(buf, bytes_of(count, type), ncclUint8, peer, comm_, stream_);
    });
  }

  void barrier() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_->barrier();
  }

private:
  // True for device buffers (NCCL's), false for host ones (MPI's); a mix is
  // an error of the caller.
  bool device(const void* a, const void* b, const char* op) const {
    const bool da = on_device(a), db = b != nullptr && on_device(b);
    MESHLM_CHECK(b == nullptr || da == db,
                 std::string(op) + " on " + name_ + ": one buffer on the device, one on the host");
    return da;
  }
  // The host communicator, once the NCCL operations issued before are done
  // (operations complete in issue order, comm/comm.h).
  comm::Communicator& host() {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return *host_;
  }
  // Queues `call` (an NCCL operation on stream_) after the work on the
  // compute stream (or `stream`, when given).
  // `op` names the NCCL call in errors, `what` the operation to the stall
  // watchdog, waiting for group rank `peer` (-1: all).
  template <typename F>
  comm::Handle enqueue(const char* op, const char* what, int peer, comm::Stream stream, F&& call) {
    CUDA_CHECK(cudaEventRecord(ready_, stream ? static_cast<cudaStream_t>(stream) : compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    check(call(), op);
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream_));
    return comm::Handle(std::make_unique<NcclHandle>(done, group_, what, peer));
  }
  void check(ncclResult_t r, const char* op) const {
    if (r == ncclSuccess) return;
    std::string msg = std::string(op) + " on " + name_ + " (rank " + std::to_string(rank()) +
                      " of " + std::to_string(size()) + ") failed: NCCL error " +
                      std::to_string(static_cast<int>(r)) + " (" + ncclGetErrorString(r) + ")";
    const char* detail = ncclGetLastError(comm_);
    if (detail != nullptr && detail[0] != '\0') msg += std::string(": ") + detail;
    throw RankError(msg, MESHLM_HERE);
  }

  std::unique_ptr<comm::Communicator> host_;
  cudaStream_t compute_ = nullptr;
  std::string name_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::shared_ptr<const Group> group_;
};

}  // namespace

std::unique_ptr<comm::Communicator> make_nccl_communicator(
    std::unique_ptr<comm::Communicator> host, void* compute, const std::string& name,
    std::vector<int> members) {
  return std::make_unique<NcclCommunicator>(std::move(host), compute, name, std::move(members));
}

}  // namespace meshlm::cuda
