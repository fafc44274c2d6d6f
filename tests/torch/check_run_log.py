#!/usr/bin/python3
"""Runs a short meshlm training under mpiexec and reads its run.h5 with h5py,
knowing nothing of meshlm's C++ code: the run log must be a plain HDF5 file
with the layout docs/formats.md promises. A second run of the same training
evaluates held-out tokens (a /val_tokens dataset beside /tokens): its
training losses are the first run's bit for bit, metrics/val_step and
val_loss hold one row per evaluation, and a run resumed from a checkpoint
keeps the rows up to it and logs the same values after it.

usage: check_run_log.py --mpiexec "mpiexec -n 2 ..." --meshlm PATH --config FILE
"""
import argparse
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile

import h5py
import numpy as np

CATEGORIES = ["params", "grads", "optimizer", "activations", "quantized", "comm",
              "workspace", "checkpoint", "other"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--config", required=True)
    a = ap.parse_args()

    failures = []

    def check(cond, what):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        steps, log_every = 12, 5

        def train(out, extra=()):
            cmd = shlex.split(a.mpiexec) + [
                a.meshlm, "train", a.config, f"--train.steps={steps}",
                f"--train.log_every={log_every}", f"--output.dir={tmp}/{out}",
                f"--data.path={tmp}/tokens.h5"] + list(extra)
            print("$", " ".join(cmd))
            p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=240)
            print(p.stdout)
            print(p.stderr, file=sys.stderr)
            if p.returncode != 0:
                print(f"FAIL: meshlm exited with {p.returncode}")
                sys.exit(1)
            return p

        p = train("out")
        # One line per logged step, printed once (rank 0 only) although 2 ranks run.
        logged = [1] + [s for s in range(1, steps + 1) if s % log_every == 0 or s == steps]
        logged = sorted(set(logged))
        lines = [l for l in p.stdout.splitlines() if len(l.split()) == 6 and l.split()[0].isdigit()]
        check([int(l.split()[0]) for l in lines] == logged,
              f"stdout has one line per logged step {logged}")
        check("# Memory per rank" in p.stdout and "# Time per section" in p.stdout,
              "memory and timing tables printed")

        # data.tokenize_from made the token file: byte-level, one id per byte.
        with h5py.File(os.path.join(tmp, "tokens.h5"), "r") as f:
            ids = f["tokens"][...]
            vocab = int(f.attrs["vocab_size"])
        text = np.frombuffer(open("/usr/share/common-licenses/GPL-3", "rb").read(), dtype=np.uint8)
        check(ids.dtype == np.uint16 and vocab == 256, "tokens stored as uint16 with vocab_size 256")
        check(np.array_equal(ids, text), f"the {len(ids)} tokens are the bytes of the text")

        path = os.path.join(tmp, "out", "run.h5")
        check(os.path.exists(path), "run.h5 exists")
        with h5py.File(path, "r") as f:
            cfg = f.attrs["config"]
            cfg = cfg.decode() if isinstance(cfg, bytes) else str(cfg)
            check(f"steps = {steps}" in cfg and "[model]" in cfg and "n_layer = 2" in cfg,
                  "config attribute holds the resolved configuration")
            m = f["metrics"]
            step = m["step"][...]
            check(list(step) == logged, f"/metrics/step == {logged} (got {list(step)})")
            for name in ["loss", "lr", "grad_norm", "tokens_per_s"]:
                d = m[name][...]
                check(d.shape == (len(logged),) and np.all(np.isfinite(d)),
                      f"/metrics/{name} has {len(logged)} finite values")
            loss = m["loss"][...]
            check(abs(loss[0] - math.log(256)) < 0.3,
                  f"first loss {loss[0]:.4f} is near ln(256) = {math.log(256):.4f}")
            check(loss[-1] < loss[0], f"loss fell ({loss[0]:.4f} -> {loss[-1]:.4f})")
            lr = m["lr"][...]
            check(np.all(lr > 0) and lr.max() <= 1e-3 + 1e-12, "learning rates within (0, train.lr]")
            check(np.all(m["tokens_per_s"][...] > 0), "tokens_per_s positive")
            # One entry per rank (2 ranks, data-parallel by default).
            for c in CATEGORIES:
                check(f"memory/{c}/peak_bytes" in f and f[f"memory/{c}/peak_bytes"].shape == (2,),
                      f"/memory/{c}/peak_bytes holds one entry per rank")
            peak = {c: f[f"memory/{c}/peak_bytes"][...].astype(np.int64) for c in CATEGORIES}
            pred = {c: f[f"memory/{c}/predicted_bytes"][...].astype(np.int64) for c in CATEGORIES}
            for c in ["params", "grads", "optimizer", "activations"]:
                check(np.all(peak[c] > 0), f"/memory/{c}/peak_bytes > 0 on every rank")
            # params, grads and both AdamW moments hold one float per parameter.
            check(np.array_equal(peak["grads"], peak["params"]), "grads bytes == params bytes")
            check(np.array_equal(peak["optimizer"], 2 * peak["params"]),
                  "optimizer bytes == 2 x params bytes (AdamW m, v)")
            # The memory model predicts every tracked category of every rank exactly.
            for c in CATEGORIES:
                check(np.array_equal(pred[c], peak[c]),
                      f"/memory/{c}: predicted {list(pred[c])} == measured peak {list(peak[c])}")
            for name in ["rss_bytes", "rss_peak_bytes", "pss_bytes", "runtime_bytes",
                         "predicted_peak_bytes", "error"]:
                check(f[f"memory/process/{name}"].shape == (2,), f"/memory/process/{name} per rank")
            # Each phase's tracked host total is predicted exactly; the process
            # prediction is the runtime's part plus the largest phase, and its
            # error is against VmHWM as meshlm read it.
            phases = ["start_up", "base_loading", "initialisation", "training"]
            ppred = {p: f[f"memory/phases/{p}/predicted_bytes"][...].astype(np.int64) for p in phases}
            ppeak = {p: f[f"memory/phases/{p}/peak_bytes"][...].astype(np.int64) for p in phases}
            for p in phases:
                check(np.array_equal(ppred[p], ppeak[p]),
                      f"/memory/phases/{p}: predicted {list(ppred[p])} == tracked {list(ppeak[p])}")
            check(np.all(ppeak["base_loading"] == 0), "no base loading without LoRA")
            # Workspace peaks alone at start-up (the GEMM that makes OpenBLAS's
            # buffer resident before the runtime's part is measured).
            check(np.all(peak["workspace"] == pred["workspace"]) and np.all(peak["workspace"] > 0),
                  "workspace: the start-up's GEMM warm-up")
            tracked_total = sum(peak[c] for c in CATEGORIES if c != "workspace")
            check(np.array_equal(np.maximum(ppeak["initialisation"], ppeak["training"]), tracked_total),
                  "the largest phase is the tracked total's peak (one moment, all categories)")
            runtime = f["memory/process/runtime_bytes"][...].astype(np.int64)
            predicted = f["memory/process/predicted_peak_bytes"][...].astype(np.int64)
            hwm = f["memory/process/rss_peak_bytes"][...].astype(np.int64)
            check(np.all(runtime > (1 << 20)), f"runtime part {list(runtime)} > 1 MiB (libraries, MPI)")
            check(np.array_equal(predicted, runtime + np.max([ppred[p] for p in phases], axis=0)),
                  "predicted peak = runtime + the largest phase")
            err = f["memory/process/error"][...]
            check(np.allclose(err, (predicted - hwm) / hwm, rtol=1e-12),
                  f"error {list(err)} == (predicted - VmHWM) / VmHWM")
            # The node (both ranks on one): its predicted summed PSS is the
            # largest phase's sum of runtime PSS + tracked total.
            runtime_pss = f["memory/process/runtime_pss_bytes"][...].astype(np.int64)
            check(np.all((runtime_pss > 0) & (runtime_pss <= runtime)),
                  f"runtime PSS {list(runtime_pss)} in (0, runtime {list(runtime)}]")
            check(np.array_equal(f["memory/process/node"][...], [0, 0]), "both ranks on node 0")
            node_pred = f["memory/node/predicted_peak_bytes"][...].astype(np.int64)
            by_phase = [int(np.sum(runtime_pss + ppred[p])) for p in phases]
            check(list(node_pred) == [max(by_phase)],
                  f"node prediction {list(node_pred)} == the largest phase's sum {max(by_phase)}")
            pss = f["memory/process/pss_bytes"][...].astype(np.int64)
            check(list(f["memory/node/pss_bytes"][...]) == [int(pss.sum())],
                  "node PSS at the end == the ranks' PSS summed")
            first_losses = loss
            check(m["val_step"].dtype == np.int64 and m["val_loss"].dtype == np.float64
                  and len(m["val_step"]) == 0 and len(m["val_loss"]) == 0,
                  "/metrics/val_step (int64) and val_loss (float64) empty without evaluation")

        check_validation(tmp, train, steps, first_losses, check)
    print("PASS" if not failures else f"FAIL ({len(failures)} checks)")
    return 0 if not failures else 1


