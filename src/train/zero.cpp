#include "train/zero.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "comm/mpi_comm.h"
#include "core/error.h"

namespace meshlm {

namespace {

// The flat range [a, b) of each block of `table`, from its first layer on.
std::vector<std::pair<size_t, size_t>> block_ranges(const std::vector<ParamSpec>& table) {
  std::vector<std::pair<size_t, size_t>> ranges;
  int layer0 = INT_MAX;
  for (const ParamSpec& p : table)
    if (p.layer >= 0) layer0 = std::min(layer0, p.layer);
  for (const ParamSpec& p : table) {
    if (p.layer < 0) continue;
    const size_t l = p.layer - layer0;
    if (ranges.size() <= l) ranges.resize(l + 1, {p.offset, p.offset});
    ranges[l].second = p.offset + p.numel();
  }
  return ranges;
}

// Calls part(k, lo, hi) for each DP rank k whose shard [k S, (k+1) S) meets
// the flat range [a, b), with the common part [lo, hi).
template <typename F>
void for_each_owner_part(size_t a, size_t b, size_t S, int dp, F part) {
  for (int k = 0; k < dp; ++k) {
    const size_t lo = std::max(a, k * S), hi = std::min(b, (k + 1) * S);
    if (lo < hi) part(k, lo, hi);
  }
}

// Calls block(r0, n, a, b) for each block of `rows` rows of the tied token
// embedding `p` (rows [r0, r0 + n), flat range [a, b)).
template <typename F>
void for_each_wte_block(const ParamSpec& p, int rows, F block) {
  const int64_t V = p.shape[0];
  const size_t C = static_cast<size_t>(p.shape[1]);
  for (int64_t r0 = 0; r0 < V; r0 += rows) {
    const int64_t n = std::min<int64_t>(rows, V - r0);
    block(static_cast<int>(r0), static_cast<int>(n), p.offset + r0 * C, p.offset + (r0 + n) * C);
  }
}

}  // namespace

size_t Zero::ring_scratch_bytes(int stage, const std::vector<ParamSpec>& table,
                                const ZeroLayout& z, int dp, int dp_rank, int wte_rows) {
  using comm::Reduction;
  if (stage == 0) return comm::ring_scratch_bytes_of(Reduction::all_reduce, z.n, DType::f32, dp);
  if (stage == 1)
    return comm::ring_scratch_bytes_of(Reduction::reduce_scatter, z.shard, DType::f32, dp);
  size_t most = 0;
  auto reduce = [&](int owner, size_t lo, size_t hi) {
    most = std::max(most, comm::ring_scratch_bytes_of(Reduction::reduce, hi - lo, DType::f32, dp,
                                                      dp_rank, owner));
  };
  for (const auto& [a, b] : block_ranges(table)) for_each_owner_part(a, b, z.shard, dp, reduce);
  for (const ParamSpec& p : table) {
    if (p.layer >= 0) continue;
    if (p.tied == TiedGroup::embedding)
      for_each_wte_block(p, wte_rows, [&](int, int, size_t a, size_t b) {
        for_each_owner_part(a, b, z.shard, dp, reduce);
      });
    else
      for_each_owner_part(p.offset, p.offset + p.numel(), z.shard, dp, reduce);
  }
  return most;
}

Zero::Zero(int stage, comm::Communicator& dp, GPT& model, const ZeroLayout& layout, int wte_rows,
           SectionTimers& timers)
    : stage_(stage), dp_(dp), model_(model), k_(model.kernels()), z_(layout), timers_(timers) {
  MESHLM_CHECK(stage >= 0 && stage <= 2, "ZeRO stage must be 0, 1 or 2");
  MESHLM_CHECK(model.padded_params() == z_.padded &&
                   (stage == 0 || z_.shard * dp.size() == z_.padded),
               "the model's flat buffer is not padded for the ZeRO shards");
  MESHLM_CHECK(model.options().own_grads == (stage < 2),
               "the model's gradients do not match the ZeRO stage");
  if (stage_ == 0) {
    own_begin_ = 0;
    own_end_ = z_.n;
  } else {
    own_begin_ = static_cast<size_t>(dp.rank()) * z_.shard;
    own_end_ = own_begin_ + z_.shard;
  }
  if (stage_ < 2) return;

  const std::vector<ParamSpec>& table = model_.table();
  const int layer0 = model_.shard().layer_begin;
  const Device dev = k_.device();
  shard_grads_ = Buffer(z_.shard * sizeof(float), MemCategory::grads, "zero2.shard_grads", dev);
  const ParamSpec* wte = find_role(table, ParamRole::token_embedding);
  MESHLM_CHECK(wte == nullptr || wte_rows > 0, "ZeRO 2 needs the rows of wte's gradient blocks");
  bucket_ = Buffer(zero2_bucket_numel(table, wte_rows) * sizeof(float), MemCategory::grads,
                   "zero2.bucket", dev);
  edge_grads_ =
      Buffer(edge_numel(table) * sizeof(float), MemCategory::grads, "zero2.edge_grads", dev);
  edge_offset_.assign(table.size(), 0);
  size_t e = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].layer >= 0 || table[i].tied == TiedGroup::embedding) continue;
    edge_offset_[i] = e;
    e += table[i].numel();
  }
  block_range_ = block_ranges(table);
  model_.set_grad_target(
      [this, layer0](size_t i) {
        const ParamSpec& p = model_.table()[i];
        if (p.layer < 0) return edge_grads_.as<float>() + edge_offset_[i];
        const auto& r = block_range_[p.layer - layer0];
        return bucket_.as<float>() + (p.offset - r.first);
      },
      [this, layer0](int layer) {
        const auto& r = block_range_[layer - layer0];
        reduce_to_owners(bucket_.as<float>(), r.first, r.second);
        k_.zero(bucket_.as<float>(), r.second - r.first);
      });
  if (wte) {
    const size_t C = static_cast<size_t>(wte->shape[1]), offset = wte->offset;
    model_.set_wte_grad_blocks(bucket_.as<float>(), wte_rows, [this, C, offset](int r0, int n) {
      reduce_to_owners(bucket_.as<float>(), offset + r0 * C, offset + (r0 + n) * C);
      k_.zero(bucket_.as<float>(), n * C);  // the blocks accumulate into a zero bucket
    });
  }
}

