#include "step_budget.h"

#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/alloc.h"
#include "core/timer.h"

namespace meshlm::bench {

namespace {

// The op classes of the budget, in the table's order.
struct OpClass {
  const char* name;
  std::vector<ops::KernelOp> ops;
};

std::vector<OpClass> op_classes() {
  using K = ops::KernelOp;
  return {
      {"GEMM", {K::matmul_forward, K::matmul_backward, K::gemm}},
      {"attention", {K::attention_forward, K::attention_backward, K::flash_attention_forward,
                     K::flash_attention_backward, K::rope_forward, K::rope_backward,
                     K::gqa_pack_forward, K::gqa_pack_backward, K::cached_attention_forward}},
      {"LayerNorm", {K::layernorm_forward, K::residual_layernorm_forward, K::layernorm_backward,
                     K::rmsnorm_forward, K::residual_rmsnorm_forward, K::rmsnorm_backward}},
      {"GELU / SwiGLU", {K::gelu_forward, K::gelu_backward, K::swiglu_forward, K::swiglu_backward}},
      {"softmax + cross-entropy", {K::xent_local_max, K::xent_local_sums, K::xent_losses,
                                   K::xent_local_backward, K::xent_rows}},
      {"AdamW", {K::adamw_update}},
      {"gradient norm + clip, loss", {K::sum_of_squares, K::scale, K::mean}},
      {"residual, bias", {K::residual_forward, K::residual_backward, K::add_bias}},
      {"embeddings", {K::embedding_forward, K::embedding_backward, K::position_forward,
                      K::position_backward}},
      {"copies, zero, fill", {K::zero, K::fill, K::add, K::copy, K::hold_rounded, K::upload,
                              K::download}},
  };
}

template <typename F>
double best_of(int n, F&& f) {
  double best = 1e30;
  for (int i = 0; i < n; ++i) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

// The rate of the op's GEMMs run alone, each as one cblas_sgemm with the
// op's transposes on fresh operands, best of 3: what the shape reaches
// outside the step (ops::gemm cuts M into blocks; the step's caches hold
// other data).
double isolated_gflops(const ops::GemmShape& g) {
  struct Call {
    bool ta, tb;
    int m, n, k;
    float beta;
  };
  std::vector<Call> calls;
  if (g.op == ops::KernelOp::matmul_forward) {
    calls = {{false, true, g.m, g.n, g.k, 0.0f}};
  } else if (g.op == ops::KernelOp::matmul_backward) {
    // (N, OC, IC): dinp = dout w, then dw += dout^T inp.
    calls = {{false, false, g.m, g.k, g.n, 0.0f}, {true, false, g.n, g.k, g.m, 1.0f}};
  } else {
    calls = {{false, false, g.m, g.n, g.k, 0.0f}};
  }
  double flops = 0;
  std::vector<std::vector<float>> mats;
  for (const Call& c : calls) {
    flops += 2.0 * c.m * c.n * c.k;
    mats.emplace_back(size_t(c.m) * c.k, 0.01f);
    mats.emplace_back(size_t(c.k) * c.n, 0.02f);
    mats.emplace_back(size_t(c.m) * c.n, 0.0f);
  }
  auto run = [&] {
    for (size_t i = 0; i < calls.size(); ++i) {
      const Call& c = calls[i];
      cblas_sgemm(CblasRowMajor, c.ta ? CblasTrans : CblasNoTrans, c.tb ? CblasTrans : CblasNoTrans,
                  c.m, c.n, c.k, 1.0f, mats[3 * i].data(), c.ta ? c.m : c.k, mats[3 * i + 1].data(),
                  c.tb ? c.k : c.n, c.beta, mats[3 * i + 2].data(), c.n);
    }
  };
  run();
  return flops / best_of(3, run) / 1e9;
}

}  // namespace

MachineRates measure_machine() {
  MachineRates m;
  constexpr int n = 2048;
  std::vector<float> a(size_t{n} * n, 1.0f), b(a.size(), 0.5f), c(a.size(), 0.0f);
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  };
  sgemm();  // warm: OpenBLAS's threads and buffers
  m.sgemm_gflops = 2.0 * n * n * n / best_of(5, sgemm) / 1e9;

