// meshlm_refdump: writes what meshlm computes into an HDF5 file, so that the
// independent PyTorch references under tests/torch/ can check it.
//
//   meshlm_refdump grads OUT.h5 --n_layer L --n_head NH --n_embd C
//                  --vocab_size V --seq_len T --batch B [--seed S]
//                  [--precision fp32|bf16|fp16]
//       parameters (perturbed away from the GPT-2 init so that every tensor
//       matters), a random batch, meshlm's loss and every parameter gradient.
//       At bf16/fp16 the CPU backend's emulated rounding of the GEMM inputs.
//       --arch llama [--n_kv_head K] [--intermediate_size F] [--tie 0|1]
//       [--rope_factor X] [--attention flash]: a Llama-family model instead (RMSNorm eps 1e-6,
//       rope theta 500000, Llama 3 scaling over 16 original positions).
//       Read by tests/torch/check_llama_grads.py.
//       Read by tests/torch/check_gpt2_grads.py.
//   meshlm_refdump adamw OUT.h5
//       parameters, gradients and learning rates of a few AdamW steps with
//       gradient clipping, and the parameters after them.
//       Read by tests/torch/check_adamw.py.
//   meshlm_refdump llama_ops OUT.h5
//       Llama's ops (RMSNorm, rope with Llama 3's scaling, SwiGLU, the
//       packing of grouped-query heads) on random inputs, forward and
//       backward. Read by tests/torch/check_llama_ops.py.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi_session.h"
#include "core/rng.h"
#include "io/h5.h"
#include "model/gpt.h"
#include "train/adamw.h"

using namespace meshlm;
namespace h5 = meshlm::io::h5;

namespace {

std::map<std::string, std::string> parse_flags(int argc, char** argv, int first) {
  std::map<std::string, std::string> f;
  for (int i = first; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) throw std::runtime_error("bad flag " + k);
    f[k.substr(2)] = argv[i + 1];
  }
  return f;
}

int flag(const std::map<std::string, std::string>& f, const std::string& k, int def) {
  auto it = f.find(k);
  return it == f.end() ? def : std::stoi(it->second);
}

void write_table(hid_t file, const std::string& group, const std::vector<ParamSpec>& table,
                 float* base) {
  h5::Group g = h5::require_group(file, group);
  for (const auto& p : table) {
    const TensorView t = p.in(base);
    std::vector<hsize_t> dims(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.ndim);
    h5::write_dataset(g, p.name, t.as<float>(), dims);
  }
}

