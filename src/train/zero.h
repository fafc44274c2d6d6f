// ZeRO over the data-parallel group: which flat elements this rank owns and
// updates, where each tensor's gradient goes, how gradients are reduced over
// DP, whether this rank counts an element in the global gradient norm, and
// how updated shards are shared again. Built once per run from (stage, the
// DP group, the rank's model); nothing else asks for the stage.
//
// The rank's flat buffers (parameters, gradients) hold n elements padded to
// np, a multiple of dp under ZeRO 1/2, so that DP rank k owns the shard
// [k S, (k+1) S) with S = np / dp (plan/memory.h, ZeroLayout):
//   stage 0: every rank owns and updates everything; gradients are all-
//            reduced; only DP rank 0 counts them in the norm.
//   stage 1: full gradients accumulate locally and are reduce-scattered;
//            each rank updates its shard; the shards are all-gathered.
//   stage 2: as 1, but gradients are never held whole: each block's go to a
//            bucket that is reduced into the owners' shards as soon as
//            backward finishes the block, and so do the token embedding's,
//            a block of vocabulary rows at a time (GPT::set_wte_grad_blocks:
//            the classifier's after the head, the lookup's at the end of
//            backward); wpe and ln_f are kept until the end of the step, then
//            reduced. Under pp the first stage's owners of wte then add what
//            the last stage's owners reduced (Engine::sum_tied_gradients).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "model/gpt.h"
#include "plan/memory.h"

namespace meshlm {

class Zero {
public:
  // `dp` (the rank's DP group), `model` and `timers` must outlive it. The
  // model must have been built with the padding and own_grads of the stage
  // (plan_rank does); under stage 2 its gradients are redirected here.
  // `wte_rows`: stage 2's block of the token embedding's rows
  // (zero2_wte_rows; 0 where the model trains no wte).
  // `overlap_bytes` > 0 (stages 0 and 1, comm.overlap): the layers'
  // gradients are reduced in buckets of at least that many bytes
  // (grad_buckets) as the backward after arm() finishes them, without
  // waiting; reduce() then reduces the rest and waits for all.
  Zero(int stage, comm::Communicator& dp, GPT& model, const ZeroLayout& layout, int wte_rows,
       SectionTimers& timers, size_t overlap_bytes = 0);

  int stage() const { return stage_; }
  // The flat elements [begin, end) this rank updates.
  size_t own_begin() const { return own_begin_; }
  size_t own_end() const { return own_end_; }
  // Their gradients, after reduce().
  float* owned_grads();

  // Clears the gradients ZeRO keeps itself (stage 2; the model clears its own).
  void zero_grads();
  // Where the gradient of table entry `index` is between backward and
  // reduce(), for a tensor outside the blocks (the tied embedding's sum).
  float* gradient(size_t index);
  // The next backward is the step's last (its micro-batch's gradients
  // complete each layer's): under overlap, its finished buckets are reduced
  // as it goes.
  void arm() { armed_ = !buckets_.empty(); }
  // Collective over DP: the gradients of every rank summed into what each
  // rank owns.
  void reduce();
  // This rank's share of the squared global gradient norm: the owned
  // elements of the tensors `counted` accepts (the tensor-parallel and tied
  // rules are the caller's), or 0 where another DP rank counts them.
  double sum_of_squares(const std::function<bool(const ParamSpec&)>& counted);
  // The smallest spec.index of a tensor of the table that has a NaN or
  // infinite value among the owned gradients, or -1.
  int first_nonfinite() const;
  // Collective over DP after the update: every rank's parameters again whole.
  void share_params();
  // Stage 2: the bucket, free between reduce() and the next zero_grads(),
  // which clears it (a receive buffer for the tied embedding's exchange).
  std::span<float> scratch();

  // Stage 2 under pp: the first stage's owners of the tied embedding add the
  // elements the last stage's owners reduced, piece by piece over `world`
  // (whose ranks are the mesh's). Every rank of the first and the last stage
  // calls it with the same arguments: `first` and `last` are (offset of wte
  // in the stage's flat buffer, ZeRO shard) of each, `n` wte's elements,
  // `piece` the most elements sent at once (at most the first stage's bucket,
  // the same on both stages), `peer(first, dp)` the world rank at this
  // tensor-parallel coordinate. With `host` (a device's gradients, `world`
  // staged through the host) each piece travels through it, which holds
  // `piece` elements or more.
  void sum_tied_between_stages(comm::Communicator& world, std::span<float> host, bool first_stage,
                               std::pair<size_t, size_t> first, std::pair<size_t, size_t> last,
                               size_t n, size_t piece,
                               const std::function<int(bool first, int dp)>& peer);

private:
  // Stage 2: sums the gradients of the flat elements [a, b), held in src,
  // into the shards of their owners.
  void reduce_to_owners(float* src, size_t a, size_t b);
  // Stages 0 and 1 under overlap: starts the reduction of the model's
  // gradients [a, b) (all-reduce under 0, a reduce to each owner's part
  // under 1) without waiting.
  void start_reduction(size_t a, size_t b);
  // Tests the reductions started (which lets MPI progress them) and drops
  // those complete; when none is left in flight, books the time since the
  // first was started as hidden dp communication.
  void poll_started();
  // Books the time since the first reduction in flight was started as
  // hidden, and stops that clock.
  void book_in_flight();

  int stage_;
  comm::Communicator& dp_;
  GPT& model_;
  const ops::Kernels& k_;  // the model's backend: ZeRO's buffers live there too
  ZeroLayout z_;
  SectionTimers& timers_;
  size_t own_begin_ = 0, own_end_ = 0;
  // Stage 2 gradient storage (grads category): the owned shard, the bucket
  // of one block or of wte's rows, wpe and ln_f.
  Buffer shard_grads_, bucket_, edge_grads_;
  std::vector<size_t> edge_offset_;                     // per table entry, into edge_grads_
  std::vector<std::pair<size_t, size_t>> block_range_;  // per local block, flat [a, b)
  // Stages 0 and 1 under overlap: the buckets, the next one to start, whether
  // the running backward starts them, and the reductions started.
  std::vector<GradBucket> buckets_;
  size_t next_bucket_ = 0;
  bool armed_ = false;
  std::vector<comm::Handle> started_;
  double in_flight_since_ = -1;  // when started_ last became non-empty (-1: empty)
};

}  // namespace meshlm