def check_validation(tmp, train, steps, first_losses, check):
    """The same training with evaluations every 4 steps on held-out tokens
    (the Apache licence as /val_tokens of a copy of the token file), then
    resumed from its step-8 checkpoint."""
    with h5py.File(os.path.join(tmp, "tokens.h5"), "r") as src, \
            h5py.File(os.path.join(tmp, "both.h5"), "w") as f:
        f["tokens"] = src["tokens"][...]
        f.attrs["vocab_size"] = src.attrs["vocab_size"]
        held = open("/usr/share/common-licenses/Apache-2.0", "rb").read()
        f["val_tokens"] = np.frombuffer(held, dtype=np.uint8).astype(np.uint16)
    every, batches = 4, 2
    evals = [s for s in range(1, steps + 1) if s % every == 0 or s == steps]
    extra = [f"--data.path={tmp}/both.h5", f"--train.eval_every={every}",
             f"--train.eval_batches={batches}", f"--checkpoint.every={every}"]
    # Same parameter file, same seed: the same losses, bit for bit, with or
    # without evaluations.
    p = train("again", extra)
    run_h5 = os.path.join(tmp, "again", "run.h5")
    with h5py.File(run_h5, "r") as f:
        again = f["metrics/loss"][...]
        val_step = f["metrics/val_step"][...]
        val_loss = f["metrics/val_loss"][...]
    check(again.tobytes() == first_losses.tobytes(),
          "a second run with the same seed, evaluating, logs the same losses bit for bit")
    check(list(val_step) == evals, f"/metrics/val_step == {evals} (got {list(val_step)})")
    check(val_loss.shape == (len(evals),) and np.all(np.isfinite(val_loss))
          and np.all(np.abs(val_loss - math.log(256)) < 1.0),
          f"/metrics/val_loss: {len(evals)} finite losses near ln(256) ({list(val_loss)})")
    # The printed lines say the same: step, loss (4 decimals), batches, tokens.
    seq_len, batch = 32, 4  # inputs/tiny.cfg
    printed = re.findall(r"^\s*step (\d+) val_loss (\S+) \((\d+) batches, (\d+) tokens",
                         p.stdout, re.M)
    check([int(s) for s, _, _, _ in printed] == evals
          and all(abs(float(v) - x) <= 5e-5 for (_, v, _, _), x in zip(printed, val_loss))
          and all(int(b) == batches and int(t) == batches * batch * seq_len
                  for _, _, b, t in printed),
          f"one printed line per evaluation, as in run.h5 ({printed})")
    # Resumed from step 8 in the same directory: the rows up to 8 carried,
    # the evaluation at 12 made again with the same bits.
    ckpt = os.path.join(tmp, "again", "checkpoints", "step_00000008.h5")
    train("again", extra + [f"--checkpoint.resume={ckpt}"])
    with h5py.File(run_h5, "r") as f:
        resumed_step = f["metrics/val_step"][...]
        resumed_loss = f["metrics/val_loss"][...]
    check(list(resumed_step) == evals and resumed_loss.tobytes() == val_loss.tobytes(),
          f"resumed at step 8: val rows {list(resumed_step)} with the uninterrupted run's values")


if __name__ == "__main__":
    sys.exit(main())