int dump_grads(const std::string& out, const std::map<std::string, std::string>& f) {
  const int T = flag(f, "seq_len", 32);
  const int B = flag(f, "batch", 2);
  const uint64_t seed = static_cast<uint64_t>(flag(f, "seed", 42));
  GPTConfig cfg{.n_layer = flag(f, "n_layer", 2),
                .n_head = flag(f, "n_head", 4),
                .n_embd = flag(f, "n_embd", 64),
                .vocab_size = flag(f, "vocab_size", 256),
                .max_seq_len = T + 3};  // a position table longer than the sequence
  // --arch llama: its keys (model/gpt_config.h); rope scaling with --rope_factor.
  if (auto it = f.find("arch"); it != f.end() && it->second == "llama") {
    cfg.arch = ModelArch::llama;
    cfg.n_kv_head = flag(f, "n_kv_head", 0);
    cfg.intermediate_size = flag(f, "intermediate_size", 0);
    cfg.tie_word_embeddings = flag(f, "tie", 0) != 0;
    cfg.norm_eps = 1e-6;
    cfg.rope_theta = 500000.0;
    if (flag(f, "rope_factor", 0) > 0)
      cfg.rope_scaling = {.factor = double(flag(f, "rope_factor", 0)), .low_freq_factor = 1,
                          .high_freq_factor = 4, .original_max_positions = 16};
  }

  GPTOptions opts;
  if (auto it = f.find("precision"); it != f.end()) {
    const std::optional<ops::Precision> p = enum_from_name<ops::Precision>(it->second);
    if (!p) throw std::runtime_error("--precision " + it->second + ": not fp32, bf16 or fp16");
    opts.kernels = &ops::Kernels::cpu(*p);
  }
  if (auto it = f.find("attention"); it != f.end() && it->second == "flash")
    opts.attention = Attention::flash;
  GPT model(cfg, {}, opts);
  model.init_weights(seed);
  // Perturb every tensor (LayerNorm gains and biases too) so that a wrong
  // gradient of any of them shows; padded vocabulary rows stay zero.
  Rng rng(seed + 1);
  for (const auto& p : model.table()) {
    float* x = model.params() + p.offset;
    size_t n = p.numel();
    if (p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head)
      n = static_cast<size_t>(cfg.vocab_size) * cfg.n_embd;
    const double sd = p.decay() ? 0.15 : 0.2;
    for (size_t i = 0; i < n; ++i) x[i] += static_cast<float>(sd * rng.normal());
  }
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(cfg.vocab_size));

  model.zero_grads();
  const float loss = model.forward(tokens.data(), targets.data(), B, T);
  model.backward();

  h5::File file = h5::create_file(out);
  h5::write_scalar_attr<int>(file, "n_layer", cfg.n_layer);
  h5::write_scalar_attr<int>(file, "n_head", cfg.n_head);
  h5::write_scalar_attr<int>(file, "n_embd", cfg.n_embd);
  h5::write_scalar_attr<int>(file, "vocab_size", cfg.vocab_size);
  h5::write_scalar_attr<int>(file, "padded_vocab_size", cfg.padded_vocab_size());
  h5::write_scalar_attr<int>(file, "max_seq_len", cfg.max_seq_len);
  h5::write_scalar_attr<int>(file, "batch", B);
  h5::write_scalar_attr<int>(file, "seq_len", T);
  h5::write_scalar_attr<double>(file, "loss", loss);
  if (cfg.arch == ModelArch::llama) {
    h5::write_scalar_attr<int>(file, "n_kv_head", cfg.kv_heads());
    h5::write_scalar_attr<int>(file, "intermediate_size", cfg.mlp_width());
    h5::write_scalar_attr<int>(file, "tie_word_embeddings", cfg.tie_word_embeddings ? 1 : 0);
    h5::write_scalar_attr<double>(file, "rms_norm_eps", cfg.norm_eps);
    h5::write_scalar_attr<double>(file, "rope_theta", cfg.rope_theta);
    h5::write_scalar_attr<double>(file, "rope_factor", cfg.rope_scaling.factor);
    h5::write_scalar_attr<double>(file, "rope_low_freq_factor", cfg.rope_scaling.low_freq_factor);
    h5::write_scalar_attr<double>(file, "rope_high_freq_factor", cfg.rope_scaling.high_freq_factor);
    h5::write_scalar_attr<int>(file, "rope_original_max_positions",
                               cfg.rope_scaling.original_max_positions);
  }
  h5::write_dataset(file, "tokens", tokens.data(), {hsize_t(B), hsize_t(T)});
  h5::write_dataset(file, "targets", targets.data(), {hsize_t(B), hsize_t(T)});
  write_table(file, "params", model.table(), model.params());
  write_table(file, "grads", model.table(), model.grads());
  h5::close_file(file, out);
  return 0;
}

