// Size arithmetic that cannot wrap: products and sums of element and byte
// counts derived from configuration keys, in 64-bit unsigned integers with
// overflow detected. An overflow is a CollectiveError naming the keys whose
// values went into it (every rank computes the same from the same keys).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace meshlm {

// One factor: its value and the key (or expression of keys) it comes from.
struct SizeFactor {
  uint64_t value;
  const char* key;
};

// The product of the factors; throws CollectiveError "<what>: a x b x ...
// overflows 64 bits" naming each factor's key and value.
uint64_t checked_product(const std::string& what, std::initializer_list<SizeFactor> factors);
// a + b, or the same error for `what`.
uint64_t checked_sum(const std::string& what, uint64_t a, uint64_t b);

}  // namespace meshlm
