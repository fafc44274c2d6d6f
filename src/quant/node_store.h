// The bytes of the frozen, quantized base model as a rank sees them.
//
// share = node: ONE copy per node, in a node-shared window
// (comm/shared_window.h): node rank 0 holds all of it, the other ranks map
// the same pages, so reading a tensor is a pointer into the window. The
// memory is booked (category quantized) on the rank that holds it.
//
// share = per_rank: every rank holds its own private copy (the naive
// behaviour, kept as the baseline the measurements compare against).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/shared_window.h"
#include "core/alloc.h"

namespace meshlm::quant {

class NodeStore {
public:
  // Collective over `node`: a window of `bytes`, allocated by node rank 0.
  static std::unique_ptr<NodeStore> shared(MPI_Comm node, size_t bytes);
  // This rank's own copy.
  static std::unique_ptr<NodeStore> private_copy(size_t bytes);
  // share = node: collective over the node communicator (frees the window),
  // except while an exception unwinds (see comm/shared_window.cpp).
  ~NodeStore();
  NodeStore(const NodeStore&) = delete;
  NodeStore& operator=(const NodeStore&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool is_shared() const { return window_ != nullptr; }
  // True where this rank's memory holds the bytes (the node's rank 0, or
  // every rank for a private copy).
  bool holder() const { return holder_; }
  // Collective over the node: makes the holder's writes visible to every
  // rank of the node (a no-op for a private copy).
  void publish();

private:
  NodeStore() = default;
  std::unique_ptr<comm::SharedWindow> window_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  bool holder_ = false;
  Buffer private_;
};

}  // namespace meshlm::quant
