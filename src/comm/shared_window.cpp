#include "comm/shared_window.h"

#include <cstring>
#include <exception>
#include <string>

#include "comm/errors.h"

namespace meshlm::comm {

SharedWindow::SharedWindow(MPI_Comm node, size_t bytes) : bytes_(bytes) {
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  owner_ = rank == 0;
  // Pages are placed where they are first touched: the owner writes them all.
  void* mine = nullptr;
  const MPI_Aint size = owner_ ? static_cast<MPI_Aint>(bytes) : 0;
  const int rc = MPI_Win_allocate_shared(size, 1, MPI_INFO_NULL, node, &mine, &win_);
  check_all(node, rc == MPI_SUCCESS,
            "MPI_Win_allocate_shared could not allocate " + std::to_string(bytes) +
                " bytes of node-shared memory",
            MESHLM_HERE);
  MPI_Aint got = 0;
  int disp = 0;
  void* base = nullptr;
  MPI_Win_shared_query(win_, 0, &got, &disp, &base);
  MESHLM_CHECK(static_cast<size_t>(got) == bytes, "the shared window has the wrong size");
  data_ = static_cast<uint8_t*>(base);
  if (owner_) std::memset(data_, 0, bytes);  // first touch; and every byte is defined
}

void SharedWindow::fence() {
  // A fence orders the owner's stores before every rank's later loads.
  MPI_Win_fence(0, win_);
}

SharedWindow::~SharedWindow() {
  // MPI_Win_free is collective over the node. A rank unwinding from its own
  // error is on its way to MPI_Abort (comm/errors.h): waiting here for ranks
  // that will never come would hang the job instead. (Under a CollectiveError
  // every rank skips it alike; MPI_Finalize releases the segment.)
  if (std::uncaught_exceptions() > 0) return;
  MPI_Win_free(&win_);
}

}  // namespace meshlm::comm