int dump_adamw(const std::string& out) {
  // A small table with matrices and vectors; values of several scales.
  const GPTConfig cfg{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 10, .max_seq_len = 4};
  const std::vector<ParamSpec> table = gpt_param_table(cfg);
  const size_t n = table_numel(table);
  const AdamWConfig hp{0.9f, 0.95f, 1e-8f, 0.1f};
  const double clip = 1.0;
  const int n_steps = 4;
  const float lrs[n_steps] = {1e-3f, 3e-3f, 2e-3f, 5e-4f};

  Rng rng(7);
  std::vector<float> params(n), grads(n);
  for (auto& x : params) x = static_cast<float>(0.5 * rng.normal());
  AdamW opt(table, hp);

  h5::File file = h5::create_file(out);
  h5::write_scalar_attr<double>(file, "beta1", hp.beta1);
  h5::write_scalar_attr<double>(file, "beta2", hp.beta2);
  h5::write_scalar_attr<double>(file, "eps", hp.eps);
  h5::write_scalar_attr<double>(file, "weight_decay", hp.weight_decay);
  h5::write_scalar_attr<double>(file, "grad_clip", clip);
  h5::write_scalar_attr<int>(file, "n_steps", n_steps);
  write_table(file, "params_before", table, params.data());
  for (int s = 0; s < n_steps; ++s) {
    // Steps 0 and 2 have a norm far above the clip, 1 and 3 below it.
    const double scale = (s % 2 == 0) ? 0.5 : 0.002;
    for (auto& g : grads) g = static_cast<float>(scale * rng.normal());
    const std::string grp = "step_" + std::to_string(s);
    write_table(file, grp + "/grads", table, grads.data());
    const double norm = clip_grad_norm(grads.data(), n, clip);
    opt.step(params.data(), grads.data(), lrs[s]);
    h5::Group g = h5::require_group(file, grp);
    h5::write_scalar_attr<double>(g, "lr", lrs[s]);
    h5::write_scalar_attr<double>(g, "grad_norm", norm);
  }
  write_table(file, "params_after", table, params.data());
  h5::close_file(file, out);
  return 0;
}

}  // namespace

