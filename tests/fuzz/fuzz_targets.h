// The fuzz targets as functions (tests/fuzz/fuzz_*.cpp), for the programs
// that run them without libFuzzer: the regression test
// (tests/unit/test_fuzz_regressions.cpp) and the seed writer
// (tests/fuzz/make_fuzz_seeds.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/quant_cache.h"

namespace meshlm::fuzz {

void fuzz_parameter_file(const uint8_t* data, size_t size);
void fuzz_safetensors(const uint8_t* data, size_t size);
void fuzz_tokens(const uint8_t* data, size_t size);
void fuzz_quant_cache(const uint8_t* data, size_t size);

// The model and key fuzz_quant_cache asks the cache for: an nf4 tensor, an
// int8 tensor and an empty one, in a store of kQuantCacheStoreBytes.
inline constexpr size_t kQuantCacheStoreBytes = 128;
std::vector<io::CacheTensor> quant_cache_layout();
io::CacheKey quant_cache_key();

}  // namespace meshlm::fuzz
