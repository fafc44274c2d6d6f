// The bytes of the frozen, quantized base model as a rank sees them.
//
// share = node: ONE copy per node, in an MPI-3 shared-memory window
// (MPI_Win_allocate_shared on the node communicator). Node rank 0 allocates
// all of it; the other ranks allocate nothing and map the same pages
// (MPI_Win_shared_query), so reading a tensor is a pointer into the window:
// no copy on the host. The memory is booked (category quantized) on the rank
// that allocated it.
//
// share = per_rank: every rank holds its own private copy (the naive
// behaviour, kept as the baseline the measurements compare against).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/alloc.h"

namespace meshlm::quant {

class NodeStore {
public:
  // Collective over `node`: a window of `bytes`, allocated by node rank 0.
  static std::unique_ptr<NodeStore> shared(MPI_Comm node, size_t bytes);
  // This rank's own copy.
  static std::unique_ptr<NodeStore> private_copy(size_t bytes);
  // share = node: collective over the node communicator (frees the window),
  // except while an exception unwinds (see node_store.cpp).
  ~NodeStore();
  NodeStore(const NodeStore&) = delete;
  NodeStore& operator=(const NodeStore&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool is_shared() const { return win_ != MPI_WIN_NULL; }
  // True where this rank's memory holds the bytes (the node's rank 0, or
  // every rank for a private copy).
  bool holder() const { return holder_; }
  // Collective over the node: makes the holder's writes visible to every
  // rank of the node (a no-op for a private copy).
  void publish();

private:
  NodeStore() = default;
  MPI_Win win_ = MPI_WIN_NULL;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  bool holder_ = false;
  Buffer private_;
};

}  // namespace meshlm::quant
