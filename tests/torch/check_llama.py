#!/usr/bin/python3
"""meshlm's Llama against the PyTorch reference of llama_torch.py (float64),
on dumps of meshlm_refdump (TOOL):

  check_llama.py ops TOOL [--tol 1e-5] [--self-test]
      `TOOL llama_ops`: RMSNorm, rope (Llama 3 scaling, on q and on the
      grouped-query k), SwiGLU and the packing of grouped-query heads,
      forward and backward, in float32 on random inputs; each output
      recomputed from the dumped inputs (the backward by autograd, of
      sum(out * dout)): max|ours - ref| <= tol max|ref|; the rope
      frequencies within 2 ulp of the reference's float32 ones.
      --self-test: five references each wrong in one way a Llama port goes
      wrong (interleaved rope pairs, no Llama 3 scaling, LayerNorm's
      centring, GELU for SiLU, key heads shared round-robin) must each fail.

  check_llama.py grads TOOL [--tol 1e-5] [--self-test] [refdump grads flags ...]
      `TOOL grads --arch llama ...`: one forward and backward of meshlm's
      CPU backend in fp32 on perturbed weights and random tokens, against
      llama_torch.Llama on the same weights: |loss - ref| <= tol |ref|, per
      tensor max|g - g_ref| <= tol max|g_ref|, the padded vocabulary rows
      of embed_tokens and lm_head exactly zero gradient, exactly the
      model's tensors. --self-test: the reference with key heads shared
      round-robin, and without the rope scaling, must fail.
"""
import argparse
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_torch as L  # noqa: E402
import refcheck  # noqa: E402


def t64(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def rel(ours, ref):
    ref = ref.detach().numpy()
    scale = float(np.max(np.abs(ref)))
    return float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - ref))) / scale


