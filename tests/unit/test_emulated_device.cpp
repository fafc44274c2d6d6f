// runtime.backend = emulated (train/emulated_device.h): device buffers the
// host cannot touch between ops, the CPU's ops on them.
//  * a device Buffer comes from the arena: the kernels hold it, reach it in
//    an op (fill, then download), and a host read or write of it outside an
//    op stops the process with SIGSEGV;
//  * memory given back is handed out again zeroed, and a full arena is a
//    RankError naming the buffer;
//  * the emulated kernels give the CPU's bits (a matmul and its backward).
#include <gtest/gtest.h>

#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/kernels.h"
#include "train/emulated_device.h"

using namespace meshlm;

namespace {

TEST(EmulatedDevice, DeviceBuffersAreReachedOnlyInsideOps) {
  EmulatedDevice dev(ops::Precision::fp32);
  const ops::Kernels& k = dev.kernels();
  EXPECT_EQ(k.device(), Device::cuda);
  Buffer b(1000 * sizeof(float), MemCategory::other, "test.device", Device::cuda);
  float host = 0;
  EXPECT_TRUE(k.holds(b.data()));
  EXPECT_FALSE(k.holds(&host));
  k.fill(b.as<float>(), 2.5f, 1000);
  std::vector<float> back(1000);
  k.download(back.data(), b.data(), 1000 * sizeof(float));
  EXPECT_EQ(back[0], 2.5f);
  EXPECT_EQ(back[999], 2.5f);
  // SIGSEGV (AddressSanitizer's builds report it and exit 1 instead).
  EXPECT_DEATH({ volatile float x = b.as<float>()[3]; (void)x; std::exit(0); }, "");
  EXPECT_DEATH({ b.as<float>()[3] = 1.0f; std::exit(0); }, "");
}

TEST(EmulatedDevice, GivenBackMemoryComesBackZeroedAndAFullArenaIsNamed) {
  EmulatedMemory m(8 << 20);
  void* a = m.allocate(4096, "first");
  // Past a page, over whole huge pages (2 MiB) and parts of two: release()
  // drops the whole ones and keeps the parts, which allocate() zeroes.
  const size_t big = (5 << 20) + 4096;
  void* b = m.allocate(big, "big");
  const std::vector<size_t> at = {0, 100, (2 << 20) - 1, 3 << 20, big - 1};
  m.open();
  static_cast<char*>(a)[100] = 7;
  for (const size_t i : at) static_cast<char*>(b)[i] = 9;
  m.close();
  m.release(a, 4096);
  m.release(b, big);
  EXPECT_EQ(m.in_use(), 0u);
  void* again = m.allocate(100, "second");
  EXPECT_EQ(again, a);  // first fit
  void* big_again = m.allocate(big, "big again");
  EXPECT_EQ(big_again, b);
  m.open();
  EXPECT_EQ(static_cast<char*>(again)[100], 0);
  for (const size_t i : at) EXPECT_EQ(static_cast<char*>(big_again)[i], 0) << "byte " << i;
  m.close();
  m.release(big_again, big);
  try {
    (void)m.allocate(16 << 20, "too.large");
    FAIL() << "no error";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("too.large"), std::string::npos) << e.what();
  }
  m.release(again, 100);
}

TEST(EmulatedDevice, OpsGiveTheCpusBits) {
  EmulatedDevice dev(ops::Precision::fp32);
  const ops::Kernels& k = dev.kernels();
  const ops::Kernels& cpu = ops::Kernels::cpu();
  const int N = 12, IC = 16, OC = 24;
  Rng rng(5);
  std::vector<float> inp(N * IC), w(OC * IC), bias(OC), dout(N * OC);
  for (std::vector<float>* v : {&inp, &w, &bias, &dout})
    for (float& x : *v) x = static_cast<float>(rng.normal());
  std::vector<float> out(N * OC), dinp(N * IC), dw(OC * IC, 0.0f), db(OC, 0.0f);
  cpu.matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, IC, OC);
  cpu.matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                      OC);
  auto on_device = [&](const std::vector<float>& h) {
    Buffer b(h.size() * sizeof(float), MemCategory::other, "test.in", Device::cuda);
    k.upload(b.data(), h.data(), h.size() * sizeof(float));
    return b;
  };
  auto to_host = [&](const Buffer& b) {
    std::vector<float> h(b.bytes() / sizeof(float));
    k.download(h.data(), b.data(), b.bytes());
    return h;
  };
  Buffer di = on_device(inp), dwt = on_device(w), dbias = on_device(bias), ddout = on_device(dout);
  Buffer dout_fwd = on_device(std::vector<float>(N * OC)), ddinp = on_device(std::vector<float>(N * IC));
  Buffer ddw = on_device(std::vector<float>(OC * IC)), ddb = on_device(std::vector<float>(OC));
  k.matmul_forward(dout_fwd.as<float>(), di.as<float>(), dwt.as<float>(), dbias.as<float>(), N, IC,
                   OC);
  k.matmul_backward(ddinp.as<float>(), ddw.as<float>(), ddb.as<float>(), ddout.as<float>(),
                    di.as<float>(), dwt.as<float>(), N, IC, OC);
  EXPECT_EQ(to_host(dout_fwd), out);
  EXPECT_EQ(to_host(ddinp), dinp);
  EXPECT_EQ(to_host(ddw), dw);
  EXPECT_EQ(to_host(ddb), db);
}

}  // namespace
