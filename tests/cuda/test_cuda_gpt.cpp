// The whole model on the CUDA backend against the CPU backend: the same GPT-2
// shard built on each (GPTOptions::kernels), the same weights and tokens; the
// loss and every parameter gradient agree within 1e-4 relative, and so do the
// parameters after AdamW steps run on each backend (train/adamw.h with the
// backend's kernels). At bf16 and fp16 the GPU's rounding of the GEMM inputs
// (cuBLAS) is checked against the CPU's emulation of it.
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "cuda/context.h"
#include "cuda_test.h"
#include "../unit/decode_cases.h"
#include "load/base_loader.h"
#include "model/gpt.h"
#include "ops/gpu_workspace.h"
#include "quant/formats.h"
#include "quant/quantize.h"
#include "train/adamw.h"

using namespace meshlm;

namespace {

// fp32 with TF32 off: a few 1e-6 of accumulated rounding differences (other
// summation orders in cuBLAS and the reductions), far under this.
constexpr double kGradTol = 1e-4;

double rel_l2(const std::vector<float>& got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<int32_t> random_ids(size_t n, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = static_cast<int32_t>(rng.uniform() * V) % V;
  return ids;
}

class CudaGPT : public CudaTest {
protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    gpu_ = std::make_unique<cuda::DeviceContext>(0, 0);
  }
  void TearDown() override { gpu_.reset(); }

  GPTConfig config() const {
    GPTConfig c;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.vocab_size = 300;  // padded to 320: padded columns on both backends
    c.max_seq_len = 48;
    return c;
  }

  // A Llama of the same size: grouped-query (2 key/value heads of 4) with
  // an untied classifier and Llama 3 rope scaling whose frequencies matter
  // within 48 positions, or multi-query (1) with the classifier tied.
  GPTConfig llama_config(int kv_heads, bool tied) const {
    GPTConfig c = config();
    c.arch = ModelArch::llama;
    c.n_kv_head = kv_heads;
    c.intermediate_size = 96;
    c.rope_theta = 500000;
    if (!tied)
      c.rope_scaling = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                        .original_max_positions = 16};
    c.tie_word_embeddings = tied;
    return c;
  }

  // Forward + backward on both backends; checks loss and every gradient
  // within `tol` (relative, in norm per tensor); returns the two losses.
  // The model is config()'s unless `model` is given.
  std::pair<float, float> compare_step(const GPTOptions& base_opts, int B, int T, uint64_t seed,
                                       const cuda::DeviceContext* gpu_ctx = nullptr,
                                       double tol = kGradTol,
                                       const GPTConfig* model = nullptr) {
    const cuda::DeviceContext& ctx = gpu_ctx ? *gpu_ctx : *gpu_;
    const GPTConfig cfg = model ? *model : config();
    GPTOptions cpu_opts = base_opts, gpu_opts = base_opts;
    cpu_opts.kernels = &ops::Kernels::cpu(ctx.kernels().precision());
    gpu_opts.kernels = &ctx.kernels();
    GPT cpu(cfg, {}, cpu_opts), gpu(cfg, {}, gpu_opts);
    cpu.init_weights(seed);
    gpu.init_weights(seed);
    EXPECT_NE(gpu.params(), nullptr);
    // The same weights on both sides, bit for bit (made on the host, uploaded).
    const std::vector<float> p = gpu.host_params();
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(p[i], cpu.params()[i]) << "param " << i;
      if (p[i] != cpu.params()[i]) return {};
    }

