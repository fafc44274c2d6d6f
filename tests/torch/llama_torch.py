"""Llama's building blocks in PyTorch, written from their published
definitions (Hugging Face transformers' modeling_llama.py and
modeling_rope_utils.py, the Llama 3 paper): the reference meshlm's Llama ops
and model are checked against (check_llama.py). Independent of meshlm's code.

  rms_norm(x, w, eps)             x / sqrt(mean(x^2) + eps) * w, in x's dtype
  rope_inv_freq(hs, theta, s)     the rotation frequencies, float32, with the
                                  "llama3" rope scaling s (a dict) or none
  rope_cos_sin(inv_freq, T)       cos, sin (T, hs) of t * inv_freq (float32
                                  angles), each frequency twice (rotate-half)
  apply_rope(x, cos, sin)         x (..., T, heads, hs): x cos + rotate_half(x) sin
  repeat_kv(x, group)             (..., heads, hs) -> (..., heads * group, hs),
                                  each key/value head beside its group's queries
  swiglu(gate, up)                silu(gate) * up
  causal_attention(q, k, v)       softmax(q k^T / sqrt(hs), causal) v per head
  Llama(cfg, params).loss(t, y)   the whole model's mean cross-entropy (.logits(t): its
                                  logits (B, T, V), check_generate.py's reference)
  LlamaModule(...)                the same as trainable torch.nn modules (the
                                  CPU benchmark's peer, tests/bench/torch_step.py)
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


def causal_attention(q, k, v):
    """q, k, v: (B, T, heads, hs) -> (B, T, heads * hs), softmax in q's dtype."""
    B, T, H, hs = q.shape
    q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # (B, H, T, hs)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, H * hs)


class Llama:
    """A Llama-family model on the tensors `p` (meshlm's names: Hugging
    Face's without "model."; embed_tokens and lm_head may have padded rows,
    of which the first `vocab_size` are used). `cfg`: n_layer, n_head,
    n_kv_head, n_embd, vocab_size, rms_norm_eps, rope_theta, rope_scaling (a
    dict or None), tie_word_embeddings. `variant` makes it wrong on purpose
    (the checkers' self-tests): "round_robin" shares key heads round-robin,
    "no_scaling" drops the rope scaling."""

    def __init__(self, cfg, p, variant=None):
        self.cfg, self.p, self.variant = cfg, p, variant

    def logits(self, tokens):
        """(B, T, V): the classifier's logits over the real vocabulary."""
        c, p = self.cfg, self.p
        V, C, NH, NKV = c["vocab_size"], c["n_embd"], c["n_head"], c["n_kv_head"]
        hs, group = C // NH, NH // NKV
        B, T = tokens.shape
        scaling = None if self.variant == "no_scaling" else c.get("rope_scaling")
        inv = rope_inv_freq(hs, c["rope_theta"], scaling)
        cos, sin = rope_cos_sin(inv, T, dtype=p["embed_tokens.weight"].dtype)
        x = p["embed_tokens.weight"][:V][tokens]
        eps = c["rms_norm_eps"]
        for i in range(c["n_layer"]):
            w = lambda n: p[f"layers.{i}.{n}.weight"]  # noqa: E731
            h = rms_norm(x, w("input_layernorm"), eps)
            q = (h @ w("self_attn.q_proj").T).reshape(B, T, NH, hs)
            k = (h @ w("self_attn.k_proj").T).reshape(B, T, NKV, hs)
            v = (h @ w("self_attn.v_proj").T).reshape(B, T, NKV, hs)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if self.variant == "round_robin":
                k, v = k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1)
            else:
                k, v = repeat_kv(k, group), repeat_kv(v, group)
            x = x + causal_attention(q, k, v) @ w("self_attn.o_proj").T
            h = rms_norm(x, w("post_attention_layernorm"), eps)
            x = x + swiglu(h @ w("mlp.gate_proj").T, h @ w("mlp.up_proj").T) @ w("mlp.down_proj").T
        x = rms_norm(x, p["norm.weight"], eps)
        cls = p["embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"][:V]
        return x @ cls.T

    def loss(self, tokens, targets):
        V = self.cfg["vocab_size"]
        return F.cross_entropy(self.logits(tokens).reshape(-1, V), targets.reshape(-1))


class LlamaModule(torch.nn.Module):
    """The same Llama as trainable torch.nn modules, for the CPU benchmark's
    peer (tests/bench/torch_step.py --llama): nn.Linear layers without
    biases, the rotary tables precomputed for T positions, grouped-query heads
    repeated for a batched matmul attention, token embeddings of Vp rows
    (meshlm's padding) of which the classifier uses the V real ones."""

    def __init__(self, L, NH, NKV, C, F, V, Vp, T, theta=500000.0, tied=False, eps=1e-5, seed=0):
        super().__init__()
        nn = torch.nn
        self.NH, self.NKV, self.hs, self.V, self.eps, self.tied = NH, NKV, C // NH, V, eps, tied
        g = torch.Generator().manual_seed(seed)

        def lin(o, i):
            m = nn.Linear(i, o, bias=False)
            with torch.no_grad():
                m.weight.normal_(0.0, 0.02, generator=g)
            return m

        self.embed = nn.Embedding(Vp, C)
        with torch.no_grad():
            self.embed.weight.normal_(0.0, 0.02, generator=g)
        kv = NKV * self.hs
        self.blocks = nn.ModuleList()
        for _ in range(L):
            b = nn.Module()
            b.ln1, b.ln2 = nn.Parameter(torch.ones(C)), nn.Parameter(torch.ones(C))
            b.q, b.k, b.v, b.o = lin(C, C), lin(kv, C), lin(kv, C), lin(C, C)
            b.gate, b.up, b.down = lin(F, C), lin(F, C), lin(C, F)
            self.blocks.append(b)
        self.norm = nn.Parameter(torch.ones(C))
        self.lm_head = None if tied else lin(Vp, C)
        cos, sin = rope_cos_sin(rope_inv_freq(self.hs, theta), T, dtype=torch.float32)
        self.register_buffer("cos", cos[:, None, :])
        self.register_buffer("sin", sin[:, None, :])
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1))

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def forward(self, tokens, targets):
        B, T = tokens.shape
        NH, NKV, hs = self.NH, self.NKV, self.hs
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(tokens)
        for b in self.blocks:
            h = self.rms(x, b.ln1)
            q = apply_rope(b.q(h).view(B, T, NH, hs), cos[:, 0], sin[:, 0])
            k = apply_rope(b.k(h).view(B, T, NKV, hs), cos[:, 0], sin[:, 0])
            v = b.v(h).view(B, T, NKV, hs)
            k, v = repeat_kv(k, NH // NKV), repeat_kv(v, NH // NKV)
            q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # (B, NH, T, hs)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hs) + self.mask[:T, :T], dim=-1)
            x = x + b.o((att @ v).transpose(1, 2).reshape(B, T, NH * hs))
            h = self.rms(x, b.ln2)
            x = x + b.down(F.silu(b.gate(h)) * b.up(h))
        x = self.rms(x, self.norm)
        w = self.embed.weight if self.tied else self.lm_head.weight
        logits = F.linear(x, w[: self.V])
        return logits, F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
