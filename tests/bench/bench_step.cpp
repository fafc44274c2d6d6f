// meshlm_bench: time of one training step (forward + backward + gradient
// clipping + AdamW) of GPT-2 on one rank, for comparison with PyTorch CPU
// (tests/bench/torch_step.py, driven by tests/bench/compare.py).
//
//   meshlm_bench --n_layer 12 --n_head 12 --n_embd 768 --vocab_size 50304
//                --seq_len 64 --batch 4 --threads 2 [--steps 5] [--warmup 2] [--cuda 1]
//                [--bf16 1] [--flash 1] [--lora R] [--op_timings 1] [--budget 1]
//                [--llama 1 --n_kv_head K --intermediate_size F [--tied 1]]
//                [--classifier_rows R]
//
// --classifier_rows R computes the classifier's logits R rows at a time
// instead of the backend's chunk (GPTOptions::classifier_rows; the CPU's:
// at most 128 MiB of logits, in equal chunks: model/activations.h).
// --llama 1 times a Llama-family model instead (RMSNorm, rotary embeddings
// with theta 500000, grouped-query attention with K key/value heads, a SwiGLU
// MLP of width F, an untied lm_head unless --tied 1).
// --cuda 1 runs the step on GPU 0 (runtime.backend = cuda, fp32), timed to
// the end of the device's work, and adds the device memory to the line: the
// tracked Buffers' peak, the caching allocator's reservation, and what
// cudaMemGetInfo reports in use. --bf16 1 computes at train.precision = bf16
// (emulated on the CPU). --flash 1 sets train.attention = flash (on a GPU:
// the fused kernels, which need --bf16 1). --lora R trains LoRA adapters of
// rank R (alpha 2R) on every linear layer of a frozen NF4 base, quantized
// once from GPT-2's initialisation (finetune.mode = lora, quant.type = nf4;
// on a GPU the base's bytes are uploaded once and dequantized in tiles).
// On a GPU the classifier's chunks and the base's tiles are those of
// `meshlm train` (train/engine.cpp). --op_timings 1 times every op as
// runtime.op_timings does (ops/timed_kernels.h: each op waited for) and adds
// "op_ms", the milliseconds per timed step of each op, to the line; the
// step itself is then slower than a plain one. --budget 1 (CPU) times the
// ops the same way and prints the step's time budget to stderr: each op's
// milliseconds, GFLOP/s or GB/s against an SGEMM and a memory copy measured
// in the same run, the GEMMs by shape, and the page faults per step
// (step_budget.h); the line gets the same figures as "budget".
//
// Prints one JSON line (same keys as torch_step.py). Training FLOPs per step
// (docs/PERFORMANCE.md):
//   tokens = B*T; forward per token = 2 (L P + V C) + 4 L T C, P a block's
//   linear weights (GPTConfig::block_matmul_elements: GPT-2 12 C^2);
//   training = 3 x forward.
#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "comm/mpi_session.h"
#include "core/rng.h"
#include "step_budget.h"
#include "load/base_loader.h"
#include "ops/timed_kernels.h"
#include "core/timer.h"
#include "model/gpt.h"
#include "mesh/mesh.h"
#include "train/adamw.h"
#include "train/backend.h"

using namespace meshlm;

