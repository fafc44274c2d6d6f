// core/: shapes and tensor views, the tracked allocator, process memory,
// kept results.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/kept.h"
#include "core/tensor.h"
#include "model/gpt.h"

using namespace meshlm;

TEST(Shape, NumelEqualityAndText) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim, 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "(2, 3, 4)");
  EXPECT_EQ(s, (Shape{2, 3, 4}));
  EXPECT_FALSE(s == (Shape{2, 12}));
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar
  EXPECT_THROW((Shape{1, 2, 3, 4, 5}), RankError);
}

TEST(TensorView, BytesAndDtypes) {
  float x[6] = {};
  TensorView t{x, {2, 3}, DType::f32, Device::cpu};
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.bytes(), 24u);
  EXPECT_EQ(t.as<float>(), x);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_STREQ(dtype_name(DType::u16), "u16");
  EXPECT_EQ(dtype_size(DType::i8), 1u);
  EXPECT_STREQ(dtype_name(DType::i8), "i8");
  EXPECT_STREQ(device_name(Device::cuda), "cuda");
}

TEST(TensorView, ParameterTableCutsTheFlatBuffer) {
  const GPTConfig c{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 10, .max_seq_len = 4};
  GPT m(c);
  const ParamSpec& p = m.spec("h.0.mlp.c_fc.weight");
  const TensorView t = p.in(m.params());
  EXPECT_EQ(t.shape, (Shape{32, 8}));
  EXPECT_EQ(t.as<float>(), m.params() + p.offset);
  EXPECT_EQ(m.param("h.0.mlp.c_fc.weight").data(), t.as<float>());
  EXPECT_THROW(m.spec("h.9.nothing"), RankError);
}

TEST(MemTracker, CurrentAndPeakPerCategory) {
  MemTracker& t = MemTracker::get();
  const size_t ws0 = t.current(MemCategory::workspace);
  const size_t comm0 = t.current(MemCategory::comm);
  t.reset_peaks();
  {
    Buffer a(1000, MemCategory::workspace, "a");
    Buffer b(500, MemCategory::workspace, "b");
    EXPECT_EQ(t.current(MemCategory::workspace), ws0 + 1500);
    {
      Buffer c(4096, MemCategory::comm, "c");
      EXPECT_EQ(t.current(MemCategory::comm), comm0 + 4096);
    }
    EXPECT_EQ(t.current(MemCategory::comm), comm0);
    EXPECT_EQ(t.peak(MemCategory::comm), comm0 + 4096);
    // Moves hand the bytes over without counting them twice.
    Buffer moved = std::move(a);
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(t.current(MemCategory::workspace), ws0 + 1500);
    moved = Buffer();  // frees
    EXPECT_EQ(t.current(MemCategory::workspace), ws0 + 500);
  }
  EXPECT_EQ(t.current(MemCategory::workspace), ws0);
  EXPECT_EQ(t.peak(MemCategory::workspace), ws0 + 1500);
  t.reset_peaks();
  EXPECT_EQ(t.peak(MemCategory::workspace), ws0);
}

TEST(Buffer, ZeroedAlignedAndLabelled) {
  Buffer b(100, MemCategory::other, "label");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0);
  EXPECT_EQ(b.label(), "label");
  EXPECT_EQ(b.category(), MemCategory::other);
  EXPECT_THROW(Buffer(8, MemCategory::other, "gpu", Device::cuda), RankError);
}

TEST(ProcessMemory, ReadsProc) {
  const ProcessMemory m = read_process_memory();
  EXPECT_GT(m.rss, 0u);
  EXPECT_GE(m.rss_peak, m.rss);
}

namespace {

// A DeviceMemory backed by host memory, recording its calls: what Buffer asks
// of the CUDA backend's allocator, checked without a GPU.
class FakeDeviceMemory final : public DeviceMemory {
public:
  void* allocate(size_t bytes, const std::string& label) override {
    allocated.push_back({bytes, label});
    return std::calloc(bytes, 1);
  }
  void release(void* p, size_t bytes) noexcept override {
    released.push_back(bytes);
    std::free(p);
  }
  std::vector<std::pair<size_t, std::string>> allocated;
  std::vector<size_t> released;
};

}  // namespace

// Device Buffers come from the installed DeviceMemory, are counted under
// Device::cuda (the host counters do not move), and go back to it once,
// also after a move; with none installed, one is an error naming the buffer.
TEST(Buffer, DeviceBuffersUseTheInstalledDeviceMemory) {
  ASSERT_EQ(device_memory(), nullptr);
  try {
    Buffer b(64, MemCategory::activations, "acts.on.gpu", Device::cuda);
    ADD_FAILURE() << "a device buffer without a device allocator";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("acts.on.gpu"), std::string::npos) << e.what();
  }
  FakeDeviceMemory fake;
  set_device_memory(&fake);
  MemTracker& t = MemTracker::get();
  const size_t host_before = t.current_total(Device::cpu);
  const size_t dev_before = t.current(MemCategory::grads, Device::cuda);
  {
    Buffer a(1000, MemCategory::grads, "grads.gpu", Device::cuda);
    EXPECT_EQ(a.device(), Device::cuda);
    ASSERT_EQ(fake.allocated.size(), 1u);
    EXPECT_EQ(fake.allocated[0], std::make_pair(size_t{1000}, std::string("grads.gpu")));
    EXPECT_EQ(t.current(MemCategory::grads, Device::cuda), dev_before + 1000);
    EXPECT_EQ(t.current_total(Device::cpu), host_before);
    Buffer moved = std::move(a);
    Buffer other(24, MemCategory::grads, "other.gpu", Device::cuda);
    other = std::move(moved);  // frees other's 24 bytes, takes the 1000
    EXPECT_EQ(fake.released, std::vector<size_t>{24});
  }
  EXPECT_EQ(fake.released, (std::vector<size_t>{24, 1000}));
  EXPECT_EQ(t.current(MemCategory::grads, Device::cuda), dev_before);
  set_device_memory(nullptr);
}

// KeptValues makes a value once per (scope, key), gives it again until the
// scope changes, and starts afresh when it holds `cap` keys and a new one
// comes.
TEST(KeptValues, MakesEachValueOncePerScope) {
  KeptValues<std::string, int, int> kept(3);
  int made = 0;
  auto get = [&](const std::string& scope, int key) {
    return kept.get(scope, key, [&] {
      ++made;
      return static_cast<int>(scope.size()) * 100 + key;
    });
  };
  EXPECT_EQ(get("a", 1), 101);
  EXPECT_EQ(get("a", 2), 102);
  EXPECT_EQ(get("a", 1), 101);
  EXPECT_EQ(made, 2);
  EXPECT_EQ(get("bb", 1), 201);  // another scope: made again
  EXPECT_EQ(made, 3);
  EXPECT_EQ(get("a", 1), 101);  // the scope "a" was let go
  EXPECT_EQ(made, 4);
  get("a", 2);
  get("a", 3);
  EXPECT_EQ(made, 6);
  get("a", 3);  // three kept, none new: nothing is made
  EXPECT_EQ(made, 6);
  get("a", 4);  // a fourth key: the three are let go
  get("a", 1);
  EXPECT_EQ(made, 8);
  get("a", 4);
  EXPECT_EQ(made, 8);
}
