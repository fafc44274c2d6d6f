// The next token from a row of logits (meshlm generate): greedy, or a draw
// from the model's distribution reshaped by temperature, top-k and top-p,
// with meshlm's own generator (core/rng.h), so the same seed gives the same
// tokens on any machine.
//
//   temperature 0:  the argmax over the real vocabulary [0, V) (the lowest id
//                   among equal maxima); top-k and top-p play no part.
//   otherwise:      p = softmax(logits / temperature) over [0, V), in double;
//                   the ids ordered by p, highest first (equal p: lower id
//                   first); top-k keeps the first k (k = 0: all); top-p then
//                   keeps the shortest prefix whose share of what top-k kept
//                   reaches p (at least one id; p = 1: all); one uniform
//                   number u of the generator picks the id where the kept
//                   ids' cumulative probability first exceeds u times their
//                   sum.
//
// Columns at or beyond V (the padded vocabulary) are never chosen. top-k 1
// is the argmax whatever the temperature.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace meshlm {

struct SamplingOptions {
  double temperature = 1.0;  // >= 0; 0 = greedy
  int top_k = 0;             // >= 0; 0 = no limit
  double top_p = 1.0;        // in (0, 1]
};

// Picks from logits[0, V) (V = logits.size(), the model's real vocabulary).
// Draws one number from `rng` unless greedy (temperature 0). `scratch` keeps
// its buffers between calls.
class Sampler {
public:
  explicit Sampler(const SamplingOptions& o) : o_(o) {}
  uint32_t next(std::span<const float> logits, Rng& rng);

private:
  SamplingOptions o_;
  std::vector<uint32_t> order_;
  std::vector<double> p_;
};

// The lowest id of the largest logit.
uint32_t argmax(std::span<const float> logits);

}  // namespace meshlm
