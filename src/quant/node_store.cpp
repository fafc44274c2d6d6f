#include "quant/node_store.h"

#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"

namespace meshlm::quant {

std::unique_ptr<NodeStore> NodeStore::shared(MPI_Comm node, size_t bytes) {
  std::unique_ptr<NodeStore> s(new NodeStore);
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  s->bytes_ = bytes;
  s->holder_ = rank == 0;
  // Pages are placed where they are first touched: rank 0 of the node writes
  // them all. The other ranks ask for 0 bytes and map rank 0's segment.
  void* mine = nullptr;
  const MPI_Aint size = s->holder_ ? static_cast<MPI_Aint>(bytes) : 0;
  const int rc = MPI_Win_allocate_shared(size, 1, MPI_INFO_NULL, node, &mine, &s->win_);
  check_all(node, rc == MPI_SUCCESS,
            "MPI_Win_allocate_shared could not allocate " + std::to_string(bytes) +
                " bytes of node-shared memory for the quantized base model",
            MESHLM_HERE);
  MPI_Aint got = 0;
  int disp = 0;
  void* base = nullptr;
  MPI_Win_shared_query(s->win_, 0, &got, &disp, &base);
  MESHLM_CHECK(static_cast<size_t>(got) == bytes, "the shared window has the wrong size");
  s->data_ = static_cast<uint8_t*>(base);
  if (s->holder_) {
    MemTracker::get().on_alloc(MemCategory::quantized, Device::cpu, bytes);
    std::memset(s->data_, 0, bytes);  // first touch; and the padding between tensors is defined
  }
  return s;
}

std::unique_ptr<NodeStore> NodeStore::private_copy(size_t bytes) {
  std::unique_ptr<NodeStore> s(new NodeStore);
  s->private_ = Buffer(bytes, MemCategory::quantized, "quant.base_private");
  s->data_ = s->private_.as<uint8_t>();  // zeroed by Buffer
  s->bytes_ = bytes;
  s->holder_ = true;
  return s;
}

void NodeStore::publish() {
  if (win_ == MPI_WIN_NULL) return;
  // A fence orders the holder's stores before every rank's later loads.
  MPI_Win_fence(0, win_);
}

NodeStore::~NodeStore() {
  if (win_ == MPI_WIN_NULL) return;
  if (holder_) MemTracker::get().on_free(MemCategory::quantized, Device::cpu, bytes_);
  // MPI_Win_free is collective over the node. A rank unwinding from its own
  // error is on its way to MPI_Abort (core/error.h): waiting here for ranks
  // that will never come would hang the job instead. (Under a CollectiveError
  // every rank skips it alike; MPI_Finalize releases the segment.)
  if (std::uncaught_exceptions() > 0) return;
  MPI_Win_free(&win_);
}

}  // namespace meshlm::quant
