// Host staging (comm.device = host): a Communicator for device buffers that
// moves their bytes through host memory and a host Communicator (MPI). NCCL
// refuses two ranks on one GPU ("Duplicate GPU detected"), so ranks that
// share a GPU, and machines without NCCL, reduce and exchange this way; it
// is how layouts of several ranks are tested on a machine with one GPU.
//
// Which buffers are on the device, and how bytes cross, is the DeviceAccess
// a caller gives (the CUDA backend's copies; tests give host memory that
// plays the device). A buffer that is not on the device goes to the host
// Communicator as it is, so scalars of the host (losses, norms) need no
// second communicator.
//
// Collectives (all_reduce, reduce, reduce_scatter, all_gather, broadcast)
// run in pieces through one staging buffer of at most `staging_bytes` (comm
// category), made at the first staged collective as large as its pieces and
// grown where a later one needs more: each piece copied to the host, reduced
// or moved there, copied back; they are complete when the call returns. Every rank
// of a group cuts the same pieces (they depend on count, type, group size
// and staging_bytes only, which must be the same on every rank). A piece
// holds at least one element of each rank.
//
// Point to point (send, recv) is staged whole, in a host buffer of its own
// made for the message: a pipeline's ranks post a send and a receive before
// waiting for either, and a send cut into pieces that waits for its peer's
// receive of each would wait for a piece the peer posts only after its own
// send. The send copies its message when called; a receive copies it to the
// device when completed. Operations complete in issue order, as comm.h
// promises: completing one completes the staged receives issued before it.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/comm.h"

namespace meshlm::comm {

class DeviceAccess {
public:
  virtual ~DeviceAccess();
  // True when `p` points into device memory.
  virtual bool on_device(const void* p) const = 0;
  // Copies between the device and the host, ordered after the work issued
  // before them on `stream` (nullptr: the default stream): to_host returns
  // with the bytes on the host; to_device once `host` may be reused, the
  // copy ahead of the work issued after it on `stream`.
  virtual void to_host(void* host, const void* device, size_t bytes, Stream stream) const = 0;
  virtual void to_device(void* device, const void* host, size_t bytes, Stream stream) const = 0;
};

// The elements of each rank in one piece of a staged collective over `ranks`
// whose pieces hold `parts` ranks' side by side (1, or the group's size for
// reduce_scatter and all_gather), elements of `element_bytes`, under
// `staging_bytes`: the stage holds min(this, count) * element_bytes * parts
// bytes (the memory prediction's rule too).
size_t staged_piece_elements(size_t element_bytes, int parts, int ranks, size_t staging_bytes);

// `host` moves host buffers (Stream nullptr); `device` must outlive the
// result. staging_bytes > 0. Not collective.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                       const DeviceAccess& device,
                                                       size_t staging_bytes);

}  // namespace meshlm::comm