def check_ops(f, variant=None):
    """{name: relative error} of every output of the dump `f` against the
    reference (or a wrong `variant` of it)."""
    at = f.attrs
    B, T, NH, NKV, HS = (int(at[k]) for k in ("batch", "seq_len", "n_head", "n_kv_head", "head_size"))
    N = B * T
    errs = {}

    # RMSNorm
    g = f["rmsnorm"]
    x, w, dout = t64(g["x"]).requires_grad_(), t64(g["w"]).requires_grad_(), t64(g["dout"])
    eps = float(at["rms_norm_eps"])
    if variant == "layernorm":
        y = F.layer_norm(x, (x.shape[-1],), eps=eps) * w
    else:
        y = L.rms_norm(x, w, eps)
    (y * dout).sum().backward()
    errs["rmsnorm out"] = rel(g["out"], y)
    errs["rmsnorm dx"] = rel(g["dx"], x.grad)
    errs["rmsnorm dw"] = rel(g["dw"], w.grad)

    # rope
    g = f["rope"]
    scaling = {"factor": float(at["rope_factor"]), "low_freq_factor": float(at["rope_low_freq_factor"]),
               "high_freq_factor": float(at["rope_high_freq_factor"]),
               "original_max_position_embeddings": int(at["rope_original_max_positions"])}
    inv = L.rope_inv_freq(HS, float(at["rope_theta"]), None if variant == "no_scaling" else scaling)
    ours_inv = np.asarray(g["inv_freq"], dtype=np.float32)
    errs["rope inv_freq (ulp)"] = float(np.max(np.abs(ours_inv - inv.numpy()) /
                                               np.spacing(np.abs(inv.numpy()))))
    cos, sin = L.rope_cos_sin(inv, T)
    for name, heads in (("q", NH), ("k", NKV)):
        v = t64(g[name]).reshape(B, T, heads, HS).requires_grad_()
        if variant == "interleaved":  # pairs (2i, 2i + 1) instead of (i, i + HS/2)
            c, s = cos[:, : HS // 2].repeat_interleave(2, -1), sin[:, : HS // 2].repeat_interleave(2, -1)
            pair = torch.stack([-v[..., 1::2], v[..., ::2]], dim=-1).flatten(-2)
            out = v * c[:, None, :] + pair * s[:, None, :]
        else:
            out = L.apply_rope(v, cos, sin)
        dout = t64(g["d" + name + "_out"]).reshape(B, T, heads, HS)
        (out * dout).sum().backward()
        errs[f"rope {name}"] = rel(np.asarray(g[name + "_out"]).reshape(B, T, heads, HS), out)
        errs[f"rope d{name}"] = rel(np.asarray(g["d" + name]).reshape(B, T, heads, HS), v.grad)

    # SwiGLU
    g = f["swiglu"]
    gate, up, dout = t64(g["gate"]).requires_grad_(), t64(g["up"]).requires_grad_(), t64(g["dout"])
    out = F.gelu(gate) * up if variant == "gelu" else L.swiglu(gate, up)
    (out * dout).sum().backward()
    errs["swiglu out"] = rel(g["out"], out)
    errs["swiglu dgate"] = rel(g["dgate"], gate.grad)
    errs["swiglu dup"] = rel(g["dup"], up.grad)

    # grouped-query packing: (q | repeat_kv(k) | repeat_kv(v)) per row
    g = f["gqa"]
    q = t64(g["q"]).reshape(N, NH, HS).requires_grad_()
    k = t64(g["k"]).reshape(N, NKV, HS).requires_grad_()
    v = t64(g["v"]).reshape(N, NKV, HS).requires_grad_()
    group = NH // NKV
    if variant == "round_robin":  # query head h on key head h % NKV
        rep = lambda a: a.repeat(1, group, 1)  # noqa: E731
    else:
        rep = lambda a: L.repeat_kv(a, group)  # noqa: E731
    qkv = torch.cat([q.reshape(N, -1), rep(k).reshape(N, -1), rep(v).reshape(N, -1)], dim=-1)
    (qkv * t64(g["dqkv"])).sum().backward()
    errs["gqa qkv"] = rel(g["qkv"], qkv)
    errs["gqa dq"] = rel(np.asarray(g["dq"]).reshape(N, NH, HS), q.grad)
    errs["gqa dk"] = rel(np.asarray(g["dk"]).reshape(N, NKV, HS), k.grad)
    errs["gqa dv"] = rel(np.asarray(g["dv"]).reshape(N, NKV, HS), v.grad)
    return errs


def ops_verdict(errs, tol):
    bad = []
    for name, e in errs.items():
        limit = 2.0 if name.endswith("(ulp)") else tol
        ok = e <= limit
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {e:.3g} (limit {limit:g})")
        if not ok:
            bad.append(name)
    return bad


def check_grads(f, tol, variant=None):
    at = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    V = int(at["vocab_size"])
    scaling = None
    if float(at["rope_factor"]) > 0:
        scaling = {"factor": float(at["rope_factor"]), "low_freq_factor": float(at["rope_low_freq_factor"]),
                   "high_freq_factor": float(at["rope_high_freq_factor"]),
                   "original_max_position_embeddings": int(at["rope_original_max_positions"])}
    cfg = {"n_layer": int(at["n_layer"]), "n_head": int(at["n_head"]), "n_kv_head": int(at["n_kv_head"]),
           "n_embd": int(at["n_embd"]), "vocab_size": V, "rms_norm_eps": float(at["rms_norm_eps"]),
           "rope_theta": float(at["rope_theta"]), "rope_scaling": scaling,
           "tie_word_embeddings": bool(at["tie_word_embeddings"])}
    p = {k: torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=True) for k, v in f["params"].items()}
    tokens = torch.tensor(np.asarray(f["tokens"]), dtype=torch.long)
    targets = torch.tensor(np.asarray(f["targets"]), dtype=torch.long)
    loss = L.Llama(cfg, p, variant).loss(tokens, targets)
    loss.backward()
    bad = []
    ours = float(at["loss"])
    rel = abs(ours - loss.item()) / abs(loss.item())
    print(f"{'ok  ' if rel <= tol else 'FAIL'} loss {ours:.7f} vs {loss.item():.7f}: {rel:.2e}")
    if rel > tol:
        bad.append("loss")
    want = {"embed_tokens.weight", "norm.weight"} | ({"lm_head.weight"} if not cfg["tie_word_embeddings"] else set())
    for i in range(cfg["n_layer"]):
        want |= {f"layers.{i}.{n}.weight" for n in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    if set(f["grads"].keys()) != want:
        bad.append("tensor set")
        print(f"FAIL tensors: {sorted(set(f['grads'].keys()) ^ want)}")
    for name in sorted(want & set(f["grads"].keys())):
        g = np.asarray(f["grads"][name], dtype=np.float64)
        ref = p[name].grad.numpy()
        if name in ("embed_tokens.weight", "lm_head.weight"):
            if np.any(g[V:] != 0):
                bad.append(name + " padded rows")
                print(f"FAIL {name}: a padded row has a gradient")
            g, ref = g[:V], ref[:V]
        scale = np.max(np.abs(ref))
        e = np.max(np.abs(g - ref)) / scale
        ok = e <= tol and scale > 0
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {e:.2e} (max|g| {scale:.3g})")
        if not ok:
            bad.append(name)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["ops", "grads"])
    ap.add_argument("tool")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--self-test", action="store_true")
    a, flags = ap.parse_known_args()  # grads: the rest are meshlm_refdump's flags

    def judge(path):
        with h5py.File(path, "r") as f:
            if a.what == "ops":
                bad = ops_verdict(check_ops(f), a.tol)
                wrong = (("interleaved", "rope"), ("no_scaling", "rope"), ("layernorm", "rmsnorm"),
                         ("gelu", "swiglu"), ("round_robin", "gqa"))
                caught = lambda v, part: any(n.startswith(part) for n in ops_verdict(check_ops(f, v), a.tol))  # noqa: E731
            else:
                bad = check_grads(f, a.tol)
                wrong = (("round_robin", "grads"), ("no_scaling", "grads"))
                caught = lambda v, part: bool(check_grads(f, a.tol, v))  # noqa: E731
            for variant, part in wrong if a.self_test else ():
                print(f"# wrong reference: {variant}")
                if not caught(variant, part):
                    bad.append(f"the {variant} reference passes the {part} checks")
                    print(f"FAIL: the {variant} reference passes the {part} checks")
        print("PASS" if not bad else "FAIL")
        return not bad

    sub, dump = ("llama_ops", "llama_ops.h5") if a.what == "ops" else ("grads", "grads.h5")
    options = [] if a.what == "ops" else ["--arch", "llama"] + flags
    return 0 if refcheck.run_tool(a.tool, sub, dump, options, judge) else 1


if __name__ == "__main__":
    sys.exit(main())
