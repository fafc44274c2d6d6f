// The pipeline's sends and receives on a device path whose communicators
// each order their operations on one stream (NCCL, and its emulation
// comm/ordered_comm.h). On one communicator a stage's receive would wait
// behind its send still in flight, and a send to one neighbour behind a
// receive from the other: with every stage doing so, 1F1B hangs. Here each
// pair of neighbouring stages has two communicators of its own, one for the
// activations going down the pipeline and one for the gradients coming
// back, so each carries the messages of one sender to one receiver, in the
// order sent: as MPI matches them.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "comm/comm.h"

namespace meshlm::comm {

// The communicator of one link: over `pair`, a communicator of two ranks
// (the lower stage its rank 0), named `name` in messages. Collective over
// `pair`.
using MakeLink = std::function<std::unique_ptr<Communicator>(MPI_Comm pair,
                                                             const std::string& name)>;

// Collective over `pp` (the stages in rank order). send(peer) and
// recv(peer) of the result go over the link to `peer`, which must be this
// stage's neighbour; operations on one link and direction complete in issue
// order, those on different links independently. Its collectives are
// RankErrors. rank() and size() are pp's. `name` names the group ("the pp
// group of rank 4").
std::unique_ptr<Communicator> make_pipeline_links(MPI_Comm pp, const MakeLink& make_link,
                                                  const std::string& name);

}  // namespace meshlm::comm
