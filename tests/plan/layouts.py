"""What tests/plan/plan_orders_layouts.py and tests/bench/plan_accuracy.py
share: a layout of `meshlm plan --json` as meshlm train overrides, the
environment a run of it gets, and the rank correlation they report."""
import json
import os
import subprocess
import sys

import numpy as np


def layout_args(c):
    """The overrides that make meshlm train run the layout `c` of plan --json
    (its stage split included)."""
    args = [f"--parallel.dp={c['dp']}", f"--parallel.tp={c['tp']}", f"--parallel.pp={c['pp']}",
            f"--parallel.zero_stage={c['zero_stage']}", f"--train.micro_batch_size={c['micro_batch_size']}",
            f"--parallel.micro_batches={c['micro_batches']}",
            f"--parallel.activation_checkpointing={c['activation_checkpointing']}"]
    if c["pp"] > 1:
        args += [f"--parallel.schedule={c['schedule']}",
                 "--parallel.stage_layers=" + ",".join(str(x) for x in c["stage_layers"])]
    return args


def run_env(shared):
    """The environment of a run, as jobscripts/local.sh makes it: idle OpenMP
    threads sleep (OMP_WAIT_POLICY=PASSIVE) where the ranks' threads share
    cores, and spin a while first (libgomp's default) where they do not; the
    thread count is runtime.threads's."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("OMP_NUM_THREADS", None)
    if shared:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def calibrate(mpiexec, meshlm, rates):
    """`meshlm plan --calibrate` of this machine into `rates`, on 2 ranks (1
    on one core) under mpiexec, as users run it; the finished process."""
    return subprocess.run(mpiexec + ["-n", str(min(2, os.cpu_count() or 1)), "--bind-to", "none", meshlm,
                                     "plan", "--calibrate", rates],
                          capture_output=True, text=True, timeout=300, env=run_env(False))


def spearman(a, b):
    """Spearman's rank correlation (no ties expected among step times)."""
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def plan_fits(meshlm, cfg, n, rates, args):
    """Every layout of `n` ranks (one node) that `meshlm plan` says fits,
    fastest first, under the rates of a calibration file."""
    p = subprocess.run([meshlm, "plan", cfg, "--ranks", str(n), "--ranks-per-node", str(n), "--json",
                        "--top", "100000", f"--cluster.rates={rates}"] + args,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL: meshlm plan --ranks {n}: {p.stderr}")
    return json.loads(p.stdout)["fits"]
