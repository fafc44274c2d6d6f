"""Llama's building blocks in PyTorch, written from their published
definitions (Hugging Face transformers' modeling_llama.py and
modeling_rope_utils.py, the Llama 3 paper): the reference meshlm's Llama ops
are checked against (check_llama_ops.py). Independent of meshlm's code.

  rms_norm(x, w, eps)             x / sqrt(mean(x^2) + eps) * w, in x's dtype
  rope_inv_freq(hs, theta, s)     the rotation frequencies, float32, with the
                                  "llama3" rope scaling s (a dict) or none
  rope_cos_sin(inv_freq, T)       cos, sin (T, hs) of t * inv_freq (float32
                                  angles), each frequency twice (rotate-half)
  apply_rope(x, cos, sin)         x (..., T, heads, hs): x cos + rotate_half(x) sin
  repeat_kv(x, group)             (..., heads, hs) -> (..., heads * group, hs),
                                  each key/value head beside its group's queries
  swiglu(gate, up)                silu(gate) * up
"""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_inv_freq(hs, theta, scaling=None):
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if not scaling:
        return inv
    factor = scaling["factor"]
    lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    # Long wavelengths slowed by `factor`, short ones kept, those between blended.
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def rope_cos_sin(inv_freq, T, dtype=torch.float64):
    t = torch.arange(T, dtype=torch.float32)
    angles = torch.outer(t, inv_freq.float())  # float32 products, as the reference forms them
    emb = torch.cat([angles, angles], dim=-1).to(dtype)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x: (B, T, heads, hs); cos, sin: (T, hs)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def repeat_kv(x, group):
    """(..., heads, hs) -> (..., heads * group, hs): head h of the result is
    head h // group of x."""
    return x.repeat_interleave(group, dim=-2)


def swiglu(gate, up):
    return F.silu(gate) * up
