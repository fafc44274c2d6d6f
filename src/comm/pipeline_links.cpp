// PipelineLinks: see comm/pipeline_links.h.
#include "comm/pipeline_links.h"

#include <utility>

#include "core/error.h"

namespace meshlm::comm {

namespace {

// A split of the PP group into pairs of neighbours: stages (first, first + 1)
// for first = offset, offset + 2, ...; MPI_COMM_NULL on a stage in none.
MPI_Comm split_pairs(MPI_Comm pp, int stage, int stages, int offset) {
  const int first = stage - ((stage - offset) % 2 + 2) % 2;  // the pair's lower stage
  const bool paired = first >= offset && first + 1 < stages;
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(pp, paired ? first : MPI_UNDEFINED, stage, &pair);
  return pair;
}

class PipelineLinks final : public Communicator {
public:
  PipelineLinks(MPI_Comm pp, const MakeLink& make_link, std::string name) : name_(std::move(name)) {
    MPI_Comm_rank(pp, &stage_);
    MPI_Comm_size(pp, &stages_);
    // Pairs (0, 1), (2, 3), ... first, then (1, 2), (3, 4), ...: the two
    // stages of a link make it at the same point of their sequence.
    for (int offset = 0; offset < 2; ++offset) {
      MPI_Comm pair = split_pairs(pp, stage_, stages_, offset);
      if (pair == MPI_COMM_NULL) continue;
      int me = 0;
      MPI_Comm_rank(pair, &me);
      Link& link = me == 0 ? next_ : prev_;
      link.pair = pair;
      const int lower = me == 0 ? stage_ : stage_ - 1;
      const std::string stages =
          "the pp link of stages " + std::to_string(lower) + " and " + std::to_string(lower + 1);
      link.down = make_link(pair, stages + " (activations, down)");
      link.up = make_link(pair, stages + " (gradients, up)");
    }
  }
  ~PipelineLinks() override {
    for (Link* l : {&prev_, &next_}) {
      l->down.reset();
      l->up.reset();
      if (l->pair != MPI_COMM_NULL) MPI_Comm_free(&l->pair);
    }
  }
  PipelineLinks(const PipelineLinks&) = delete;
  PipelineLinks& operator=(const PipelineLinks&) = delete;

  int rank() const override { return stage_; }
  int size() const override { return stages_; }
  const char* backend() const override {
    const Link& l = next_.down ? next_ : prev_;
    return l.down ? l.down->backend() : "pipeline links";
  }

  // Down the pipeline goes to the next stage (rank 1 of the link), back up
  // to the previous one (rank 0).
  Handle send(const void* buf, size_t count, DType type, int peer, Stream stream) override {
    if (peer == stage_ + 1 && next_.down) return next_.down->send(buf, count, type, 1, stream);
    if (peer == stage_ - 1 && prev_.up) return prev_.up->send(buf, count, type, 0, stream);
    throw not_a_neighbour("send", peer);
  }
  Handle recv(void* buf, size_t count, DType type, int peer, Stream stream) override {
    if (peer == stage_ - 1 && prev_.down) return prev_.down->recv(buf, count, type, 0, stream);
    if (peer == stage_ + 1 && next_.up) return next_.up->recv(buf, count, type, 1, stream);
    throw not_a_neighbour("recv", peer);
  }

  Handle all_reduce(const void*, void*, size_t, DType, ReduceOp, Stream) override {
    throw collective("all_reduce");
  }
  Handle reduce(const void*, void*, size_t, DType, ReduceOp, int, Stream) override {
    throw collective("reduce");
  }
  Handle reduce_scatter(const void*, void*, size_t, DType, ReduceOp, Stream) override {
    throw collective("reduce_scatter");
  }
  Handle all_gather(const void*, void*, size_t, DType, Stream) override {
    throw collective("all_gather");
  }
  Handle broadcast(void*, size_t, DType, int, Stream) override { throw collective("broadcast"); }
  void barrier() override { throw collective("barrier"); }

private:
  struct Link {
    MPI_Comm pair = MPI_COMM_NULL;
    std::unique_ptr<Communicator> down, up;
  };

  RankError not_a_neighbour(const char* what, int peer) const {
    return RankError(std::string(what) + " on " + name_ + ": stage " + std::to_string(peer) +
                         " is not a neighbour of stage " + std::to_string(stage_) + " of " +
                         std::to_string(stages_),
                     MESHLM_HERE);
  }
  RankError collective(const char* what) const {
    return RankError(std::string(what) + " on " + name_ +
                         ": the pipeline's links carry sends and receives only",
                     MESHLM_HERE);
  }

  std::string name_;
  int stage_ = 0, stages_ = 1;
  Link prev_, next_;
};

}  // namespace

std::unique_ptr<Communicator> make_pipeline_links(MPI_Comm pp, const MakeLink& make_link,
                                                  const std::string& name) {
  return std::make_unique<PipelineLinks>(pp, make_link, name);
}

}  // namespace meshlm::comm
