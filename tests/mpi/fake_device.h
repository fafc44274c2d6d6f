// Host memory that plays a device, for the communicators of device buffers
// without a GPU (tests/mpi/test_staged_comm.cpp, test_ordered_comm.cpp), and
// the values their tests exchange: small integers, exact in every type.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "comm/comm.h"
#include "comm/staged_comm.h"
#include "core/tensor.h"

namespace meshlm::testing {

constexpr int kPoison = -77;

// The element type of the typed tests (float, double, int32_t).
template <typename T>
constexpr DType kType = std::is_same_v<T, float>    ? DType::f32
                        : std::is_same_v<T, double> ? DType::f64
                                                    : DType::i32;

inline int value(int r, size_t i) { return static_cast<int>((r * 5 + i * 7) % 11) - 3; }

inline int reduced(comm::ReduceOp op, int size, size_t i) {
  int acc = value(0, i);
  for (int r = 1; r < size; ++r)
    acc = op == comm::ReduceOp::sum   ? acc + value(r, i)
          : op == comm::ReduceOp::min ? std::min(acc, value(r, i))
                                      : std::max(acc, value(r, i));
  return acc;
}

// Host memory that plays the device: a communicator must reach it only
// through to_host and to_device, which count the bytes that cross.
class FakeDevice : public comm::DeviceAccess {
public:
  explicit FakeDevice(size_t bytes) : mem_(bytes) {}
  bool on_device(const void* p) const override {
    const char* c = static_cast<const char*>(p);
    return c >= mem_.data() && c < mem_.data() + mem_.size();
  }
  void to_host(void* host, const void* device, size_t bytes, comm::Stream) const override {
    EXPECT_TRUE(inside(device, bytes)) << "a copy from outside the device";
    EXPECT_FALSE(on_device(host));
    std::memcpy(host, device, bytes);
    down += bytes;
  }
  void to_device(void* device, const void* host, size_t bytes, comm::Stream) const override {
    EXPECT_TRUE(inside(device, bytes)) << "a copy to outside the device";
    EXPECT_FALSE(on_device(host));
    std::memcpy(device, host, bytes);
    up += bytes;
  }
  template <typename T>
  T* at(size_t byte_offset) {
    return reinterpret_cast<T*>(mem_.data() + byte_offset);
  }
  mutable size_t down = 0, up = 0;

private:
  bool inside(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return on_device(p) && c + bytes <= mem_.data() + mem_.size();
  }
  std::vector<char> mem_;
};

}  // namespace meshlm::testing