  constexpr size_t kCopy = size_t{64} << 20;  // floats: 256 MiB each way
  Buffer src(kCopy * sizeof(float), MemCategory::other, "bench.copy_src");
  Buffer dst(kCopy * sizeof(float), MemCategory::other, "bench.copy_dst");
  float* s = src.as<float>();
  float* d = dst.as<float>();
  auto copy = [&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < kCopy; ++i) d[i] = s[i];
  };
  copy();  // first touch: the pages are mapped here, not timed
  m.copy_gbs = 2.0 * kCopy * sizeof(float) / best_of(5, copy) / 1e9;
  return m;
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::string print_budget(std::FILE* out, const ops::TimedKernels& timed, int steps, double step_ms,
                         double faults_per_step, const MachineRates& m) {
  const double per = 1.0 / steps;
  std::string json = fmt::format("{{\"sgemm_gflops\": {:.2f}, \"copy_gbs\": {:.2f}, "
                                 "\"faults_per_step\": {:.0f}, \"ops\": {{",
                                 m.sgemm_gflops, m.copy_gbs, faults_per_step);
  fmt::print(out, "# step budget: {:.1f} ms/step (median of the timed steps); each op's time per "
                  "step below (on the CPU the op timer adds a clock read per op)\n", step_ms);
  fmt::print(out, "# machine, this run: SGEMM 2048^3 {:.1f} GFLOP/s, copy of 256 MiB {:.1f} GB/s "
                  "(read + write; an op whose data sit in cache can exceed it)\n",
             m.sgemm_gflops, m.copy_gbs);
  fmt::print(out, "| op class | op | calls | ms | % of ops | GFLOP/s | % of SGEMM | GB/s | % of copy |\n");
  fmt::print(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  double total = 0;
  for (int i = 0; i < static_cast<int>(ops::KernelOp::count); ++i)
    total += timed.seconds(ops::KernelOp(i)) * per;
  const char* sep = "";
  for (const OpClass& cls : op_classes()) {
    for (ops::KernelOp op : cls.ops) {
      const double s = timed.seconds(op) * per;
      if (timed.calls(op) == 0) continue;
      const ops::OpWork& w = timed.work(op);
      const double gflops = w.flops * per / s / 1e9, gbs = w.bytes * per / s / 1e9;
      const bool compute = w.flops > 0;
      fmt::print(out, "| {} | {} | {} | {:.2f} | {:.1f} | {} | {} | {} | {} |\n", cls.name,
                 ops::kernel_op_name(op), timed.calls(op) / steps, 1e3 * s, 100 * s / total,
                 compute ? fmt::format("{:.1f}", gflops) : "", 
                 compute ? fmt::format("{:.0f}%", 100 * gflops / m.sgemm_gflops) : "",
                 fmt::format("{:.1f}", gbs), fmt::format("{:.0f}%", 100 * gbs / m.copy_gbs));
      json += fmt::format("{}\"{}\": {{\"ms\": {:.3f}, \"gflops\": {:.2f}, \"gbs\": {:.2f}}}", sep,
                          ops::kernel_op_name(op), 1e3 * s, gflops, gbs);
      sep = ", ";
    }
  }
  fmt::print(out, "| all ops | | | {:.2f} | 100.0 | | | | |\n", 1e3 * total);
  fmt::print(out, "| outside the ops | | | {:.2f} | | | | | |\n", std::max(0.0, step_ms - 1e3 * total));
  fmt::print(out, "# page faults: {:.0f} per step (minor faults of the process over the timed steps)\n",
             faults_per_step);
  json += "}, \"gemms\": [";
  fmt::print(out, "\n| GEMM | M x N x K | calls | ms | GFLOP/s | % of SGEMM | alone GFLOP/s | in step / alone |\n"
                  "|---|---|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::pair<ops::GemmShape, ops::GemmStat>> shapes(timed.gemm_shapes().begin(),
                                                              timed.gemm_shapes().end());
  std::sort(shapes.begin(), shapes.end(),
            [](const auto& x, const auto& y) { return x.second.seconds > y.second.seconds; });
  sep = "";
  for (const auto& [shape, stat] : shapes) {
    const double s = stat.seconds * per, gflops = stat.flops * per / s / 1e9;
    const double alone = isolated_gflops(shape);
    fmt::print(out, "| {} | {} x {} x {} | {} | {:.2f} | {:.1f} | {:.0f}% | {:.1f} | {:.2f} |\n",
               ops::kernel_op_name(shape.op), shape.m, shape.n, shape.k, stat.calls / steps,
               1e3 * s, gflops, 100 * gflops / m.sgemm_gflops, alone, gflops / alone);
    json += fmt::format("{}{{\"op\": \"{}\", \"m\": {}, \"n\": {}, \"k\": {}, \"ms\": {:.3f}, "
                        "\"gflops\": {:.2f}}}",
                        sep, ops::kernel_op_name(shape.op), shape.m, shape.n, shape.k, 1e3 * s, gflops);
    sep = ", ";
  }
  json += "]}";
  return json;
}

}  // namespace meshlm::bench
