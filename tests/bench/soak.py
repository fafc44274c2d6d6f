#!/usr/bin/env python3
"""A long run of the tiny model, watched from outside: 10,000 steps on 4
ranks (dp 2 x pp 2, ZeRO 1) with a checkpoint every 500 steps, every
checkpoint kept. Every second each rank's resident memory (VmRSS) and open
file descriptors are read from /proc; at the end:

  * resident memory after warm-up (the first tenth of the steps) stays
    within 1% of its level at the end of warm-up, rank by rank: the median
    of each tenth of the rest of the run against the first's (a sample
    that falls into a checkpoint's write sees its buffers for a moment:
    the largest sample is shown beside, not counted);
  * the descriptors a rank has open do not grow;
  * no temporary file is left: none in the output and checkpoint
    directories (meshlm's *.tmp.* names), no new file in /dev/shm, and no
    new name in /tmp of meshlm's or Open MPI's (other programs' files
    there are listed, not counted);
  * every checkpoint verifies, with `meshlm ckpt verify` and independently
    with h5py + xxhash (tests/checkpoint/verify_dir.py);
  * the run's losses are finite and run.h5 holds every logged step.

Prints a Markdown table and exits 1 if a check fails.

  tests/bench/soak.py BUILD SCRATCH [--steps 10000] [--every 500] [--ranks 4]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rank_pids(out):
    """pid -> world rank of the processes training into `out` (Open MPI's)."""
    found = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmd = open(d + "/cmdline", "rb").read().split(b"\0")
            if f"--output.dir={out}".encode() not in cmd:
                continue
            env = open(d + "/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                found[int(d[6:])] = int(e.split(b"=")[1])
    return found


def sample(pid):
    """(VmRSS bytes, open descriptors) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None


def names(d):
    try:
        return set(os.listdir(d))
    except OSError:
        return set()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("scratch")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--ranks", type=int, default=4)
    a = ap.parse_args()
    meshlm = os.path.join(a.build, "meshlm")
    os.makedirs(a.scratch, exist_ok=True)
    out = os.path.abspath(os.path.join(a.scratch, "soak"))
    tokens = os.path.join(a.scratch, "tokens.h5")
    if not os.path.exists(tokens):
        subprocess.run([meshlm, "tokenize", "/usr/share/common-licenses/GPL-3", tokens], check=True,
                       stdout=subprocess.DEVNULL)
    tmp_before, shm_before = names("/tmp"), names("/dev/shm")
    cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(a.ranks),
           meshlm, "train", os.path.join(ROOT, "inputs/tiny.cfg"), f"--data.path={tokens}",
           f"--output.dir={out}", "--output.overwrite=true", f"--train.steps={a.steps}",
           "--train.log_every=100", f"--checkpoint.every={a.every}", "--checkpoint.keep_last=0",
           "--parallel.dp=2", "--parallel.pp=2", "--parallel.zero_stage=1", "--runtime.threads=1"]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    log = open(os.path.join(a.scratch, "soak.log"), "w")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    series = {}  # rank -> [(seconds, step, rss, fds)]
    pids = {}
    while proc.poll() is None:
        if len(pids) < a.ranks:
            pids = rank_pids(out)
        step = 0
        try:
            with open(os.path.join(a.scratch, "soak.log")) as f:
                for line in f:
                    p = line.split()
                    if len(p) >= 6 and p[0].isdigit():
                        step = int(p[0])
        except OSError:
            pass
        for pid, r in pids.items():
            s = sample(pid)
            if s:
                series.setdefault(r, []).append((time.time() - t0, step, s[0], s[1]))
        time.sleep(1.0)
    seconds = time.time() - t0
    with open(os.path.join(a.scratch, "soak_series.json"), "w") as f:
        json.dump({str(r): s for r, s in series.items()}, f)  # (seconds, step, rss, fds) by rank
    failures = []
    if proc.returncode != 0:
        failures.append(f"the run exited {proc.returncode} (see {a.scratch}/soak.log)")

    warm = a.steps // 10
    print(f"| rank | RSS after warm-up (median of the first tenth after step {warm}) | at the end (the last "
          f"tenth's) | most apart of the tenths | largest sample | descriptors (start, end, most) | samples |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(series):
        s = series[r]
        after = [x for x in s if x[1] >= warm]
        if len(after) < 20:
            failures.append(f"rank {r}: only {len(after)} samples after warm-up")
            continue
        tenths = [float(np.median([x[2] for x in part])) for part in np.array_split(np.array(after), 10)]
        base = tenths[0]
        spread = max(abs(t - base) for t in tenths) / base
        top = max(x[2] for x in after)
        fds = [x[3] for x in after]
        print(f"| {r} | {base / 2**20:.2f} MiB | {tenths[-1] / 2**20:.2f} MiB | {100 * spread:.2f}% | "
              f"{top / 2**20:.2f} MiB | {fds[0]}, {fds[-1]}, {max(fds)} | {len(s)} |")
        if spread > 0.01:
            failures.append(f"rank {r}: resident memory moved {100 * spread:.2f}% after warm-up")
        if fds[-1] > fds[0]:
            failures.append(f"rank {r}: open descriptors grew from {fds[0]} to {fds[-1]}")
    if len(series) != a.ranks:
        failures.append(f"watched {len(series)} ranks, not {a.ranks}")

    ck = os.path.join(out, "checkpoints")
    left = [n for d in (out, ck) for n in names(d) if ".tmp." in n]
    if left:
        failures.append(f"temporary files left in {out}: {left}")
    shm_new = sorted(names("/dev/shm") - shm_before)
    tmp_new = sorted(names("/tmp") - tmp_before)
    ours = [n for n in tmp_new if "meshlm" in n or n.startswith("ompi")]
    if shm_new or ours:
        failures.append(f"files left in /dev/shm: {shm_new[:10]}, in /tmp: {ours[:10]}")
    others = [n for n in tmp_new if n not in ours]
    files = sorted(glob.glob(os.path.join(ck, "step_*.h5")))
    want = a.steps // a.every
    if len(files) != want:
        failures.append(f"{len(files)} checkpoints, not {want}")
    for f in files:
        v = subprocess.run(["mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", "2", meshlm, "ckpt",
                            "verify", f], capture_output=True, text=True)
        if v.returncode != 0:
            failures.append(f"meshlm ckpt verify {f}: {v.stdout[-300:]} {v.stderr[-300:]}")
    steps = ",".join(str(s) for s in range(a.every, a.steps + 1, a.every))
    v = subprocess.run([sys.executable, os.path.join(ROOT, "tests/checkpoint/verify_dir.py"), ck,
                        "--latest", str(a.steps), "--steps", steps], capture_output=True, text=True)
    if v.returncode != 0:
        failures.append(f"verify_dir.py: {v.stdout[-300:]} {v.stderr[-300:]}")
    with h5py.File(os.path.join(out, "run.h5"), "r") as f:
        st, loss = f["metrics/step"][:], f["metrics/loss"][:]
    if len(st) == 0 or st[-1] != a.steps or not np.all(np.isfinite(loss)):
        failures.append(f"run.h5: last step {st[-1] if len(st) else None}, finite losses "
                        f"{bool(np.all(np.isfinite(loss)))}")
    print()
    print(f"{a.steps} steps on {a.ranks} ranks in {seconds:.0f} s; {len(files)} checkpoints, each verified "
          f"by meshlm ckpt verify and by h5py + xxhash; loss {loss[0]:.3f} at step {st[0]}, "
          f"{loss[-1]:.3f} at step {st[-1]}")
    if others:
        print(f"(new in /tmp during the run, of other programs: {others[:10]})")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok: memory flat within 1% after warm-up, no descriptor or temporary file leaked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
