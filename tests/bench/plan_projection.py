#!/usr/bin/env python3
"""On paper: meshlm plan's cost model for GPT-2 1.5B and Llama 3 8B, full
training, on 8, 64 and 512 GPUs of 80 GiB (8 per node, NVLink within a
node, InfiniBand between nodes), the data-parallel reduction overlapped with
the backward and not. For each model and size the planner's fastest fitting
layout, its step by term, the communication left exposed with and without
the overlap, and the MFU that follows (training FLOPs of
docs/PERFORMANCE.md's Definitions over the GPUs' dense bf16 peak). Weak
scaling, as Megatron-LM's published MFU: the global batch grows with the
GPUs, --tokens-per-gpu tokens per GPU per step (16384: 16 sequences of GPT-2's
1024, 4 of Llama's 4096). "Without overlap" is the same layout with its
hidden DP time added to the step.

The GEMM rate per GPU is set so that the planner's one-GPU step of GPT-2
1.5B at B = 8 x 1024 equals a measured one (--anchor-ms: meshlm's 250.8 ms
on one H200, docs/PERFORMANCE.md, 2026-11-27; give PyTorch's 196.2 ms to see
a step at its speed): the projection scales a measured GPU step, it does not
assume a rate. Pure arithmetic, no GPU and no MPI: it runs `meshlm plan
--json` only.

  tests/bench/plan_projection.py BUILD [--anchor-ms 250.8] [--intra-gbps 450]
      [--inter-gbps 50] [--tokens-per-gpu 16384] [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEAK = 989.4e12  # H100 / H200 dense bf16 FLOP/s

# bf16 with flash attention, as the GPU benchmark runs meshlm.
STEP = ["--train.precision=bf16", "--train.attention=flash"]
GPT2_15B = ["inputs/gpt2-124m.cfg", "--model.n_layer=48", "--model.n_head=25",
            "--model.n_embd=1600", "--model.seq_len=1024", *STEP]
LLAMA3_8B = ["inputs/llama3-8b.cfg", "--finetune.mode=full", "--model.seq_len=4096", *STEP]
MODELS = {
    # (parameter file and overrides, L, C, V, T, block's linear weights per token)
    "GPT-2 1.5B": (GPT2_15B, 48, 1600, 50257, 1024, 12 * 1600 ** 2),
    "Llama 3 8B": (LLAMA3_8B, 32, 4096, 128256, 4096,
                   2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336),
}


def train_flops(model, sequences):
    """Training FLOPs of `sequences` sequences (docs/PERFORMANCE.md)."""
    _, L, C, V, T, block = MODELS[model]
    return 3.0 * sequences * T * (2 * (L * block + V * C) + 4 * L * T * C)


def plan(build, args, ranks, extra, top=1):
    cmd = [os.path.join(build, "meshlm"), "plan", *args, "--ranks", str(ranks),
           "--ranks-per-node", str(min(ranks, 8)), "--backend", "cuda", "--mem-per-rank", "80GiB",
           "--top", str(top), "--json", "--data.path=/nonexistent/tokens.h5", *extra]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--anchor-ms", type=float, default=250.8)
    ap.add_argument("--intra-gbps", type=float, default=450)
    ap.add_argument("--inter-gbps", type=float, default=50)
    ap.add_argument("--tokens-per-gpu", type=int, default=16384)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()

    links = [f"--cluster.intra_node_gbps={a.intra_gbps}", f"--cluster.inter_node_gbps={a.inter_gbps}",
             "--cluster.preset=h100-ib"]
    # The anchor: one GPU, GPT-2 1.5B, B = 8, one micro-batch, at a known rate.
    probe_rate = 100e3
    one = plan(a.build, GPT2_15B, 1, links + [
        f"--cluster.gflops_per_rank={probe_rate}", "--train.batch_size=8", "--train.micro_batch_size=8",
        "--parallel.layout=manual", "--parallel.micro_batches=1"])
    configured = one["configured"]
    # On the GPU preset every op is at the GEMM rate: the step scales as 1 / rate.
    rate = probe_rate * configured["step_seconds"] / (a.anchor_ms / 1000)
    print(f"# GEMM rate per GPU {rate / 1e3:.1f} TFLOP/s: the planner's one-GPU step of GPT-2 1.5B "
          f"at B = 8 x 1024 is then {a.anchor_ms} ms; links {a.intra_gbps} / {a.inter_gbps} GB/s "
          f"within / between nodes", flush=True)

    rows = []
    for model, (args, *_rest) in MODELS.items():
        for gpus in (8, 64, 512):
            sequences = a.tokens_per_gpu * gpus // MODELS[model][4]
            j = plan(a.build, args, gpus, links + [f"--cluster.gflops_per_rank={rate}",
                                                   f"--train.batch_size={sequences}"])
            if not j["fits"]:
                print(f"# {model} on {gpus} GPUs: no layout fits", flush=True)
                continue
            best = j["fits"][0]
            c = best["cost"]
            step = best["step_seconds"]
            sequences = best["micro_batch_size"] * best["micro_batches"] * best["dp"]
            flops = train_flops(model, sequences)
            exposed = c["tp"] + c["pp"] + c["dp"]
            row = {"model": model, "gpus": gpus, "layout": layout_text(best), "step_s": step,
                   "compute_s": c["compute"], "pipeline_s": c["pipeline"], "tp_s": c["tp"],
                   "pp_s": c["pp"], "dp_exposed_s": c["dp"], "dp_hidden_s": c["dp_hidden"],
                   "comm_exposed_s": exposed, "comm_exposed_no_overlap_s": exposed + c["dp_hidden"],
                   "mfu": flops / (step * gpus * PEAK),
                   "mfu_no_overlap": flops / ((step + c["dp_hidden"]) * gpus * PEAK),
                   "tokens": sequences * MODELS[model][4]}
            rows.append(row)
            print(f"# {model} on {gpus}: {row['layout']}, step {step:.3f} s, exposed comm "
                  f"{exposed:.3f} s ({exposed + c['dp_hidden']:.3f} without overlap), MFU "
                  f"{100 * row['mfu']:.1f}% ({100 * row['mfu_no_overlap']:.1f}%)", flush=True)

    print()
    print("| model | GPUs | layout (fastest that fits) | step s | compute | bubble | tp | pp "
          "| dp exposed | dp hidden | exposed comm, overlap / none | MFU, overlap / none |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['gpus']} | {r['layout']} | {r['step_s']:.3f} | {r['compute_s']:.3f} "
              f"| {r['pipeline_s']:.3f} | {r['tp_s']:.3f} | {r['pp_s']:.3f} | {r['dp_exposed_s']:.3f} "
              f"| {r['dp_hidden_s']:.3f} | {r['comm_exposed_s']:.3f} / {r['comm_exposed_no_overlap_s']:.3f} "
              f"| {100 * r['mfu']:.1f}% / {100 * r['mfu_no_overlap']:.1f}% |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"anchor_ms": a.anchor_ms, "gemm_tflops_per_gpu": rate / 1e3,
                       "tokens_per_gpu": a.tokens_per_gpu,
                       "intra_gbps": a.intra_gbps, "inter_gbps": a.inter_gbps, "rows": rows}, f, indent=1)
    return 0


def layout_text(L):
    t = f"dp{L['dp']} tp{L['tp']} pp{L['pp']} zero{L['zero_stage']} B{L['micro_batch_size']}x{L['micro_batches']}"
    if L["activation_checkpointing"] != "none":
        t += " ckpt"
    if L["pp"] > 1:
        t += " " + L["schedule"]
    return t


if __name__ == "__main__":
    sys.exit(main())
