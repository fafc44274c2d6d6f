#!/usr/bin/python3
"""compare_runs.py REFERENCE/run.h5 OTHER/run.h5 STEPS [--resumed-at K ...]

OTHER's per-step metrics (loss, lr, grad_norm; float64 as stored) equal
REFERENCE's bit for bit at every step 1..STEPS, and OTHER's run log records
exactly the resumptions given (none by default). Exit status 1 with a FAIL
line naming the first difference otherwise."""
import argparse
import sys

import h5py
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("reference")
ap.add_argument("other")
ap.add_argument("steps", type=int)
ap.add_argument("--resumed-at", type=int, action="append", default=[])
a = ap.parse_args()


def fail(msg):
    print(f"FAIL: {a.other}: {msg}")
    sys.exit(1)


with h5py.File(a.reference, "r") as ref, h5py.File(a.other, "r") as run:
    want = list(range(1, a.steps + 1))
    for name, f in (("reference", ref), ("run", run)):
        steps = list(f["metrics/step"][:])
        if steps != want:
            fail(f"the {name} log holds steps {steps[:3]}...{steps[-3:]} ({len(steps)}), not 1..{a.steps}")
    resumed = list(run["resumed_at_steps"][:]) if "resumed_at_steps" in run else []
    if resumed != a.resumed_at:
        fail(f"resumed at steps {resumed}, expected {a.resumed_at}")
    for col in ("loss", "lr", "grad_norm"):
        x, y = ref["metrics/" + col][:], run["metrics/" + col][:]
        if not np.array_equal(x, y):
            i = int(np.flatnonzero(x != y)[0])
            fail(f"{col} differs from the reference first at step {i + 1}: {y[i]!r} vs {x[i]!r}")
print(f"{a.other}: loss, lr and grad_norm of steps 1-{a.steps} equal {a.reference}'s bit for bit"
      + (f" (resumed at step {', '.join(map(str, a.resumed_at))})" if a.resumed_at else ""))