int main(int argc, char** argv) {
  comm::prefer_isolated_singleton();
  MPI_Init(&argc, &argv);
  std::map<std::string, long> f = {{"n_layer", 12}, {"n_head", 12},   {"n_embd", 768},
                                   {"vocab_size", 50304}, {"seq_len", 64}, {"batch", 4},
                                   {"threads", 1},  {"steps", 5},     {"warmup", 2}, {"cuda", 0},
                                   {"bf16", 0}, {"flash", 0}, {"lora", 0}, {"op_timings", 0},
                                   {"llama", 0}, {"n_kv_head", 0}, {"intermediate_size", 0},
                                   {"tied", 0}, {"budget", 0}, {"classifier_rows", 0}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || !f.count(k.substr(2))) {
      std::fprintf(stderr, "meshlm_bench: unknown flag %s\n", argv[i]);
      MPI_Finalize();
      return 2;
    }
    f[k.substr(2)] = std::stol(argv[i + 1]);
  }
  const int threads = static_cast<int>(f["threads"]);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  GPTConfig cfg;
  cfg.n_layer = static_cast<int>(f["n_layer"]);
  cfg.n_head = static_cast<int>(f["n_head"]);
  cfg.n_embd = static_cast<int>(f["n_embd"]);
  cfg.vocab_size = static_cast<int>(f["vocab_size"]);
  const int B = static_cast<int>(f["batch"]), T = static_cast<int>(f["seq_len"]);
  cfg.max_seq_len = T;
  if (f["llama"] != 0) {
    cfg.arch = ModelArch::llama;
    cfg.n_kv_head = static_cast<int>(f["n_kv_head"]);
    cfg.intermediate_size = static_cast<int>(f["intermediate_size"]);
    cfg.tie_word_embeddings = f["tied"] != 0;
    cfg.rope_theta = 500000;
  }
  const ops::Precision precision = f["bf16"] != 0 ? ops::Precision::bf16 : ops::Precision::fp32;
  const ComputeBackend kind = f["cuda"] != 0 ? ComputeBackend::cuda : ComputeBackend::cpu;
  const BackendCaps& caps = backend_caps(kind);
  if (!caps.built) {
    std::fprintf(stderr, "meshlm_bench: %s\n", caps.missing_build);
    MPI_Finalize();
    return 2;
  }
  int rc = 0;
  try {  // the backend and its mesh end before MPI does
    const ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(1, 1, 1));
    const bool budget = f["budget"] != 0;
    const Backend backend(kind, mesh, precision, f["op_timings"] != 0 || budget);
    // The rounded GEMMs' tiles of bf16 on the CPU, as meshlm train makes them.
    std::optional<ops::RoundingScratch> rounding;
    if (const int n = rounding_threads(caps, precision, threads)) rounding.emplace(n);
    const ops::Kernels* kernels = &backend.kernels();
    const ops::TimedKernels* timed = backend.op_timer();
    const std::string device = backend.device_name();
    GPTOptions opts;
    opts.kernels = kernels;
    opts.attention = f["flash"] != 0 ? Attention::flash : Attention::probabilities;
    // The work sizes of `meshlm train` on this backend (Engine::plan_of).
    apply_work_sizes(caps, size_t(cfg.padded_vocab_size()), opts);
    if (f["classifier_rows"] > 0) opts.classifier_rows = static_cast<int>(f["classifier_rows"]);
    std::unique_ptr<Buffer> store;
    load::StoreManifest manifest;
    if (f["lora"] > 0) {
      opts.lora.enabled = true;
      opts.lora.rank = static_cast<int>(f["lora"]);
      opts.lora.alpha = 2.0f * static_cast<float>(opts.lora.rank);
      quant::QuantConfig q;
      q.type = quant::QuantType::nf4;
      manifest = load::make_manifest(cfg, q.type);
      store = std::make_unique<Buffer>(manifest.bytes, MemCategory::quantized, "bench.store");
      load::fill_store(cfg, q, 0, manifest, store->as<uint8_t>(), /*use_cache=*/false);
    }
    opts.dequantizer = &backend.dequantizer();
    GPT model(cfg, {}, opts);
    if (store)
      model.attach_base([&](const ParamSpec& p) {
        const load::StoreEntry& e = manifest.at(p.name);
        return quant::qtensor_at(e.layout, store->as<uint8_t>() + e.offset);
      });
    model.init_weights(0);
    AdamW opt(model.table(), {0.9f, 0.95f, 1e-8f, 0.1f}, 0, SIZE_MAX, *kernels);
    std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
    Rng rng(1);
    for (auto& t : tok) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
    for (auto& t : tgt) t = static_cast<int32_t>(rng.below(cfg.vocab_size));

    std::vector<double> times;
    float loss = 0;
    constexpr int kOps = static_cast<int>(ops::KernelOp::count);
    // The machine's rates before and after the steps, the better of each: a
    // shared machine's speed drifts within a run.
    bench::MachineRates rates = budget ? bench::measure_machine() : bench::MachineRates{};
    long faults0 = 0;
    for (long s = 0; s < f["warmup"] + f["steps"]; ++s) {
      if (s == f["warmup"]) {
        if (timed) timed->reset();
        faults0 = bench::minor_faults();
      }
      const double t0 = now_seconds();
      model.zero_grads();
      // As `meshlm train` runs a step (train/pipeline_runner.cpp): the
      // classifier's backward inside the forward, at the loss scale the
      // backward then uses, so its logits are computed once.
      loss = model.forward(0, tok.data(), tgt.data(), B, T, 1.0f);
      model.backward(0, 1.0f);
      // The norm's one read, then the clip inside the update (Engine::step):
      // the gradients are not scaled in place.
      const double norm = std::sqrt(kernels->sum_of_squares(model.grads(), model.num_params()));
      opt.step(model.params(), model.grads(), 3e-4f, 1.0f, clip_coefficient(norm, 1.0));
      kernels->synchronize();
      if (s >= f["warmup"]) times.push_back(now_seconds() - t0);
    }
    const double faults_per_step =
        static_cast<double>(bench::minor_faults() - faults0) / static_cast<double>(f["steps"]);
    if (budget) {
      const bench::MachineRates after = bench::measure_machine();
      rates.sgemm_gflops = std::max(rates.sgemm_gflops, after.sgemm_gflops);
      rates.copy_gbs = std::max(rates.copy_gbs, after.copy_gbs);
    }
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];
    const double L = cfg.n_layer, C = cfg.n_embd, V = cfg.vocab_size;
    const double fwd_per_token = 2 * (L * cfg.block_matmul_elements() + V * C) + 4 * L * T * C;
    const double flops = 3 * fwd_per_token * B * T;
    std::string memory;
    if (caps.device_memory)
      memory = ", \"peak_tracked_gib\": " +
               std::to_string(MemTracker::get().peak_total(Device::cuda) / 1073741824.0) +
               ", \"reserved_gib\": " + std::to_string(backend.device_reserved_bytes() / 1073741824.0) +
               ", \"device_in_use_gib\": " + std::to_string(backend.device_used_bytes() / 1073741824.0);
    if (timed) {
      memory += ", \"op_ms\": {";
      const char* sep = "";
      for (int i = 0; i < kOps; ++i) {
        const double ms = 1e3 * timed->seconds(ops::KernelOp(i)) / static_cast<double>(f["steps"]);
        if (ms <= 0) continue;
        memory += sep + std::string("\"") + ops::kernel_op_name(ops::KernelOp(i)) +
                  "\": " + std::to_string(ms);
        sep = ", ";
      }
      memory += "}";
    }
    if (budget && timed)
      memory += ", \"budget\": " + bench::print_budget(stderr, *timed, static_cast<int>(f["steps"]),
                                                       1e3 * med, faults_per_step, rates);
    const std::string mode = f["lora"] > 0 ? "lora-nf4" : "full";
    std::printf(
        "{\"impl\": \"meshlm\", \"arch\": \"%s\", \"mode\": \"%s\", \"device\": \"%s\", \"precision\": \"%s\", \"attention\": \"%s\", \"threads\": %d, \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, "
        "\"vocab_size\": %d, \"seq_len\": %d, \"batch\": %d, \"ms_per_step\": %.3f, "
        "\"tokens_per_s\": %.1f, \"gflops\": %.2f, \"loss\": %.4f%s}\n",
        name_of(cfg.arch), mode.c_str(), device.c_str(), name_of(precision), name_of(opts.attention), threads, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, T, B, 1e3 * med, B * T / med,
        flops / med / 1e9, loss, memory.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshlm_bench: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
