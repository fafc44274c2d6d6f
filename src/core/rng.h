// A small portable random number generator. std::mt19937 is portable but
// std::normal_distribution and friends are not (their results differ between
// standard libraries), and meshlm promises the same run bit for bit on any
// machine for the same seed. splitmix64 is tiny, fast, and good enough for
// weight initialisation and data shuffling.
#pragma once

#include <cmath>
#include <cstdint>

namespace meshlm {

class Rng {
public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  // Mixes several values into one seed: Rng(mix_seed(seed, tensor_index)).
  static uint64_t mix_seed(uint64_t a, uint64_t b) {
    Rng r(a ^ (0x9E3779B97F4A7C15ull * (b + 1)));
    return r.next_u64();
  }

  uint64_t next_u64() {
    uint64_t z = (state_ += kGamma);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0: rejects the few low values that would
  // make `x % n` favour small results.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // = 2^64 mod n
    for (;;) {
      const uint64_t x = next_u64();
      if (x >= threshold) return x % n;
    }
  }
  // Standard normal (Box-Muller; one value per call, the pair's twin dropped
  // so that a tensor's values do not depend on how calls are interleaved).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  // Where this generator will be after k more next_u64() calls: uniform()
  // takes one call and normal() two, so element j of a stream of normals is
  // a copy skipped by 2j (and the stream can be filled in parallel).
  void skip(uint64_t k) { state_ += k * kGamma; }

private:
  static constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  uint64_t state_;
};

}  // namespace meshlm