    const size_t N = static_cast<size_t>(B) * T;
    const std::vector<int32_t> tokens = random_ids(N, cfg.vocab_size, seed + 1);
    const std::vector<int32_t> targets = random_ids(N, cfg.vocab_size, seed + 2);
    cpu.zero_grads();
    gpu.zero_grads();
    const float loss_cpu = cpu.forward(tokens.data(), targets.data(), B, T);
    const float loss_gpu = gpu.forward(tokens.data(), targets.data(), B, T);
    EXPECT_TRUE(std::isfinite(loss_gpu));
    EXPECT_NEAR(loss_gpu, loss_cpu, tol * std::fabs(loss_cpu));
    // Near log(V) for random weights: a loss of 0 (nothing computed) fails.
    EXPECT_GT(loss_cpu, 0.5 * std::log(double(cfg.vocab_size)));
    cpu.backward(0.7f);
    gpu.backward(0.7f);
    std::vector<float> g(gpu.padded_params());
    gpu.kernels().download(g.data(), gpu.grads(), g.size() * sizeof(float));
    for (const ParamSpec& s : cpu.table()) {
      const std::vector<float> mine(g.begin() + s.offset, g.begin() + s.offset + s.numel());
      double norm = 0;
      for (size_t i = 0; i < s.numel(); ++i) norm += double(cpu.grads()[s.offset + i]) * cpu.grads()[s.offset + i];
      EXPECT_GT(norm, 0.0) << s.name << ": a zero gradient proves nothing";
      EXPECT_LE(rel_l2(mine, cpu.grads() + s.offset, s.numel()), tol) << s.name;
    }
    return {loss_cpu, loss_gpu};
  }

  std::unique_ptr<cuda::DeviceContext> gpu_;
};

TEST_F(CudaGPT, LossAndEveryGradientMatchTheCpu) {
  compare_step({}, 3, 40, 11);
}

TEST_F(CudaGPT, CheckpointedBlocksMatchTheCpu) {
  GPTOptions o;
  o.checkpointing = Checkpointing::full;
  compare_step(o, 2, 48, 12);
}

// bf16 and fp16: cuBLAS rounds the GEMM inputs as the CPU emulates it. The
// same inputs round the same; where a GPU and a CPU input lie a float
// rounding apart around a 16-bit midpoint they round an ulp apart (2^-8 at
// bf16), which leaves the gradients within these norms (measured on an H100:
// see the test's output). And the rounding is really there: the GPU's loss is
// at least 3 times further from fp32's than from the CPU's at its precision.
TEST_F(CudaGPT, Bf16AndFp16MatchTheCpuEmulation) {
  for (const auto& [p, tol] : {std::pair{ops::Precision::bf16, 1e-2},
                               std::pair{ops::Precision::fp16, 3e-3}}) {
    SCOPED_TRACE(name_of(p));
    const cuda::DeviceContext ctx(0, 0, p);
    ASSERT_EQ(ctx.kernels().precision(), p);
    const auto [loss_cpu, loss_gpu] = compare_step({}, 3, 40, 14, &ctx, tol);
    const auto [loss_fp32, unused] = compare_step({}, 3, 40, 14);
    std::printf("%s: loss CPU emulation %.7f, GPU %.7f, fp32 %.7f\n", name_of(p), loss_cpu,
                loss_gpu, loss_fp32);
    EXPECT_GE(std::fabs(loss_gpu - loss_fp32), 3 * std::fabs(loss_gpu - loss_cpu));
  }
}

// train.attention = flash: the GPU's fused kernels against the CPU's flash
// attention at the same precision (HS = 16 here; T = 40 crosses no block,
// T = 48 with checkpointing neither, so the kernel tests cover the blocks),
// within the bf16 and fp16 tolerances of the whole model above.
TEST_F(CudaGPT, FlashAttentionMatchesTheCpuEmulation) {
  for (const auto& [p, tol] : {std::pair{ops::Precision::bf16, 1e-2},
                               std::pair{ops::Precision::fp16, 3e-3}}) {
    SCOPED_TRACE(name_of(p));
    const cuda::DeviceContext ctx(0, 0, p);
    GPTOptions o;
    o.attention = Attention::flash;
    compare_step(o, 3, 40, 15, &ctx, tol);
    o.checkpointing = Checkpointing::full;
    compare_step(o, 2, 48, 16, &ctx, tol);
  }
}

