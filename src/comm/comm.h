// Collectives over one group of ranks (a DP, TP or PP group, or the world),
// behind one interface so that the training code does not know what moves
// the bytes. MPI moves host buffers (comm/mpi_comm.h), and device buffers
// through host staging (comm/staged_comm.h: comm.device = host) or NCCL
// (cuda/nccl_comm.h: comm.device = nccl), which take this interface.
//
// Every operation is asynchronous and returns a Handle; the buffers must stay
// valid and untouched until it completes. Operations on one Communicator
// complete in issue order (on its stream, for a device backend): waiting for
// one operation also completes every operation issued before it on the same
// Communicator, as a CUDA stream would. Counts are elements of `type`, the
// same on every rank of a collective. A Communicator is used by one thread.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "core/enum_names.h"
#include "core/tensor.h"

namespace meshlm::comm {

enum class ReduceOp { sum, min, max };

// cudaStream_t for a device backend; nullptr for host buffers.
using Stream = void*;

// What a backend keeps for one pending operation.
struct HandleImpl {
  virtual ~HandleImpl();
  virtual void wait() = 0;  // blocks until complete
  virtual bool test() = 0;  // true when complete; never blocks
};

// Completion of one asynchronous operation. Move-only. A default-constructed
// Handle is complete. wait() blocks until the buffers may be reused and may be
// called again. Destroying a pending Handle waits for it, so an MPI request is
// never leaked and a buffer is never freed under a running operation;
// `comm.all_reduce(...).wait()` is therefore the blocking form.
class [[nodiscard]] Handle {
public:
  Handle();
  explicit Handle(std::unique_ptr<HandleImpl> impl);
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other);  // waits for the operation it replaces
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  // A destructor cannot throw: a failed wait here aborts the job (fatal_one).
  ~Handle();

  void wait();
  bool test();  // true when complete; never blocks

private:
  std::unique_ptr<HandleImpl> impl_;  // null once complete
};

class Communicator {
public:
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "mpi"

  // Collective: every rank of the group calls it. recv = op over the ranks of
  // send, `count` elements. In place when send == recv.
  virtual Handle all_reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                            Stream stream = nullptr) = 0;

  // Collective: every rank of the group calls it. recv = op over the ranks of
  // send, significant at `root` only (other ranks' recv is not touched). In
  // place on the root when send == recv.
  virtual Handle reduce(const void* send, void* recv, size_t count, DType type, ReduceOp op,
                        int root, Stream stream = nullptr) = 0;

  // Collective: every rank of the group calls it. send holds size()*count
  // elements; rank r receives chunk r reduced over the ranks, `count`
  // elements. In place when recv == (char*)send + rank()*count*dtype_size
  // (NCCL's convention); the other chunks of send are then undefined.
  virtual Handle reduce_scatter(const void* send, void* recv, size_t count, DType type,
                                ReduceOp op, Stream stream = nullptr) = 0;

  // Collective: every rank of the group calls it. recv gets size()*count
  // elements, chunk r from rank r. In place when
  // send == (char*)recv + rank()*count*dtype_size.
  virtual Handle all_gather(const void* send, void* recv, size_t count, DType type,
                            Stream stream = nullptr) = 0;

  // Collective: every rank of the group calls it. buf of `root` to all. Any
  // count: a backend whose calls take int counts splits a large broadcast
  // into pieces itself.
  virtual Handle broadcast(void* buf, size_t count, DType type, int root,
                           Stream stream = nullptr) = 0;

  // Point to point within the group (peer is a rank of this group). Messages
  // between two ranks arrive in the order sent; the receiver's count equals
  // the sender's. A rank that sends and receives in one step (a ring, a
  // pipeline exchange) posts both before waiting for either.
  virtual Handle send(const void* buf, size_t count, DType type, int peer,
                      Stream stream = nullptr) = 0;
  virtual Handle recv(void* buf, size_t count, DType type, int peer,
                      Stream stream = nullptr) = 0;

  // Collective: every rank of the group calls it. Blocking.
  virtual void barrier() = 0;
};

// Collective: `s` of rank `root` on every rank of `c` (its length first).
std::string broadcast_string(Communicator& c, std::string s, int root = 0);

// How a rank waits for its messages on the MPI backend (comm.wait). Open
// MPI's MPI_Wait polls: a rank waiting for its pipeline neighbour keeps its
// core busy. Where a node's ranks share cores (more ranks x threads than the
// cores of their affinity masks), that core is taken from a rank with work
// to do, by an amount the scheduler decides anew each time. `sleep` gives
// it away (comm/mpi_comm.h). `automatic` is resolved by the run
// (train/trainer.cpp: sleep where the node's ranks share cores, poll
// otherwise); the Communicators take poll or sleep.
enum class WaitPolicy { automatic, poll, sleep };
inline constexpr EnumName<WaitPolicy> kWaitPolicyNames[] = {
    {WaitPolicy::automatic, "auto"},
    {WaitPolicy::poll, "poll"},
    {WaitPolicy::sleep, "sleep"},
};
constexpr std::span<const EnumName<WaitPolicy>> enum_names(WaitPolicy) { return kWaitPolicyNames; }

}  // namespace meshlm::comm
