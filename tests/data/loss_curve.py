#!/usr/bin/python3
"""A stored loss curve: meshlm's training losses, step by step, against the
curve kept in tests/data (regression data, with its tolerance and the
command that regenerates it).

Usage:
  loss_curve.py --meshlm PATH --mpiexec "MPIEXEC LINE" [--curve FILE] [OVERRIDES...]
  loss_curve.py --meshlm PATH --mpiexec "MPIEXEC LINE" [--curve FILE] --regenerate

FILE (default tests/data/tiny_losses.json) names the parameter file, the
stored per-step losses and the relative tolerance. The check runs, in a
scratch folder (nothing is written in the source tree),

  MPIEXEC LINE PATH train CONFIG --train.log_every=1
      --data.path=SCRATCH/tokens.h5 --output.dir=SCRATCH/out OVERRIDES...

(the token file is made from the text that CONFIG's data.tokenize_from
names), reads /metrics/step and /metrics/loss of SCRATCH/out/run.h5 with
h5py and requires the same steps and, at every step,
  |loss - stored| <= rel_tol * |stored|.
OVERRIDES are meshlm keys, e.g. a parallel layout (the MPIEXEC LINE must
then start as many ranks). Exit status 1 on any failure.

--regenerate runs the reference command (one rank, one thread, no
overrides) and rewrites FILE's command, steps and losses, keeping its
tolerance and its comment; it prints how far the new curve is from the old
one. Do this
only when a change is meant to change the numbers, and say why in the
commit.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# What --regenerate adds to every run's keys: a fixed thread count, so that
# the stored curve does not depend on the machine's cores.
REFERENCE_OVERRIDES = ["--runtime.threads=1"]


def train(mpiexec, meshlm, config, overrides, scratch):
    """Runs one training in `scratch`; returns (steps, losses) from its run.h5
    and the command line it ran."""
    cmd = shlex.split(mpiexec) + [
        meshlm, "train", config, "--train.log_every=1",
        f"--data.path={scratch}/tokens.h5", f"--output.dir={scratch}/out"] + list(overrides)
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        p = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        sys.exit("FAIL: meshlm did not finish within 240 s")
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    if p.returncode != 0:
        sys.exit(f"FAIL: meshlm exited with status {p.returncode}")
    with h5py.File(os.path.join(scratch, "out", "run.h5"), "r") as f:
        return (f["metrics/step"][...].astype(np.int64), f["metrics/loss"][...].astype(np.float64),
                cmd)


def check(curve, steps, losses):
    want_steps = np.array(curve["steps"], np.int64)
    want = np.array(curve["loss"], np.float64)
    tol = float(curve["rel_tol"])
    if not np.array_equal(steps, want_steps):
        print(f"FAIL: steps logged {steps.tolist()}, stored {want_steps.tolist()} "
              f"(the config changed? regenerate: {curve['regenerate']})")
        return False
    rel = np.abs(losses - want) / np.abs(want)  # NaN for a NaN loss: fails below
    print(f"{'step':>5s} {'stored loss':>19s} {'this run':>19s} {'rel diff':>10s}")
    for s, w, g, r in zip(steps, want, losses, rel):
        print(f"{s:5d} {w:19.15f} {g:19.15f} {r:10.3e}{'' if r <= tol else '  FAIL'}")
    worst = float(np.nanmax(rel)) if np.all(np.isfinite(rel)) else float("nan")
    ok = bool(np.all(rel <= tol))
    print(f"worst rel diff {worst:.3e} (rel_tol {tol:g})")
    print("PASS" if ok else "FAIL: the losses left the stored curve")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 usage=__doc__.split("\n\n")[1].split("\n", 1)[1])
    ap.add_argument("--meshlm", required=True, help="the meshlm executable")
    ap.add_argument("--mpiexec", required=True, help="mpiexec command line, ranks included")
    ap.add_argument("--curve", default=os.path.join(HERE, "tiny_losses.json"),
                    help="the stored curve (default: tests/data/tiny_losses.json)")
    ap.add_argument("--regenerate", action="store_true",
                    help="rewrite the stored curve from a one-rank, one-thread run")
    args, overrides = ap.parse_known_args()
    bad = [o for o in overrides if not o.startswith("--") or "." not in o.split("=")[0]]
    if bad:
        ap.error(f"not meshlm keys: {bad}")

    with open(args.curve) as f:
        curve = json.load(f)
    config = os.path.join(ROOT, curve["config"])
    meshlm = os.path.abspath(args.meshlm)

    with tempfile.TemporaryDirectory(prefix="meshlm-loss-curve-") as scratch:
        if not args.regenerate:
            steps, losses, _ = train(args.mpiexec, meshlm, config, overrides, scratch)
            sys.exit(0 if check(curve, steps, losses) else 1)
        if overrides:
            ap.error("--regenerate takes no overrides: the stored curve is that of one rank, one thread")
        steps, losses, cmd = train(args.mpiexec, meshlm, config, REFERENCE_OVERRIDES, scratch)
    # The command as it ran, with the scratch folder and the source tree
    # abbreviated.
    command = " ".join(shlex.quote(c) for c in cmd).replace(scratch, "SCRATCH")
    command = command.replace(ROOT + os.sep, "")

    old = np.array(curve.get("loss", []), np.float64)
    if old.shape == losses.shape:
        print(f"largest rel change from the stored curve: {np.max(np.abs(losses - old) / np.abs(old)):.3e}")
    curve["command"] = command
    curve["steps"] = steps.tolist()
    curve["loss"] = losses.tolist()  # shortest repr that reads back to the same float64
    with open(args.curve + ".tmp", "w") as f:
        json.dump(curve, f, indent=2)
        f.write("\n")
    os.replace(args.curve + ".tmp", args.curve)
    print(f"wrote {len(steps)} steps to {args.curve}")


if __name__ == "__main__":
    main()