// Llama's blocks (RMSNorm, rope, SwiGLU, grouped-query attention:
// cuda/llama_ops.cu) through the whole model: the loss and every gradient
// against the CPU backend at fp32, with and without checkpointed blocks,
// and at bf16 with the fused flash attention against the CPU's emulation
// (head size 16), within the tolerances of GPT-2's tests above.
TEST_F(CudaGPT, LlamaMatchesTheCpu) {
  for (const auto& [kv, tied] : {std::pair{2, false}, std::pair{1, true}}) {
    SCOPED_TRACE("n_kv_head " + std::to_string(kv) + (tied ? ", tied" : ", untied"));
    const GPTConfig cfg = llama_config(kv, tied);
    compare_step({}, 3, 40, 41, nullptr, kGradTol, &cfg);
    GPTOptions o;
    o.checkpointing = Checkpointing::full;
    compare_step(o, 2, 48, 42, nullptr, kGradTol, &cfg);
    const cuda::DeviceContext bf16(0, 0, ops::Precision::bf16);
    o.attention = Attention::flash;
    compare_step(o, 2, 48, 43, &bf16, 1e-2, &cfg);
  }
}

TEST_F(CudaGPT, PaddedFlatBuffersMatchTheCpu) {
  GPTOptions o;
  o.pad_multiple = 1000;  // as under ZeRO: padding past the table stays untouched
  compare_step(o, 1, 17, 13);
}

// Training on each backend: forward, backward, clip to the global norm, AdamW
// with the backend's kernels, for several steps; the parameters stay within
// the tolerance of the CPU's and the losses follow the same curve.
TEST_F(CudaGPT, AdamWStepsFollowTheCpu) {
  const GPTConfig cfg = config();
  GPTOptions gpu_opts;
  gpu_opts.kernels = &gpu_->kernels();
  GPT cpu(cfg), gpu(cfg, {}, gpu_opts);
  cpu.init_weights(21);
  gpu.init_weights(21);
  AdamWConfig ac;
  AdamW opt_cpu(cpu.table(), ac), opt_gpu(gpu.table(), ac, 0, SIZE_MAX, gpu.kernels());
  const int B = 2, T = 32, steps = 5;
  for (int step = 0; step < steps; ++step) {
    const auto tokens = random_ids(size_t(B) * T, cfg.vocab_size, 100 + step);
    const auto targets = random_ids(size_t(B) * T, cfg.vocab_size, 200 + step);
    cpu.zero_grads();
    gpu.zero_grads();
    const float lc = cpu.forward(tokens.data(), targets.data(), B, T);
    const float lg = gpu.forward(tokens.data(), targets.data(), B, T);
    EXPECT_NEAR(lg, lc, kGradTol * std::fabs(lc)) << "step " << step;
    cpu.backward();
    gpu.backward();
    const double nc = std::sqrt(sum_of_squares(cpu.grads(), cpu.num_params()));
    const double ng = std::sqrt(gpu.kernels().sum_of_squares(gpu.grads(), gpu.num_params()));
    EXPECT_NEAR(ng, nc, kGradTol * nc) << "gradient norm, step " << step;
    clip_to_norm(cpu.grads(), cpu.num_params(), nc, 0.5);
    clip_to_norm(gpu.grads(), gpu.num_params(), ng, 0.5, gpu.kernels());
    opt_cpu.step(cpu.params(), cpu.grads(), 1e-3f);
    opt_gpu.step(gpu.params(), gpu.grads(), 1e-3f);
  }
  // Each step moves a parameter by up to about lr; the two runs may differ
  // where m / sqrt(v) amplifies a rounding difference of a tiny gradient, so
  // the parameters are compared in norm, per tensor, relative to how far
  // training moved them.
  const std::vector<float> p = gpu.host_params();
  GPT init(cfg);
  init.init_weights(21);
  for (const ParamSpec& s : cpu.table()) {
    double diff = 0, moved = 0;
    for (size_t i = s.offset; i < s.offset + s.numel(); ++i) {
      diff += std::pow(double(p[i]) - cpu.params()[i], 2);
      moved += std::pow(double(cpu.params()[i]) - init.params()[i], 2);
    }
    ASSERT_GT(moved, 0.0) << s.name << " did not train";
    EXPECT_LE(std::sqrt(diff / moved), 1e-2) << s.name;
  }
}

