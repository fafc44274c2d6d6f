#include "train/threads.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/log.h"
#include "ops/blas.h"

namespace meshlm {

bool shares_cores(const RankThreads& t) {
  return static_cast<long>(t.threads) * t.sharers > t.cores.count();
}

RankThreads threads_for(int requested, const CpuSet& mine, const std::vector<CpuSet>& host_masks) {
  RankThreads t;
  t.cores = mine;
  t.sharers = 0;
  for (const CpuSet& other : host_masks)
    if (other.overlaps(mine)) ++t.sharers;
  t.sharers = std::max(1, t.sharers);
  t.threads = requested > 0 ? requested : std::max(1, mine.count() / t.sharers);
  return t;
}

RankThreads configure_threads(int requested, const ProcessMesh& mesh) {
  const CpuSet mine = current_cpu_set();
  check_all(mesh.world(), requested <= kMaxThreadsPerCore * std::max(1, mine.count()),
            "runtime.threads = " + std::to_string(requested) + " is more than " +
                std::to_string(kMaxThreadsPerCore) + " per core of the " +
                std::to_string(mine.count()) + " core(s) this rank may run on (" + mine.text() +
                "); 0 = one per core",
            MESHLM_HERE);
  std::unique_ptr<comm::Communicator> host = comm::make_mpi_communicator(mesh.host());
  std::vector<CpuSet> masks(host->size());
  host->all_gather(&mine, masks.data(), sizeof(CpuSet), DType::u8).wait();
  const RankThreads t = threads_for(requested, mine, masks);
  ops::set_threads(t.threads);

  // Rank 0 names every rank whose threads would share its cores.
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_communicator(mesh.world());
  const int cores = mine.count();
  std::vector<int> all(world->size());
  world->all_gather(&cores, all.data(), 1, DType::i32).wait();
  if (requested > 0)
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] < requested)
        log::warn("rank {} may run on {} core(s) but runtime.threads = {}: its threads share "
                  "cores (give it more: srun --cpus-per-task, mpiexec --bind-to none or "
                  "--map-by ...:PE={})",
                  r, all[r], requested, requested);
  return t;
}

}  // namespace meshlm