// Llama's ops (ops/ops.h) on random inputs, in float as training runs them:
// RMSNorm, rope with Llama 3's scaling on q and k of grouped-query heads,
// SwiGLU, the packing of grouped-query heads; forward and backward.
int dump_llama_ops(const std::string& out) {
  const int B = 2, T = 24, NH = 4, NKV = 2, HS = 16, C = NH * HS, N = B * T, F = 40;
  const double eps = 1e-6, theta = 500000.0;
  const ops::RopeScaling scaling{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                                 .original_max_positions = 256};
  Rng rng(1234);
  auto randn = [&](size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * static_cast<float>(rng.normal());
    return v;
  };
  h5::File file = h5::create_file(out);
  // "group/name": the group made on first use.
  auto put = [&](const std::string& path, const std::vector<float>& v, std::vector<hsize_t> dims) {
    const size_t slash = path.find('/');
    h5::Group g = h5::require_group(file, path.substr(0, slash));
    h5::write_dataset(g, path.substr(slash + 1), v.data(), dims);
  };
  const hsize_t hN = N, hC = C, hF = F, hCkv = size_t(NKV) * HS;
  h5::write_scalar_attr<int>(file, "batch", B);
  h5::write_scalar_attr<int>(file, "seq_len", T);
  h5::write_scalar_attr<int>(file, "n_head", NH);
  h5::write_scalar_attr<int>(file, "n_kv_head", NKV);
  h5::write_scalar_attr<int>(file, "head_size", HS);
  h5::write_scalar_attr<double>(file, "rms_norm_eps", eps);
  h5::write_scalar_attr<double>(file, "rope_theta", theta);
  h5::write_scalar_attr<double>(file, "rope_factor", scaling.factor);
  h5::write_scalar_attr<double>(file, "rope_low_freq_factor", scaling.low_freq_factor);
  h5::write_scalar_attr<double>(file, "rope_high_freq_factor", scaling.high_freq_factor);
  h5::write_scalar_attr<int>(file, "rope_original_max_positions", scaling.original_max_positions);
  {  // RMSNorm
    const std::vector<float> x = randn(size_t(N) * C, 2.0f), w = randn(C), dout = randn(size_t(N) * C);
    std::vector<float> y(x.size()), rstd(N), dx(x.size(), 0.0f), dw(C, 0.0f);
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    ops::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    put("rmsnorm/x", x, {hN, hC});
    put("rmsnorm/w", w, {hC});
    put("rmsnorm/dout", dout, {hN, hC});
    put("rmsnorm/out", y, {hN, hC});
    put("rmsnorm/dx", dx, {hN, hC});
    put("rmsnorm/dw", dw, {hC});
  }
  {  // rope on q (NH heads) and k (NKV heads)
    std::vector<float> inv(HS / 2), cos(size_t(T) * HS / 2), sin(cos.size());
    ops::rope_inv_freq(inv.data(), HS, theta, scaling);
    ops::rope_tables(cos.data(), sin.data(), inv.data(), T, HS);
    const std::vector<float> q = randn(size_t(N) * C), k = randn(size_t(N) * hCkv);
    const std::vector<float> dq_out = randn(q.size()), dk_out = randn(k.size());
    std::vector<float> qr = q, kr = k, dq = dq_out, dk = dk_out;
    ops::rope_forward(qr.data(), cos.data(), sin.data(), B, T, NH, HS, C);
    ops::rope_forward(kr.data(), cos.data(), sin.data(), B, T, NKV, HS, hCkv);
    ops::rope_backward(dq.data(), cos.data(), sin.data(), B, T, NH, HS, C);
    ops::rope_backward(dk.data(), cos.data(), sin.data(), B, T, NKV, HS, hCkv);
    put("rope/inv_freq", inv, {hsize_t(HS / 2)});
    put("rope/q", q, {hN, hC});
    put("rope/k", k, {hN, hCkv});
    put("rope/q_out", qr, {hN, hC});
    put("rope/k_out", kr, {hN, hCkv});
    put("rope/dq_out", dq_out, {hN, hC});
    put("rope/dk_out", dk_out, {hN, hCkv});
    put("rope/dq", dq, {hN, hC});
    put("rope/dk", dk, {hN, hCkv});
  }
  {  // SwiGLU
    const std::vector<float> g = randn(size_t(N) * F, 3.0f), u = randn(size_t(N) * F),
                             dout = randn(size_t(N) * F);
    std::vector<float> y(g.size()), dg(g.size()), du(g.size());
    ops::swiglu_forward(y.data(), g.data(), u.data(), N, F, F);
    ops::swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), N, F, F);
    put("swiglu/gate", g, {hN, hF});
    put("swiglu/up", u, {hN, hF});
    put("swiglu/dout", dout, {hN, hF});
    put("swiglu/out", y, {hN, hF});
    put("swiglu/dgate", dg, {hN, hF});
    put("swiglu/dup", du, {hN, hF});
  }
  {  // grouped-query packing
    const std::vector<float> q = randn(size_t(N) * C), k = randn(size_t(N) * hCkv),
                             v = randn(size_t(N) * hCkv), dqkv = randn(size_t(N) * 3 * C);
    std::vector<float> qkv(dqkv.size()), dq(q.size()), dk(k.size()), dv(v.size());
    ops::gqa_pack_forward(qkv.data(), q.data(), k.data(), v.data(), N, NH, NKV, HS);
    ops::gqa_pack_backward(dq.data(), dk.data(), dv.data(), dqkv.data(), N, NH, NKV, HS);
    put("gqa/q", q, {hN, hC});
    put("gqa/k", k, {hN, hCkv});
    put("gqa/v", v, {hN, hCkv});
    put("gqa/dqkv", dqkv, {hN, 3 * hC});
    put("gqa/qkv", qkv, {hN, 3 * hC});
    put("gqa/dq", dq, {hN, hC});
    put("gqa/dk", dk, {hN, hCkv});
    put("gqa/dv", dv, {hN, hCkv});
  }
  h5::close_file(file, out);
  return 0;
}

int main(int argc, char** argv) {
  comm::prefer_isolated_singleton();
  MPI_Init(&argc, &argv);
  int rc = 2;
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (argc < 3) {
      std::fprintf(stderr, "usage: meshlm_refdump grads|adamw|llama_ops OUT.h5 [--flag value ...]\n");
    } else if (cmd == "grads") {
      rc = dump_grads(argv[2], parse_flags(argc, argv, 3));
    } else if (cmd == "adamw") {
      rc = dump_adamw(argv[2]);
    } else if (cmd == "llama_ops") {
      rc = dump_llama_ops(argv[2]);
    } else {
      std::fprintf(stderr, "meshlm_refdump: unknown command '%s'\n", cmd.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshlm_refdump: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
