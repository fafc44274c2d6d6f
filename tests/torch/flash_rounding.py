#!/usr/bin/env python3
"""How far the GPU's flash attention forward (cuda/flash_attention.cu) may lie
from the CPU's (ops::flash_attention_forward) at bf16 and fp16, by arithmetic
alone: both round q, k and v to 16 bits and take fp32 scores; the GPU runs
an online softmax over blocks of 64 keys and rounds each block's
unnormalised probabilities exp(s - m) before P V, the CPU rounds the
normalised probabilities. Emulated here in double with PyTorch's roundings,
on the shapes and input range of tests/cuda/test_cuda_ops.cpp (CudaFlash);
prints the relative L2 difference of the outputs per shape, which the
tolerances kFlashOutTol there are set above.

  /usr/bin/python3 tests/torch/flash_rounding.py
"""
import math

import torch

BLOCK = 64
SHAPES = [(1, 1, 16, 1), (3, 5, 64, 2), (2, 64, 128, 8), (2, 65, 192, 3), (1, 200, 256, 2),
          (2, 129, 768, 12)]


def rounded(x, dtype):
    return x.to(dtype).to(torch.float64)


def gpu_forward(q, k, v, dtype):
    T, HS = q.shape
    scale = 1 / math.sqrt(HS)
    qr, kr, vr = rounded(q, dtype), rounded(k, dtype), rounded(v, dtype)
    out = torch.zeros(T, HS, dtype=torch.float64)
    for q0 in range(0, T, BLOCK):
        n = min(BLOCK, T - q0)
        t = torch.arange(q0, q0 + n)[:, None]
        m = torch.full((n,), -math.inf, dtype=torch.float64)
        l = torch.zeros(n, dtype=torch.float64)
        o = torch.zeros(n, HS, dtype=torch.float64)
        for k0 in range(0, q0 + 1, BLOCK):
            keys = torch.arange(k0, min(k0 + BLOCK, T))
            s = (qr[q0:q0 + n] @ kr[keys].T).float().double() * scale
            s = torch.where(keys[None, :] <= t, s, torch.tensor(-math.inf, dtype=torch.float64))
            m_new = torch.maximum(m, s.max(1).values)
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[:, None])
            l = l * alpha + p.sum(1)
            o = o * alpha[:, None] + rounded(p, dtype) @ vr[keys]
            m = m_new
        out[q0:q0 + n] = o / l[:, None]
    return out


def cpu_forward(q, k, v, dtype):
    T, HS = q.shape
    s = (rounded(q, dtype) @ rounded(k, dtype).T) / math.sqrt(HS)
    s = s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), -math.inf)
    return rounded(torch.softmax(s, 1), dtype) @ rounded(v, dtype)


def main():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for B, T, C, NH in SHAPES:
            num = den = 0.0
            for _ in range(B * NH):
                q, k, v = [(torch.rand(T, C // NH, dtype=torch.float64) * 4 - 2).float()
                           for _ in range(3)]
                g, c = gpu_forward(q, k, v, dtype), cpu_forward(q, k, v, dtype)
                num += ((g - c) ** 2).sum().item()
                den += (c ** 2).sum().item()
            print(f"{str(dtype).split('.')[-1]:9} B={B} T={T} C={C} NH={NH}: "
                  f"relative L2 difference {math.sqrt(num / den):.2e}")


if __name__ == "__main__":
    main()
