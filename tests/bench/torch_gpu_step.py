#!/usr/bin/env python3
"""PyTorch GPU peer of meshlm's CUDA training-step benchmark.

Usage:
  torch_gpu_step.py --n_layer L --n_head NH --n_embd C [--vocab_size 50257] [--seq_len 1024]
                    [--batch B[,B...] | --batch auto] [--steps 20] [--warmup 5] [--no-compile]
                    [--peak-tflops 989.4] [--fp32] [--lora R]

GPT-2 (learned positions, pre-LayerNorm, tanh GELU, tied lm_head, vocabulary
padded to a multiple of 64 rows, logits over the V real rows) trained the way
PyTorch's own performance guides set it up on a GPU:

  - torch.autocast(dtype=torch.bfloat16) around forward and loss, fp32 master
    weights and AdamW moments;
  - F.scaled_dot_product_attention(is_causal=True) (flash attention);
  - torch.optim.AdamW(fused=True), clip_grad_norm_(1.0, foreach);
  - torch.compile of the model (unless --no-compile);
  - TF32 allowed for the fp32 matmuls that remain.

--fp32 trains in plain float32 instead (no autocast, TF32 off, no compile):
the same arithmetic as meshlm's fp32 CUDA backend, for a like-for-like
figure beside the bf16 one.

--lora R fine-tunes instead, as peft's own guides do on a GPU: the base in
bf16, frozen, with peft LoRA adapters of rank R (alpha 2R, fp32, peft's
default autocast of adapters) on every linear layer (c_attn, both c_proj,
c_fc), under bf16 autocast and torch.compile, AdamW(fused=True) over the
adapters: the peer of meshlm's LoRA rows (mode "lora-bf16").

A step is zero_grad(set_to_none) + forward + backward + clip + optimizer step;
steps are timed with CUDA events after `warmup` untimed ones (the first ones
include compilation), and the median is reported. `--batch auto` tries
64, 48, 32, 24, 16, 12, 8, 4, 2, 1 and keeps the largest that does not run
out of device memory; a comma-separated list is tried the same way, in its
order. Prints one JSON line per configuration:

  {"impl": "pytorch-gpu", "device": ..., "torch": ..., "n_layer": ..., "n_head": ...,
   "n_embd": ..., "vocab_size": ..., "seq_len": ..., "batch": ..., "mode": "full"|"lora-bf16",
   "compile": bool,
   "ms_per_step": ..., "tokens_per_s": ..., "tflops": ..., "mfu": ..., "peak_mem_gib": ...,
   "final_loss": ...}

Training FLOPs per step, the same formula as meshlm's benchmarks and
docs/PERFORMANCE.md: 3 * B * T * (2 * (12 L C^2 + V C) + 4 L T C).
MFU = achieved FLOP/s / the device's dense bf16 peak (--peak-tflops; the
H100 SXM's datasheet figure by default).
"""

import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def train_flops_per_step(L, C, V, T, B):
    return 3 * B * T * (2 * (12 * L * C * C + V * C) + 4 * L * T * C)


class Attention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = Attention(C, NH)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, T):
        super().__init__()
        self.V = V
        Vp = (V + 63) // 64 * 64
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln_" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                    p.normal_(0.0, std)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight[: self.V])
        return F.cross_entropy(logits.float().view(-1, self.V), targets.view(-1))


def run(args, B):
    L, NH, C, V, T = args.n_layer, args.n_head, args.n_embd, args.vocab_size, args.seq_len
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    model = GPT(L, NH, C, V, T).to(dev)
    if args.lora:
        from peft import LoraConfig, inject_adapter_in_model
        model = model.to(torch.bfloat16)
        cfg = LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0,
                         target_modules=["c_attn", "c_proj", "c_fc"])
        model = inject_adapter_in_model(cfg, model)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
            if "lora_" in name:
                p.data = p.data.float()
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.ndim >= 2]
    no_decay = [p for p in trained if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(args.seed + 1)
    tokens = torch.randint(0, V, (B, T), device=dev, generator=g)
    targets = torch.randint(0, V, (B, T), device=dev, generator=g)
    params = trained

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=not args.fp32):
            loss = fwd(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    med = statistics.median(times)
    flops = train_flops_per_step(L, C, V, T, B) / med
    return {
        "impl": "pytorch-gpu", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V, "seq_len": T, "batch": B,
        "mode": "lora-bf16" if args.lora else "full",
        "precision": "fp32" if args.fp32 else "bf16-autocast", "compile": args.compile, "ms_per_step": med * 1e3, "tokens_per_s": B * T / med,
        "tflops": flops / 1e12, "mfu": flops / (args.peak_tflops * 1e12),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "final_loss": loss.item(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n_layer", type=int, required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--n_embd", type=int, required=True)
    ap.add_argument("--vocab_size", type=int, default=50257)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--batch", default="auto")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--fp32", action="store_true")
    ap.add_argument("--lora", type=int, default=0)
    args = ap.parse_args()
    if args.fp32:
        args.compile = False
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_step.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = not args.fp32
    torch.backends.cudnn.allow_tf32 = not args.fp32
    if args.batch == "auto":
        batches = [64, 48, 32, 24, 16, 12, 8, 4, 2, 1]
    else:
        batches = [int(b) for b in args.batch.split(",")]
    for B in batches:
        try:
            result = run(args, B)
        except torch.OutOfMemoryError:
            print(f"torch_gpu_step.py: batch {B} does not fit", file=sys.stderr, flush=True)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            continue
        print(json.dumps(result), flush=True)
        return
    sys.exit("torch_gpu_step.py: not even batch 1 fits")


if __name__ == "__main__":
    main()
