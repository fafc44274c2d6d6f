// NcclCommunicator: see cuda/nccl_comm.h.
#include "cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <utility>

#include "core/error.h"
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

// One operation queued on the communicator's stream: done when its event is.
class NcclHandle final : public comm::HandleImpl {
public:
  explicit NcclHandle(cudaEvent_t done) : done_(done) {}
  ~NcclHandle() override { cudaEventDestroy(done_); }
  void wait() override { CUDA_CHECK(cudaEventSynchronize(done_)); }
  bool test() override {
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
  }

private:
  cudaEvent_t done_;
};

class NcclCommunicator final : public comm::Communicator {
public:
  NcclCommunicator(std::unique_ptr<comm::Communicator> host, void* compute, std::string name)
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
  }
  ~NcclCommunicator() override {
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
    return enqueue("ncclAllReduce", stream, [&] {
      return ncclAllReduce(send, recv, count, reduced_type(type), nccl_op(op), comm_, stream_);
    });
  }

  comm::Handle reduce(const void* send, void* recv, size_t count, DType type, comm::ReduceOp op,
                      int root, comm::Stream stream) override {
    if (!device(send, recv, "reduce")) return host().reduce(send, recv, count, type, op, root);
    return enqueue("ncclReduce", stream, [&] {
      return ncclReduce(send, recv, count, reduced_type(type), nccl_op(op), root, comm_, stream_);
    });
  }

  comm::Handle reduce_scatter(const void* send, void* recv, size_t count, DType type,
                              comm::ReduceOp op, comm::Stream stream) override {
    if (!device(send, recv, "reduce_scatter"))
      return host().reduce_scatter(send, recv, count, type, op);
    return enqueue("ncclReduceScatter", stream, [&] {
      return ncclReduceScatter(send, recv, count, reduced_type(type), nccl_op(op), comm_, stream_);
    });
  }

  comm::Handle all_gather(const void* send, void* recv, size_t count, DType type,
                          comm::Stream stream) override {
    if (!device(send, recv, "all_gather")) return host().all_gather(send, recv, count, type);
    return enqueue("ncclAllGather", stream, [&] {
      return ncclAllGather(send, recv, bytes_of(count, type), ncclUint8, comm_, stream_);
    });
  }

  comm::Handle broadcast(void* buf, size_t count, DType type, int root,
                         comm::Stream stream) override {
    if (!device(buf, nullptr, "broadcast")) return host().broadcast(buf, count, type, root);
    return enqueue("ncclBroadcast", stream, [&] {
      return ncclBroadcast(buf, buf, bytes_of(count, type), ncclUint8, root, comm_, stream_);
    });
  }

  comm::Handle send(const void* buf, size_t count, DType type, int peer,
                    comm::Stream stream) override {
    if (!device(buf, nullptr, "send")) return host().send(buf, count, type, peer);
    return enqueue("ncclSend", stream, [&] {
      return ncclSend(buf, bytes_of(count, type), ncclUint8, peer, comm_, stream_);
    });
  }

  comm::Handle recv(void* buf, size_t count, DType type, int peer, comm::Stream stream) override {
    if (!device(buf, nullptr, "recv")) return host().recv(buf, count, type, peer);
    return enqueue("ncclRecv", stream, [&] {
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
  template <typename F>
  comm::Handle enqueue(const char* op, comm::Stream stream, F&& call) {
    CUDA_CHECK(cudaEventRecord(ready_, stream ? static_cast<cudaStream_t>(stream) : compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    check(call(), op);
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream_));
    return comm::Handle(std::make_unique<NcclHandle>(done));
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
};

}  // namespace

std::unique_ptr<comm::Communicator> make_nccl_communicator(
    std::unique_ptr<comm::Communicator> host, void* compute, const std::string& name) {
  return std::make_unique<NcclCommunicator>(std::move(host), compute, name);
}

}  // namespace meshlm::cuda
