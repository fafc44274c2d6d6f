// Memory that every rank of a node maps: an MPI-3 shared-memory window
// (MPI_Win_allocate_shared on the node communicator). Node rank 0 allocates
// all of it, so its pages are placed on its socket and touched by it first;
// the other ranks allocate nothing and map the same pages
// (MPI_Win_shared_query). Reading the memory is a plain pointer access on
// every rank of the node: no copy on the host.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

namespace meshlm::comm {

class SharedWindow {
public:
  // Collective over `node`: a window of `bytes`, allocated and zeroed by node
  // rank 0. A failed allocation is a CollectiveError on every rank of `node`.
  SharedWindow(MPI_Comm node, size_t bytes);
  // Collective over the node (MPI_Win_free), except while an exception
  // unwinds this rank: see shared_window.cpp.
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool owner() const { return owner_; }  // node rank 0: the pages are in its memory
  // Collective over the node: the owner's writes become visible to every
  // rank's later reads (a fence).
  void fence();

private:
  MPI_Win win_ = MPI_WIN_NULL;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;
};

}  // namespace meshlm::comm
