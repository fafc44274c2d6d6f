"""Reference GPT-2 in torch.nn, used to cross-check meshlm.

The architecture is plain GPT-2:

  x = wte[tokens] + wpe[0:T]
  for each of the L blocks (pre-LayerNorm):
      x = x + attn(ln_1(x))      # c_attn (C -> 3C) -> q,k,v; causal softmax(q k^T / sqrt(HS)) v; c_proj (C -> C)
      x = x + mlp(ln_2(x))       # c_fc (C -> 4C); GELU (tanh approximation); c_proj (4C -> C)
  x = ln_f(x)
  logits = x @ wte[:V]^T         # lm_head tied to wte, only the V real rows
  loss = mean cross-entropy over the B*T positions

wte has padded_vocab_size (Vp >= V) rows like meshlm's; rows [V, Vp) never
take part in the computation, so their gradient is exactly zero.

Submodules are named so that `dict(model.named_parameters())` has exactly
meshlm's parameter names (the HDF5 dataset names of its dumps):

  wte.weight (Vp,C), wpe.weight (maxT,C),
  h.{l}.ln_1.{weight,bias} (C), h.{l}.attn.c_attn.weight (3C,C), h.{l}.attn.c_attn.bias (3C),
  h.{l}.attn.c_proj.weight (C,C), h.{l}.attn.c_proj.bias (C), h.{l}.ln_2.{weight,bias} (C),
  h.{l}.mlp.c_fc.weight (4C,C), h.{l}.mlp.c_fc.bias (4C), h.{l}.mlp.c_proj.weight (C,4C),
  h.{l}.mlp.c_proj.bias (C), ln_f.{weight,bias} (C).

Attention is written out by hand (torch 1.13 has no scaled_dot_product_attention).

`GPT2(cfg, gemm_inputs=torch.bfloat16)` is meshlm's train.precision = bf16
(or float16 for fp16): every product of two matrices (the four linear
layers, q k^T, P v and the tied lm_head) reads both of its inputs rounded to
that type, in forward and in backward (the gradient flowing in and the other
operand), and accumulates in the model's own dtype. Nothing else is rounded.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    padded_vocab_size: int = 50304
    max_seq_len: int = 1024


def padded_vocab(vocab_size, multiple=64):
    """meshlm pads the vocabulary to a multiple of 64 rows."""
    return ((vocab_size + multiple - 1) // multiple) * multiple


def expected_param_shapes(cfg):
    """Ordered {name: shape} of every parameter meshlm (and this model) has."""
    C, Vp, T = cfg.n_embd, cfg.padded_vocab_size, cfg.max_seq_len
    shapes = {"wte.weight": (Vp, C), "wpe.weight": (T, C)}
    for l in range(cfg.n_layer):
        p = f"h.{l}."
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (3 * C, C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (C, 4 * C), p + "mlp.c_proj.bias": (C,),
        })
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


class RoundedMatmul(torch.autograd.Function):
    """a @ b with both inputs rounded to `dtype` first, in forward and in both
    products of backward (grad_a = r(g) @ r(b)^T, grad_b = r(a)^T @ r(g))."""

    @staticmethod
    def forward(ctx, a, b, dtype):
        ctx.save_for_backward(a, b)
        ctx.dtype = dtype
        return _round(a, dtype) @ _round(b, dtype)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        r = ctx.dtype
        ga = _round(g, r) @ _round(b, r).transpose(-2, -1)
        gb = _round(a, r).transpose(-2, -1) @ _round(g, r)
        return ga, gb, None


def _round(x, dtype):
    return x.to(dtype).to(x.dtype)


def matmul(a, b, dtype=None):
    """a @ b, or with both inputs rounded to `dtype` (RoundedMatmul)."""
    return a @ b if dtype is None else RoundedMatmul.apply(a, b, dtype)


def linear(x, layer, dtype=None):
    """x W^T + b of an nn.Linear, its product through matmul()."""
    if dtype is None:
        return layer(x)
    return matmul(x, layer.weight.t(), dtype) + layer.bias


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gemm_inputs = None
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        NH, HS = self.n_head, C // self.n_head
        r = self.gemm_inputs
        q, k, v = linear(x, self.c_attn, r).split(C, dim=2)
        # head h = channels [h*HS, (h+1)*HS) of each of q, k, v
        q = q.view(B, T, NH, HS).transpose(1, 2)  # (B, NH, T, HS)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        att = matmul(q, k.transpose(-2, -1), r) * (1.0 / math.sqrt(HS))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = matmul(att, v, r)  # (B, NH, T, HS)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return linear(y, self.c_proj, r)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gemm_inputs = None
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        r = self.gemm_inputs
        return linear(F.gelu(linear(x, self.c_fc, r), approximate="tanh"), self.c_proj, r)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    def __init__(self, cfg, gemm_inputs=None):
        super().__init__()
        assert cfg.padded_vocab_size >= cfg.vocab_size
        self.config = cfg
        self.gemm_inputs = gemm_inputs
        # Registration order gives named_parameters() meshlm's order.
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        for block in self.h:
            block.attn.gemm_inputs = gemm_inputs
            block.mlp.gemm_inputs = gemm_inputs

    def init_weights(self, seed=None, std=0.02):
        """GPT-2 style init: N(0, std) weights (residual projections scaled by
        1/sqrt(2L)), zero biases, LayerNorm weight 1 / bias 0."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln_" in name or name.startswith("ln_f"):
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    s = std
                    if name.endswith("c_proj.weight"):
                        s = std / math.sqrt(2 * self.config.n_layer)
                    p.normal_(0.0, s, generator=g)
        return self

    def load_from_arrays(self, arrays):
        """Copy {name: numpy array} into the parameters (converted to each
        parameter's dtype). The name set and every shape must match exactly."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(arrays))
        extra = sorted(set(arrays) - set(params))
        if missing or extra:
            raise ValueError(f"parameter set mismatch: missing={missing} extra={extra}")
        with torch.no_grad():
            for name, p in params.items():
                a = np.asarray(arrays[name])
                if tuple(a.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: shape {tuple(a.shape)} != expected {tuple(p.shape)}")
                p.copy_(torch.from_numpy(np.ascontiguousarray(a)).to(p.dtype))
        return self

    def forward(self, tokens, targets=None):
        """tokens, targets: (B, T) integer tensors. Returns (logits (B,T,V), loss or None)."""
        B, T = tokens.shape
        V = self.config.vocab_size
        assert T <= self.config.max_seq_len
        tokens = tokens.long()
        pos = torch.arange(T, device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)[None, :, :]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if self.gemm_inputs is None:
            logits = F.linear(x, self.wte.weight[:V])  # tied lm_head, real rows only
        else:
            logits = matmul(x, self.wte.weight[:V].t(), self.gemm_inputs)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, V), targets.long().reshape(B * T))
        return logits, loss
