#!/usr/bin/python3
"""meshlm generate's speed against a PyTorch peer on the same weights, prompt
and machine (docs/PERFORMANCE.md, "Generating text").

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tests/bench/generate_bench.py \
        --meshlm build/meshlm [--threads 2] [--prompt 200] [--new 128] [--repeats 3] \
        [--backend cpu|cuda]

The model: GPT-2 124M's shape (L 12, C 768, 12 heads, V 50257, 1024
positions) with random weights, written once by make_gpt2_safetensors.py.
Both sides run one sequence, fp32, greedy: the prompt's forward (prefill),
then one token at a time against a key/value cache (decode), the next id
the argmax of the last position's logits.

  * meshlm: `meshlm generate FILE --prompt-ids ... --temperature 0 --print
    ids --threads N` under `mpiexec -n 1 --bind-to none`; its stderr line
    gives the prefill's and the decode's tokens/s (on a GPU after a warm-up
    forward of the prompt's first ids, as the peer's below).
  * PyTorch (torch.nn.functional on the same tensors, in inference mode,
    torch.set_num_threads(N), tcmalloc preloaded and OMP_WAIT_POLICY=PASSIVE
    as PyTorch's CPU tuning guide says): the prefill as one causal forward
    over the prompt keeping each layer's keys and values, then each token
    one row against them (torch.cat onto the cache), the argmax on the
    host: the same work as meshlm's loop.

With --backend cuda both run on the GPU: meshlm generate --backend cuda
(fp32, TF32 off) and the same PyTorch loop on CUDA tensors with TF32 off
(torch.cuda.synchronize() before each clock reading), and a second peer row
under bf16 autocast, PyTorch's own fast path for inference (its ids are
not compared: bf16 parts them from fp32's).

Each side runs --repeats times, alternating, and the best of each is kept.
The ids of the two are compared (an fp32 near-tie may part them; the
count of equal leading ids is printed). One JSON line, then a table.
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
L, C, NH, V, T = 12, 768, 12, 50257, 1024
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def read_safetensors(path):
    """name -> float32 array of an F32 safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        body = f.read()
    out = {}
    for k, e in header.items():
        b, end = e["data_offsets"]
        out[k] = np.frombuffer(body[b:end], "<f4").reshape(e["shape"])
    return out


def torch_peer(path, prompt, new, threads, device="cpu", bf16=False):
    """(ids, prefill_s, decode_s) of the PyTorch loop; run in its own process."""
    import contextlib
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    w = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device)
         for k, v in read_safetensors(path).items()}
    # GPT-2's Conv1D weights are stored (in, out): transposed once for F.linear.
    for k in list(w):
        if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            w[k] = w[k].t().contiguous()
    HS = C // NH
    scale = 1.0 / math.sqrt(HS)

    def block(i, x, cache, pos):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], 1e-5)
        q, k, v = F.linear(a, w[h + "attn.c_attn.weight"], w[h + "attn.c_attn.bias"]).split(C, -1)
        n = x.shape[0]
        q, k, v = (t.view(n, NH, HS).transpose(0, 1) for t in (q, k, v))  # (NH, n, HS)
        if cache[i] is not None:
            k = torch.cat([cache[i][0], k], 1)
            v = torch.cat([cache[i][1], v], 1)
        cache[i] = (k, v)
        s = torch.matmul(q, k.transpose(1, 2)) * scale  # (NH, n, pos + n)
        if n > 1:
            mask = torch.ones(n, pos + n, dtype=torch.bool, device=device).tril(pos)
            s = s.masked_fill(~mask, float("-inf"))
        y = torch.matmul(torch.softmax(s, -1), v).transpose(0, 1).reshape(n, C)
        x = x + F.linear(y, w[h + "attn.c_proj.weight"], w[h + "attn.c_proj.bias"])
        a = F.layer_norm(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], 1e-5)
        m = F.gelu(F.linear(a, w[h + "mlp.c_fc.weight"], w[h + "mlp.c_fc.bias"]), approximate="tanh")
        return x + F.linear(m, w[h + "mlp.c_proj.weight"], w[h + "mlp.c_proj.bias"])

    def forward(ids, cache, pos):
        x = w["wte.weight"][ids] + w["wpe.weight"][pos:pos + len(ids)]
        for i in range(L):
            x = block(i, x, cache, pos)
        x = F.layer_norm(x[-1:], (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
        return F.linear(x, w["wte.weight"])[0]

    def clock():
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16) if bf16
                else contextlib.nullcontext())
    with torch.inference_mode(), autocast:
        if device == "cuda":  # the first kernels' start-up outside the clock
            forward(torch.tensor(prompt[:8], device=device), [None] * L, 0)
        cache = [None] * L
        t0 = clock()
        logits = forward(torch.tensor(prompt, device=device), cache, 0)
        prefill = clock() - t0
        t0 = clock()
        ids, pos = [], len(prompt)
        for i in range(new):
            nxt = int(torch.argmax(logits))  # on the host, as meshlm's sampler
            ids.append(nxt)
            if i + 1 == new:
                break
            logits = forward(torch.tensor([nxt], device=device), cache, pos)
            pos += 1
        decode = clock() - t0
    return ids, prefill, decode


