#!/usr/bin/python3
"""PyTorch CPU peer of meshlm's training-step benchmark.

Usage:
  torch_step.py --n_layer L --n_head NH --n_embd C --vocab_size V --seq_len T
                --batch B --threads N [--steps 10] [--warmup 3] [--seed 0]
                [--llama 1 --n_kv_head K --intermediate_size F [--tied 1]]
                [--ranks R]

--ranks R trains data-parallel on R processes of this machine, as PyTorch's
DistributedDataParallel tutorial sets it up: torch.multiprocessing.spawn,
the gloo backend (the CPU's), the model wrapped in DDP (gradients averaged
in buckets during the backward), each rank B / R sequences of the batch and
N threads; the JSON line is rank 0's, the step timed there (DDP's
all-reduce keeps the ranks in step).

--llama 1 builds tests/torch/llama_torch.py's LlamaModule instead (RMSNorm,
rotary embeddings, K key/value heads, SwiGLU of width F; its FLOPs count a
block's linear weights 2 C^2 + 2 C (K C / NH) + 3 C F for 12 C^2).

Builds the GPT-2 of tests/torch/gpt2_torch.py in float32 (wte padded to a
multiple of 64 rows like meshlm's; logits over the V real rows), AdamW
(lr 3e-4, weight decay 0.1 on matrices only, betas (0.9, 0.95)), random
tokens, and times whole training steps after `warmup` untimed ones:
zero_grad(set_to_none) + forward + backward + clip_grad_norm_(1.0) +
optimizer.step(). Prints one JSON line:

  {"impl": "pytorch", "torch": ..., "allocator": ..., "threads": N, "n_layer": ..., "n_head": ...,
   "n_embd": ..., "vocab_size": ..., "seq_len": ..., "batch": ...,
   "ms_per_step": median ms, "tokens_per_s": B*T / median s,
   "gflops": train FLOPs per step / median s / 1e9}

Training FLOPs per step (meshlm's benchmark uses the same formula):
  tokens            = B * T
  forward per token = 2 * (L * 12 * C^2 + V * C) + 4 * L * T * C
      weight matmuls: qkv 3C^2 + attn proj C^2 + fc 4C^2 + fc proj 4C^2
      = 12C^2 per layer, plus the lm_head V*C (2 FLOPs per multiply-add);
      attention scores q k^T and the weighted sum att v: 2*T*C each per layer
      per token, counted on the full T x T (no causal halving)
  train per step    = 3 * forward per token * tokens   (backward = 2x forward)

The driver (compare.py) sets OMP_NUM_THREADS=N and OMP_WAIT_POLICY=PASSIVE,
and preloads tcmalloc (LD_PRELOAD); a warning goes to stderr when
OMP_WAIT_POLICY is not set. The JSON line also says which allocator this
process has ("allocator": the tcmalloc library mapped into it, as
/proc/self/maps shows, else "glibc"), so that the driver can check that the
preload took effect.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from gpt2_torch import GPT2, GPT2Config, padded_vocab  # noqa: E402
from llama_torch import LlamaModule  # noqa: E402


def train_flops_per_step(L, C, V, T, B, block=None):
    """`block`: a block's linear weights' elements (12 C^2 for GPT-2)."""
    block = 12 * C * C if block is None else block
    fwd_per_token = 2 * (L * block + V * C) + 4 * L * T * C
    return 3 * fwd_per_token * B * T


def allocator():
    """The file name of the tcmalloc library mapped into this process (an
    LD_PRELOAD that took effect), "glibc" when there is none, "unknown"
    without /proc."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libtcmalloc" in os.path.basename(path):
                    return os.path.basename(path)
    except OSError:
        return "unknown"
    return "glibc"


def main():
    ap = argparse.ArgumentParser(description="PyTorch CPU GPT-2 training-step benchmark")
    ap.add_argument("--n_layer", type=int, required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--n_embd", type=int, required=True)
    ap.add_argument("--vocab_size", type=int, required=True)
    ap.add_argument("--seq_len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama", type=int, default=0, help="1: a Llama (llama_torch.LlamaModule)")
    ap.add_argument("--n_kv_head", type=int, default=0)
    ap.add_argument("--intermediate_size", type=int, default=0)
    ap.add_argument("--tied", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=1)
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    if args.ranks < 1 or args.batch % args.ranks != 0:
        ap.error(f"--ranks {args.ranks} must divide --batch {args.batch}")
    if args.ranks > 1:
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(run, args=(args, port), nprocs=args.ranks, join=True)
    else:
        run(0, args, None)


def run(rank, args, port):
    ddp = args.ranks > 1
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.ranks)

    if "OMP_WAIT_POLICY" not in os.environ:
        print("torch_step.py: warning: OMP_WAIT_POLICY is not set (the benchmark driver sets "
              "OMP_WAIT_POLICY=PASSIVE)", file=sys.stderr)
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp is not None and omp != str(args.threads):
        print(f"torch_step.py: warning: OMP_NUM_THREADS={omp} but --threads {args.threads}",
              file=sys.stderr)

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)  # no inter-op parallelism in a single training step
    except RuntimeError:
        pass
    torch.set_grad_enabled(True)
    torch.autograd.set_detect_anomaly(False)
    if torch.backends.mkldnn.is_available():
        torch.backends.mkldnn.enabled = True

    L, NH, C, V, T, B = args.n_layer, args.n_head, args.n_embd, args.vocab_size, args.seq_len, args.batch
    torch.manual_seed(args.seed)
    block = None
    if args.llama:
        NKV, Fw = args.n_kv_head, args.intermediate_size
        model = LlamaModule(L, NH, NKV, C, Fw, V, padded_vocab(V), T, tied=bool(args.tied),
                            seed=args.seed).float().train()
        block = 2 * C * C + 2 * C * (NKV * C // NH) + 3 * C * Fw
    else:
        cfg = GPT2Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V,
                         padded_vocab_size=padded_vocab(V), max_seq_len=T)
        model = GPT2(cfg).init_weights(seed=args.seed).float().train()

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {}
    try:
        kw["foreach"] = True
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **kw)
    except TypeError:
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)

    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.long)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.long)
    params = list(model.parameters())
    net = model
    if ddp:  # this rank's share of the batch; gradients averaged over the ranks
        rows = slice(rank * B // args.ranks, (rank + 1) * B // args.ranks)
        tokens, targets = tokens[rows].contiguous(), targets[rows].contiguous()
        # The buffers are constant masks and tables, the same on every rank;
        # gloo cannot broadcast the causal mask's bool.
        DDP = torch.nn.parallel.DistributedDataParallel
        DDP._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
        net = DDP(model, broadcast_buffers=False)

    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = net(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    if not torch.isfinite(loss):
        print(f"torch_step.py: warning: non-finite loss {loss.item()}", file=sys.stderr)

    if ddp:
        import torch.distributed as dist
        dist.destroy_process_group()
        if rank != 0:
            return
    med = statistics.median(times)
    result = {
        "impl": "pytorch", "torch": torch.__version__, "allocator": allocator(), "threads": args.threads,
        "ranks": args.ranks,
        "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V, "seq_len": T, "batch": B,
        "ms_per_step": med * 1e3,
        "tokens_per_s": B * T / med,
        "gflops": train_flops_per_step(L, C, V, T, B, block) / med / 1e9,
        "arch": "llama" if args.llama else "gpt2",
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
