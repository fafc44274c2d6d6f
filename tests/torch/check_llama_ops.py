#!/usr/bin/python3
"""meshlm's Llama ops against the PyTorch reference of llama_torch.py.

Usage:
  check_llama_ops.py TOOL [--tol 1e-5]
  check_llama_ops.py TOOL --self-test

Runs `TOOL llama_ops OUT.h5` (meshlm_refdump), which writes meshlm's
RMSNorm, rope (Llama 3 scaling, on q and on the grouped-query k), SwiGLU and
the packing of grouped-query heads, forward and backward, in float32 on
random inputs. Each output is recomputed from the dumped inputs in float64
(the backward by autograd, of sum(out * dout)) and compared:
max|ours - ref| <= tol * max|ref|. The rope frequencies are compared with
the reference's float32 ones to 2 ulp.

--self-test also runs the checks against references that are each wrong in
one way a Llama port goes wrong (interleaved rope pairs, rope without the
Llama 3 scaling, LayerNorm's centring in RMSNorm, GELU in place of SiLU, key
heads shared round-robin instead of by blocks) and requires every one of
them to fail while the true reference passes.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_torch as L  # noqa: E402


def t64(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def rel(ours, ref):
    ref = ref.detach().numpy()
    scale = float(np.max(np.abs(ref)))
    return float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - ref))) / scale


def check(f, variant=None):
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


def verdict(errs, tol):
    bad = []
    for name, e in errs.items():
        limit = 2.0 if name.endswith("(ulp)") else tol
        ok = e <= limit
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {e:.3g} (limit {limit:g})")
        if not ok:
            bad.append(name)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "llama_ops.h5")
        subprocess.run([a.tool, "llama_ops", path], check=True)
        with h5py.File(path, "r") as f:
            bad = verdict(check(f), a.tol)
            if a.self_test:
                for variant, part in (("interleaved", "rope"), ("no_scaling", "rope"),
                                      ("layernorm", "rmsnorm"), ("gelu", "swiglu"),
                                      ("round_robin", "gqa")):
                    print(f"# wrong reference: {variant}")
                    wrong = verdict(check(f, variant), a.tol)
                    if not any(n.startswith(part) for n in wrong):
                        bad.append(f"the {variant} reference passes the {part} checks")
                        print(f"FAIL: the {variant} reference passes the {part} checks")
    print("PASS" if not bad else "FAIL")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
