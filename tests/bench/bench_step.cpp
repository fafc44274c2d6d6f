// meshlm_bench: time of one training step (forward + backward + gradient
// clipping + AdamW) of GPT-2 on one rank, for comparison with PyTorch CPU
// (tests/bench/torch_step.py, driven by tests/bench/compare.py).
//
//   meshlm_bench --n_layer 12 --n_head 12 --n_embd 768 --vocab_size 50304
//                --seq_len 64 --batch 4 --threads 2 [--steps 5] [--warmup 2]
//
// Prints one JSON line (same keys as torch_step.py). Training FLOPs per step
// (docs/PERFORMANCE.md):
//   tokens = B*T; forward per token = 2 (L 12 C^2 + V C) + 4 L T C;
//   training = 3 x forward.
#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/timer.h"
#include "model/gpt.h"
#include "train/adamw.h"

using namespace meshlm;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::map<std::string, long> f = {{"n_layer", 12}, {"n_head", 12},   {"n_embd", 768},
                                   {"vocab_size", 50304}, {"seq_len", 64}, {"batch", 4},
                                   {"threads", 1},  {"steps", 5},     {"warmup", 2}};
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
  GPT model(cfg);
  model.init_weights(0);
  AdamW opt(model.table(), {0.9f, 0.95f, 1e-8f, 0.1f});
  std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
  Rng rng(1);
  for (auto& t : tok) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  for (auto& t : tgt) t = static_cast<int32_t>(rng.below(cfg.vocab_size));

  std::vector<double> times;
  float loss = 0;
  for (long s = 0; s < f["warmup"] + f["steps"]; ++s) {
    const double t0 = now_seconds();
    model.zero_grads();
    loss = model.forward(tok.data(), tgt.data(), B, T);
    model.backward();
    clip_grad_norm(model.grads(), model.num_params(), 1.0);
    opt.step(model.params(), model.grads(), 3e-4f);
    if (s >= f["warmup"]) times.push_back(now_seconds() - t0);
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  const double L = cfg.n_layer, C = cfg.n_embd, V = cfg.vocab_size;
  const double fwd_per_token = 2 * (L * 12 * C * C + V * C) + 4 * L * T * C;
  const double flops = 3 * fwd_per_token * B * T;
  std::printf(
      "{\"impl\": \"meshlm\", \"threads\": %d, \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, "
      "\"vocab_size\": %d, \"seq_len\": %d, \"batch\": %d, \"ms_per_step\": %.3f, "
      "\"tokens_per_s\": %.1f, \"gflops\": %.2f, \"loss\": %.4f}\n",
      threads, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, T, B, 1e3 * med, B * T / med,
      flops / med / 1e9, loss);
  MPI_Finalize();
  return 0;
}
