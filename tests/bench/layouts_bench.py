#!/usr/bin/python3
"""Several ranks on one node: `meshlm train` as R data-parallel ranks of
one thread each against one rank of R threads, and the PyTorch peer the
same two ways (one process of R threads; DistributedDataParallel over R
processes of one thread), on the same model and global batch.

Usage:
  layouts_bench.py --meshlm build/meshlm [--ranks 2] [--configs small-b[,gpt2-124m,...]]
                   [--steps 6 --warmup 3] [--markdown] [--python /usr/bin/python3]
                   [--tcmalloc PATH] [--workdir DIR]

meshlm runs are `mpiexec -n R meshlm train CFG` with the config's model, its
global batch in one micro-batch per rank (train.batch_size = B,
train.micro_batch_size = B / R), byte-level tokens of the GPL-3 text
(data.tokenize_from, tokenized once into --workdir), no checkpoint, one log
line per step; the step time is the median of the logged ms/step after
`warmup` steps (meshlm's own clock around Engine::step, data loading
outside it). One rank of R threads runs with --bind-to none (its threads
placed by OpenMP); R ranks of one thread are bound one to a core, as
`srun --cpu-bind=cores` places them on a cluster.

The peer is tests/bench/torch_step.py at its best, as compare.py runs it:
tcmalloc preloaded, OMP_WAIT_POLICY=PASSIVE, and for R processes its
--ranks R (torch.multiprocessing.spawn, gloo, DDP). Prints one table:
config, layout, ms/step and tokens/s of each, and the ratio meshlm / torch
of each layout; with --markdown a markdown one for docs/PERFORMANCE.md.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import CONFIGS, find_tcmalloc  # noqa: E402

STEP_LINE = re.compile(r"^\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+([\d.]+)\s+(\d+)\s*$")


def mpiexec_flags(ranks, bind):
    flags = ["mpiexec", "-n", str(ranks), "--bind-to", bind]
    version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        if os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        flags.append("--oversubscribe")
    return flags


def write_cfg(path, c, workdir):
    if "llama" in c:
        raise SystemExit("layouts_bench.py: GPT-2 configs only")
    with open(path, "w") as f:
        f.write(f"""[model]
n_layer = {c['n_layer']}
n_head = {c['n_head']}
n_embd = {c['n_embd']}
vocab_size = {c['vocab_size']}
seq_len = {c['seq_len']}
max_seq_len = {c['seq_len']}

[train]
batch_size = {c['batch']}
lr = 3e-4
warmup_steps = 0
weight_decay = 0.1
grad_clip = 1.0
log_every = 1

[data]
path = {workdir}/gpl3.h5
tokenize_from = /usr/share/common-licenses/GPL-3

[output]
dir = {workdir}/out
overwrite = true

[checkpoint]
final = false
""")


def run_meshlm(meshlm, cfg, ranks, threads, steps, warmup):
    bind = "core" if threads == 1 else "none"
    cmd = mpiexec_flags(ranks, bind) + [
        meshlm, "train", cfg, f"--train.steps={warmup + steps}", f"--parallel.dp={ranks}",
        f"--runtime.threads={threads}", f"--train.micro_batch_size={0}"]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"layouts_bench.py: {' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    ms = {}
    for line in p.stdout.splitlines() + p.stderr.splitlines():
        m = STEP_LINE.match(line)
        if m:
            ms[int(m.group(1))] = float(m.group(5))
    timed = [ms[s] for s in sorted(ms) if s > warmup]
    if len(timed) < steps:
        raise SystemExit(f"layouts_bench.py: {len(timed)} step lines after warmup in:\n{p.stdout}")
    return statistics.median(timed)


def run_torch(python, tcmalloc, c, ranks, threads, steps, warmup):
    cmd = [python, os.path.join(HERE, "torch_step.py")]
    for k in ("n_layer", "n_head", "n_embd", "vocab_size", "seq_len", "batch"):
        cmd += [f"--{k}", str(c[k])]
    cmd += ["--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup),
            "--ranks", str(ranks)]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(threads),
               LD_PRELOAD=tcmalloc)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"layouts_bench.py: {' '.join(cmd)} failed:\n{p.stderr}")
    r = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    if "tcmalloc" not in r["allocator"]:
        raise SystemExit(f"layouts_bench.py: the peer runs on {r['allocator']}, not tcmalloc")
    return r["ms_per_step"], r["allocator"], r["torch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--configs", default="small-b")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--tcmalloc")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    tcmalloc = args.tcmalloc or find_tcmalloc()
    if not tcmalloc:
        raise SystemExit("layouts_bench.py: tcmalloc not found (Debian: apt-get install "
                         "libtcmalloc-minimal4); the peer runs with it preloaded")
    workdir = args.workdir or tempfile.mkdtemp(prefix="meshlm-layouts-")
    R = args.ranks
    rows = []
    for name in args.configs.split(","):
        c = CONFIGS[name]
        if c["batch"] % R:
            raise SystemExit(f"layouts_bench.py: --ranks {R} does not divide {name}'s batch")
        cfg = os.path.join(workdir, f"{name}.cfg")
        write_cfg(cfg, c, workdir)
        tokens = c["batch"] * c["seq_len"]
        for ranks, threads in ((1, R), (R, 1)):
            m = run_meshlm(os.path.abspath(args.meshlm), cfg, ranks, threads, args.steps,
                           args.warmup)
            t, alloc, version = run_torch(args.python, tcmalloc, c, ranks, threads, args.steps,
                                          args.warmup)
            rows.append((name, f"{ranks} x {threads}", m, 1e3 * tokens / m, t, 1e3 * tokens / t,
                         t / m))
            print(f"{name:10s} {ranks} rank(s) x {threads} thread(s): meshlm {m:9.1f} ms/step "
                  f"{1e3 * tokens / m:8.0f} tok/s | torch {t:9.1f} ms/step "
                  f"{1e3 * tokens / t:8.0f} tok/s | ratio {t / m:.2f}", flush=True)
    if args.markdown:
        print(f"\nDate: {datetime.date.today()}; torch {version}; the peer's allocator {alloc} "
              "(LD_PRELOAD), OMP_WAIT_POLICY=PASSIVE.\n")
        print("| config | ranks x threads | meshlm ms/step | meshlm tok/s | torch ms/step | "
              "torch tok/s | ratio |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.1f} | {r[5]:.0f} | "
                  f"{r[6]:.2f} |")


if __name__ == "__main__":
    main()