// QLoRA on the GPU: an NF4 base (made and quantized on the host, as the
// node-shared store holds it) uploaded once, still quantized; its matrices
// dequantized tile by tile on the device, its embedding looked up on the
// device. The loss and every adapter gradient against the CPU backend with
// the same base and adapters, at fp32 and at bf16 (tolerances as above),
// and the device holds the base in NF4: its layout's bytes, within the format's
// size plus alignment.
TEST_F(CudaGPT, QLoraOnAnNf4BaseMatchesTheCpu) {
  const GPTConfig cfg = config();
  const load::StoreManifest m = load::make_manifest(cfg, quant::QuantType::nf4);
  Buffer store(m.bytes, MemCategory::quantized, "test.store");
  quant::QuantConfig qc;
  qc.type = quant::QuantType::nf4;
  load::fill_store(cfg, qc, 31, m, store.as<uint8_t>(), /*use_cache=*/false);
  auto tensor_of = [&](const ParamSpec& p) {
    const load::StoreEntry& e = m.at(p.name);
    return quant::qtensor_at(e.layout, store.as<uint8_t>() + e.offset);
  };
  // NF4's own size, counted here from the format (4 bits a weight, an int8
  // absmax per block, an f32 scale per group of blocks, an f32 offset), and
  // each of the four arrays padded to kQAlign at most.
  constexpr size_t kBlock = quant::kNF4Block, kGroup = quant::kNF4AbsmaxBlock, kAlign = quant::kQAlign;
  size_t matrix_params = 0, matrix_bytes = 0, nf4_bound = 0;
  for (const ParamSpec& p : gpt_param_table(cfg))
    if (p.shape.ndim != 1) {
      const size_t n = p.numel(), blocks = (n + kBlock - 1) / kBlock;
      matrix_params += n;
      matrix_bytes += m.at(p.name).layout.total_bytes;
      nf4_bound += (n + 1) / 2 + blocks + 4 * ((blocks + kGroup - 1) / kGroup) + 4 + 4 * (kAlign - 1);
    }

  GPTOptions o;
  o.lora.enabled = true;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  for (LinearSlot t : {LinearSlot::qkv, LinearSlot::attn_out, LinearSlot::mlp_up, LinearSlot::mlp_down})
    o.lora.targets.add(t);
  // Adapters with values in both factors (B starts at zero otherwise, and
  // dA with it), the same on both backends.
  auto adapters = [](const ParamSpec& p, int64_t row0, int64_t nrows, float* x) {
    Rng rng(std::hash<std::string>{}(p.name));
    const size_t rf = row_floats(p);
    rng.skip(2 * static_cast<uint64_t>(row0) * rf);  // normal() takes two draws
    for (size_t i = 0; i < static_cast<size_t>(nrows) * rf; ++i)
      x[i] = static_cast<float>(0.05 * rng.normal());
  };
  // The GPU's tiles both ways: the CPU's 64 rows (many tiles per matrix)
  // and meshlm train's on a GPU (ops::kGpuQTileRows: every matrix in one,
  // the classifier dequantized whole once per pass).
  for (const auto& [p, tol] : {std::pair{ops::Precision::fp32, kGradTol},
                               std::pair{ops::Precision::bf16, 1e-2}})
    for (int tile_rows : {0, ops::kGpuQTileRows}) {
      SCOPED_TRACE(std::string(name_of(p)) + ", tiles of " +
                   std::to_string(tile_rows > 0 ? tile_rows : quant::kQLinearTileRows) + " rows");
      const cuda::DeviceContext ctx(0, 0, p);
      GPTOptions cpu_opts = o, gpu_opts = o;
      gpu_opts.qtile_rows = tile_rows;
      gpu_opts.whole_classifier_tile = tile_rows > 0;
      cpu_opts.kernels = &ops::Kernels::cpu(p);
      gpu_opts.kernels = &ctx.kernels();
      gpu_opts.dequantizer = &ctx.dequantizer();
      const size_t before = MemTracker::get().current(MemCategory::quantized, Device::cuda);
      GPT cpu(cfg, {}, cpu_opts), gpu(cfg, {}, gpu_opts);
      cpu.attach_base(tensor_of);
      gpu.attach_base(tensor_of);
      const size_t on_device = MemTracker::get().current(MemCategory::quantized, Device::cuda) - before;
      EXPECT_EQ(on_device, matrix_bytes);
      EXPECT_LE(on_device, nf4_bound);
      EXPECT_LT(double(on_device) / double(matrix_params), 0.55);  // against 4 bytes in f32
      cpu.set_weights(adapters);
      gpu.set_weights(adapters);

      const int B = 2, T = 40;
      const size_t N = size_t(B) * T;
      const auto tokens = random_ids(N, cfg.vocab_size, 41), targets = random_ids(N, cfg.vocab_size, 42);
      cpu.zero_grads();
      gpu.zero_grads();
      const float lc = cpu.forward(tokens.data(), targets.data(), B, T);
      const float lg = gpu.forward(tokens.data(), targets.data(), B, T);
      EXPECT_TRUE(std::isfinite(lg));
      EXPECT_NEAR(lg, lc, tol * std::fabs(lc));
      EXPECT_GT(lc, 0.5 * std::log(double(cfg.vocab_size)));
      cpu.backward(0.7f);
      gpu.backward(0.7f);
      std::vector<float> g(gpu.padded_params());
      gpu.kernels().download(g.data(), gpu.grads(), g.size() * sizeof(float));
      ASSERT_EQ(cpu.table().size(), size_t(2 * 4 * cfg.n_layer));  // A and B, 4 slots, 2 layers
      for (const ParamSpec& s : cpu.table()) {
        const std::vector<float> mine(g.begin() + s.offset, g.begin() + s.offset + s.numel());
        double norm = 0;
        for (size_t i = 0; i < s.numel(); ++i) norm += std::pow(double(cpu.grads()[s.offset + i]), 2);
        EXPECT_GT(norm, 0.0) << s.name << ": a zero gradient proves nothing";
        EXPECT_LE(rel_l2(mine, cpu.grads() + s.offset, s.numel()), tol) << s.name;
      }
      std::printf("%s, tiles of %d rows: QLoRA loss CPU %.7f GPU %.7f; base on the device %zu "
                  "bytes for %zu parameters (%.4f B/param)\n",
                  name_of(p), tile_rows > 0 ? tile_rows : quant::kQLinearTileRows, lc, lg,
                  on_device, matrix_params, double(on_device) / double(matrix_params));
    }
}

// Bad token ids are refused on the host before anything is uploaded.
TEST_F(CudaGPT, TokenOutOfRangeIsAnErrorBeforeTheDeviceSeesIt) {
  const GPTConfig cfg = config();
  GPTOptions o;
  o.kernels = &gpu_->kernels();
  GPT gpu(cfg, {}, o);
  gpu.init_weights(1);
  std::vector<int32_t> tokens(16, 3), targets(16, 4);
  tokens[5] = cfg.vocab_size;
  try {
    gpu.forward(tokens.data(), targets.data(), 1, 16);
    FAIL() << "no error";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 300 out of range"), std::string::npos) << e.what();
  }
}

}  // namespace

// meshlm generate's decoder on the GPU (parameters, cache and scratch in
// device memory, the attention against the cache in cuda/cached_attention.cu)
// against the CPU's forward over the whole sequence, for GPT-2 and the Llama
// cases (tests/unit/decode_cases.h): every position's logits within 1e-5
// of the row's largest.
TEST_F(CudaGPT, CachedDecodeMatchesTheCpu) {
  expect_decode_matches_whole_forward(gpu_->kernels(), 1e-5);
}