float* Zero::owned_grads() {
  return stage_ == 2 ? shard_grads_.as<float>() : model_.grads() + own_begin_;
}

void Zero::zero_grads() {
  if (stage_ < 2) return;
  k_.zero(shard_grads_.as<float>(), shard_grads_.bytes() / sizeof(float));
  k_.zero(edge_grads_.as<float>(), edge_grads_.bytes() / sizeof(float));
  k_.zero(bucket_.as<float>(), bucket_.bytes() / sizeof(float));  // lent as scratch() since
}

float* Zero::gradient(size_t index) {
  const ParamSpec& p = model_.table().at(index);
  MESHLM_CHECK(stage_ < 2 || (p.layer < 0 && p.tied != TiedGroup::embedding),
               "under ZeRO 2 the blocks' and wte's gradients are not kept");
  return stage_ == 2 ? edge_grads_.as<float>() + edge_offset_[index] : model_.grads() + p.offset;
}

void Zero::reduce_to_owners(float* src, size_t a, size_t b) {
  ScopedTimer t(timers_, Section::dp_comm);
  const size_t S = z_.shard;
  const int me = dp_.rank();
  for_each_owner_part(a, b, S, dp_.size(), [&](int k, size_t lo, size_t hi) {
    float* part = src + (lo - a);
    float* owned = shard_grads_.as<float>() + (lo - k * S);
    // The owner adds what it accumulated so far to its own contribution, so
    // the reduction lands straight in the shard. Alone in the group, that
    // sum is the whole reduction.
    if (dp_.size() == 1) {
      k_.add(owned, part, hi - lo);
      return;
    }
    if (me == k) k_.add(part, owned, hi - lo);
    dp_.reduce(part, owned, hi - lo, DType::f32, comm::ReduceOp::sum, k).wait();
  });
}

void Zero::reduce() {
  ScopedTimer t(timers_, Section::dp_comm);
  float* g = model_.grads();
  switch (stage_) {
    case 0:
      if (dp_.size() > 1) dp_.all_reduce(g, g, z_.n, DType::f32, comm::ReduceOp::sum).wait();
      break;
    case 1:
      if (dp_.size() == 1) break;  // the shard is everything
      dp_.reduce_scatter(g, g + own_begin_, z_.shard, DType::f32, comm::ReduceOp::sum).wait();
      break;
    case 2: {
      const std::vector<ParamSpec>& table = model_.table();
      for (size_t i = 0; i < table.size(); ++i)
        if (table[i].layer < 0 && table[i].tied != TiedGroup::embedding)
          reduce_to_owners(edge_grads_.as<float>() + edge_offset_[i], table[i].offset,
                           table[i].offset + table[i].numel());
      break;
    }
  }
}

