#include "core/checked.h"

namespace meshlm {

namespace {
std::string factors_text(std::initializer_list<SizeFactor> factors) {
  std::string s;
  for (const SizeFactor& f : factors)
    s += (s.empty() ? "" : " x ") + std::string(f.key) + " (" + std::to_string(f.value) + ")";
  return s;
}
}  // namespace

uint64_t checked_product(const std::string& what, std::initializer_list<SizeFactor> factors) {
  uint64_t p = 1;
  for (const SizeFactor& f : factors)
    if (__builtin_mul_overflow(p, f.value, &p))
      throw CollectiveError(what + ": " + factors_text(factors) +
                                " does not fit in 64 bits; lower one of these keys",
                            MESHLM_HERE);
  return p;
}

uint64_t checked_sum(const std::string& what, uint64_t a, uint64_t b) {
  uint64_t s = 0;
  if (__builtin_add_overflow(a, b, &s))
    throw CollectiveError(what + " does not fit in 64 bits", MESHLM_HERE);
  return s;
}

}  // namespace meshlm
