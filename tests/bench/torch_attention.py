#!/usr/bin/env python3
"""PyTorch peer of meshlm_attention_bench: causal scaled_dot_product_attention
forward and backward on the GPU, at its best (bf16 inputs in PyTorch's own
(B, NH, T, HS) layout, the flash or cuDNN backend PyTorch picks).

Usage:
  torch_attention.py --batch 16 --seq_len 1024 --n_embd 768 --n_head 12
                     [--reps 20] [--warmup 3] [--fp16]

Each direction is timed with CUDA events around `reps` calls after `warmup`
untimed ones; the median is reported, with the FLOPs convention of
meshlm_attention_bench (forward 4 B NH T^2 HS / 2, backward 2.5 times it).
Prints one JSON line.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--n_embd", type=int, default=768)
    ap.add_argument("--n_head", type=int, default=12)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fp16", action="store_true")
    a = ap.parse_args()
    B, T, C, NH = a.batch, a.seq_len, a.n_embd, a.n_head
    HS = C // NH
    dt = torch.float16 if a.fp16 else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(1)
    scale = HS ** -0.25
    q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=dt, generator=g) * scale
               for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(True)
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=dt, generator=g)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    a.warmup, a.reps)

    def backward():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), dout)

    both = median_ms(backward, a.warmup, a.reps)
    bwd = both - fwd
    flops = 4.0 * B * NH * T * T * HS / 2
    print(json.dumps({
        "impl": "pytorch", "op": "attention", "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "precision": "fp16" if a.fp16 else "bf16", "batch": B,
        "seq_len": T, "n_embd": C, "n_head": NH, "fwd_ms": round(fwd, 4),
        "bwd_ms": round(bwd, 4), "fwd_tflops": round(flops / fwd / 1e9, 1),
        "bwd_tflops": round(2.5 * flops / bwd / 1e9, 1)}))
    del out


if __name__ == "__main__":
    main()