double Zero::sum_of_squares(const std::function<bool(const ParamSpec&)>& counted) {
  // Under stage 0 every DP rank holds all the (reduced) gradients: DP rank 0
  // counts them.
  if (stage_ == 0 && dp_.rank() != 0) return 0.0;
  const float* g = owned_grads();
  std::vector<ops::Kernels::Span> spans;
  for (const ParamSpec& p : model_.table()) {
    const size_t lo = std::max(p.offset, own_begin_);
    const size_t hi = std::min(p.offset + p.numel(), own_end_);
    if (lo >= hi || !counted(p)) continue;
    spans.emplace_back(g + (lo - own_begin_), hi - lo);
  }
  // Tensor by tensor (the sums' order fixed by the table), one wait for all.
  std::vector<double> sums(spans.size());
  k_.sums_of_squares(spans, sums.data());
  double local = 0;
  for (const double s : sums) local += s;
  return local;
}

int Zero::first_nonfinite() const {
  const float* g = const_cast<Zero*>(this)->owned_grads();
  for (const ParamSpec& p : model_.table()) {
    const size_t lo = std::max(p.offset, own_begin_);
    const size_t hi = std::min(p.offset + p.numel(), own_end_);
    // A sum of float squares in double overflows only if an element is not
    // finite (and NaN stays NaN).
    if (lo < hi && !std::isfinite(k_.sum_of_squares(g + (lo - own_begin_), hi - lo)))
      return p.index;
  }
  return -1;
}

void Zero::share_params() {
  if (stage_ == 0 || dp_.size() == 1) return;
  ScopedTimer t(timers_, Section::dp_comm);
  float* p = model_.params();
  dp_.all_gather(p + own_begin_, p, z_.shard, DType::f32).wait();
}

std::span<float> Zero::scratch() {
  MESHLM_CHECK(stage_ == 2, "only ZeRO 2 has a bucket to lend");
  return {bucket_.as<float>(), bucket_.bytes() / sizeof(float)};
}

void Zero::sum_tied_between_stages(comm::Communicator& world, bool first_stage,
                                   std::pair<size_t, size_t> first, std::pair<size_t, size_t> last,
                                   size_t n, size_t piece,
                                   const std::function<int(bool, int)>& peer) {
  ScopedTimer t(timers_, Section::pp_comm);
  const int dp = dp_.size(), me = dp_.rank();
  const std::span<float> buf = scratch();
  MESHLM_CHECK(piece > 0 && piece <= buf.size(), "the tied embedding's pieces exceed ZeRO's bucket");
  // The elements [lo, hi) of wte that DP rank k owns on a stage whose flat
  // buffer holds wte at `offset`, sharded by S.
  auto owned = [n](std::pair<size_t, size_t> stage, int k) {
    const auto [offset, S] = stage;
    const size_t a = k * S, b = a + S;
    const size_t lo = std::clamp(a, offset, offset + n) - offset;
    const size_t hi = std::clamp(b, offset, offset + n) - offset;
    return std::pair{lo, hi};
  };
  // Every rank walks the same pieces in the same order, each a matched send
  // and receive, so none waits on a piece its partner has not reached.
  for (int k1 = 0; k1 < dp; ++k1) {
    const auto [a1, b1] = owned(first, k1);
    for (int k2 = 0; k2 < dp; ++k2) {
      const auto [a2, b2] = owned(last, k2);
      const size_t lo = std::max(a1, a2), hi = std::min(b1, b2);
      for (size_t p = lo; p < hi; p += piece) {
        const size_t count = std::min(piece, hi - p);
        if (!first_stage && me == k2) {
          const float* src = owned_grads() + (last.first + p - k2 * last.second);
          world.send(src, count, DType::f32, peer(true, k1)).wait();
        } else if (first_stage && me == k1) {
          world.recv(buf.data(), count, DType::f32, peer(false, k2)).wait();
          k_.add(owned_grads() + (first.first + p - k1 * first.second), buf.data(), count);
        }
      }
    }
  }
}

}  // namespace meshlm