def run_meshlm(exe, path, prompt, new, threads, env, backend):
    cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", "1", exe,
           "generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--temperature", "0",
           "--max-new-tokens", str(new), "--print", "ids", "--threads", str(threads),
           "--backend", backend]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        sys.exit(f"meshlm generate failed:\n{p.stderr[-2000:]}")
    m = re.search(r"prefill (\d+) tokens in ([\d.]+) s .* decode (\d+) tokens in ([\d.]+) s", p.stderr)
    ids = [int(x) for x in p.stdout.strip().split(",")]
    return ids, float(m.group(2)), float(m.group(4)), int(m.group(3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--peer", help=argparse.SUPPRESS)  # internal: run the peer, print JSON
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    prompt = [int(i * 7919 % V) for i in range(a.prompt)]
    if a.peer:
        ids, p, d = torch_peer(a.peer, prompt, a.new, a.threads, a.backend, a.bf16)
        print(json.dumps({"ids": ids, "prefill_s": p, "decode_s": d}))
        return 0
    have_tcmalloc = os.path.exists(TCMALLOC)
    if a.backend == "cpu" and not have_tcmalloc:
        sys.exit(f"{TCMALLOC} is missing: apt-get install libtcmalloc-minimal4 (the peer runs with it)")
    d = tempfile.mkdtemp(prefix="meshlm-generate-bench-")
    path = os.path.join(d, "gpt2-124m.safetensors")
    subprocess.run([sys.executable, os.path.join(HERE, "make_gpt2_safetensors.py"), "--n_layer", str(L),
                    "--n_embd", str(C), "--n_head", str(NH), "--vocab_size", str(V), "--max_seq_len",
                    str(T), "--out", path], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    peer_env = dict(env, LD_PRELOAD=TCMALLOC) if have_tcmalloc else env
    peers = ["pytorch"] + (["pytorch-bf16"] if a.backend == "cuda" else [])
    best = {k: [math.inf, math.inf] for k in ["meshlm"] + peers}
    ids = {}
    for _ in range(a.repeats):
        mi, mp, md, mn = run_meshlm(os.path.abspath(a.meshlm), path, prompt, a.new, a.threads, env,
                                    a.backend)
        ids["meshlm"] = mi
        best["meshlm"] = [min(best["meshlm"][0], mp), min(best["meshlm"][1], md)]
        for peer in peers:
            cmd = [sys.executable, __file__, "--meshlm", a.meshlm, "--threads", str(a.threads),
                   "--prompt", str(a.prompt), "--new", str(a.new), "--backend", a.backend,
                   "--peer", path] + (["--bf16"] if peer.endswith("bf16") else [])
            r = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=peer_env,
                                          check=True).stdout)
            ids[peer] = r["ids"]
            best[peer] = [min(best[peer][0], r["prefill_s"]), min(best[peer][1], r["decode_s"])]
    os.remove(path)
    os.rmdir(d)
    same = 0
    for x, y in zip(ids["meshlm"], ids["pytorch"]):
        if x != y:
            break
        same += 1
    # meshlm's decode time runs from the prefill's end to the last token: new
    # - 1 forwards and new draws, as the peer's loop.
    rate = {k: (a.prompt / v[0], a.new / v[1]) for k, v in best.items()}
    row = {"bench": "generate", "model": "gpt2-124m-shape", "backend": a.backend,
           "threads": a.threads, "prompt": a.prompt, "new": a.new, "same_leading_ids": same}
    for k, (p, dd) in rate.items():
        row[f"{k}_prefill_tok_s"], row[f"{k}_decode_tok_s"] = round(p, 1), round(dd, 2)
    print(json.dumps(row))
    print(f"{'':12} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for k in rate:
        print(f"{k:12} {rate[k][0]:14.1f} {rate[k][1]:13.2f}")
    for k in peers:
        print(f"{'ratio to ' + k:12} {rate['meshlm'][0] / rate[k][0]:14.2f} "
              f"{rate['meshlm'][1] / rate[k][1]:13.2f}")
    print(f"greedy ids (meshlm, pytorch fp32): the first {same} of {a.new} equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
