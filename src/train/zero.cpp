#include "train/zero.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace meshlm {

Zero::Zero(int stage, comm::Communicator& dp, GPT& model, const ZeroLayout& layout, int wte_rows,
           SectionTimers& timers, size_t overlap_bytes)
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
  if (stage_ < 2) {
    if (overlap_bytes == 0 || dp.size() == 1) return;
    buckets_ = grad_buckets(model_.table(), overlap_bytes);
    model_.on_block_done([this, layer0 = model_.shard().layer_begin](int layer) {
      if (!armed_) return;
      poll_started();
      while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].layer == layer - layer0) {
        const GradBucket& b = buckets_[next_bucket_++];
        start_reduction(b.begin, b.end);
      }
    });
    return;
  }

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

void Zero::poll_started() {
  if (started_.empty()) return;
  {
    ScopedTimer t(timers_, Section::dp_comm);
    std::erase_if(started_, [](comm::Handle& h) { return h.test(); });
  }
  if (started_.empty()) book_in_flight();
}

void Zero::book_in_flight() {
  if (in_flight_since_ < 0) return;
  timers_.add_hidden(Section::dp_comm, now_seconds() - in_flight_since_);
  in_flight_since_ = -1;
}

void Zero::start_reduction(size_t a, size_t b) {
  if (a >= b) return;
  ScopedTimer t(timers_, Section::dp_comm);
  if (in_flight_since_ < 0) in_flight_since_ = now_seconds();
  float* g = model_.grads();
  if (stage_ == 0) {
    started_.push_back(dp_.all_reduce(g + a, g + a, b - a, DType::f32, comm::ReduceOp::sum));
    return;
  }
  for_each_owner_part(a, b, z_.shard, dp_.size(), [&](int k, size_t lo, size_t hi) {
    started_.push_back(dp_.reduce(g + lo, g + lo, hi - lo, DType::f32, comm::ReduceOp::sum, k));
  });
}

void Zero::reduce() {
  if (armed_) {
    // The buckets the backward started, then the tensors outside the layers.
    MESHLM_CHECK(next_bucket_ == buckets_.size(), "the backward finished every bucket's layers");
    start_reduction(0, buckets_.back().begin);
    start_reduction(buckets_.front().end, z_.n);
    // What is still in flight was hidden until now; the wait is exposed.
    book_in_flight();
    ScopedTimer t(timers_, Section::dp_comm);
    for (comm::Handle& h : started_) h.wait();
    started_.clear();
    next_bucket_ = 0;
    armed_ = false;
    return;
  }
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

void Zero::sum_tied_between_stages(comm::Communicator& world, std::span<float> host,
                                   bool first_stage,
                                   std::pair<size_t, size_t> first, std::pair<size_t, size_t> last,
                                   size_t n, size_t piece,
                                   const std::function<int(bool, int)>& peer) {
  ScopedTimer t(timers_, Section::pp_comm);
  const int dp = dp_.size(), me = dp_.rank();
  const std::span<float> buf = scratch();
  MESHLM_CHECK(piece > 0 && piece <= buf.size() && (host.empty() || piece <= host.size()),
               "the tied embedding's pieces exceed ZeRO's bucket or the host's buffer");
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
          if (!host.empty()) {
            k_.download(host.data(), src, count * sizeof(float));
            src = host.data();
          }
          world.send(src, count, DType::f32, peer(true, k1)).wait();
        } else if (first_stage && me == k1) {
          float* dst = host.empty() ? buf.data() : host.data();
          world.recv(dst, count, DType::f32, peer(false, k2)).wait();
          if (!host.empty()) k_.upload(buf.data(), dst, count * sizeof(float));
          k_.add(owned_grads() + (first.first + p - k1 * first.second), buf.data(), count);
        }
      }
    }
  }
}

}  // namespace meshlm
