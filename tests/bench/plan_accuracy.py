#!/usr/bin/env python3
"""meshlm plan's estimated step time against measured step times, on this
machine: for layouts of 1-8 ranks of two models, `meshlm plan --json` of the
layout (its configured layout) beside the median step time of a short
`meshlm train` of it (run.h5 metrics, the first steps left out), the
planner's rates from `meshlm plan --calibrate` on this machine (with as many ranks as the largest layout). Prints a
Markdown table and the Spearman rank correlation, and whether the layout
the planner ranks first among them is within 10% of the fastest measured.
Every layout runs --rounds times, in rounds over all layouts (a slow spell
of the machine then touches one run of a layout); the median of its runs'
medians is compared, and each round's own Spearman is printed beside.

Two sets of layouts (--set):
  fixed   13 hand-chosen layouts per model, most of them near the best (their
          step times lie within about 35% of each other);
  spread  the planner's own candidates: for 1, 2, 4 and 8 ranks, `meshlm plan
          --top 100000` lists every layout that fits, fastest first; those that
          differ only in the ZeRO stage count once, and the first, the last and
          the ones a third and two thirds down the list are run. This checks
          the ranking over the range of layouts the planner chooses from.

  tests/bench/plan_accuracy.py BUILD SCRATCH [--steps 12] [--skip 4] [--rounds 3] [--set fixed|spread|both]
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plan"))
from layouts import layout_args, plan_fits, run_env, spearman  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = {
    "small": ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=256",
              "--model.vocab_size=8192", "--model.seq_len=128", "--model.max_seq_len=128",
              "--train.batch_size=16"],
    "mid": ["--model.n_layer=6", "--model.n_head=12", "--model.n_embd=384",
            "--model.vocab_size=8192", "--model.seq_len=256", "--model.max_seq_len=256",
            "--train.batch_size=16"],
}
# ranks, overrides
LAYOUTS = [
    (1, ["--train.micro_batch_size=1"]),
    (1, ["--train.micro_batch_size=4"]),
    (1, ["--train.micro_batch_size=16"]),
    (1, ["--train.micro_batch_size=4", "--parallel.activation_checkpointing=full"]),
    (2, ["--parallel.dp=2", "--train.micro_batch_size=4"]),
    (2, ["--parallel.tp=2", "--train.micro_batch_size=4"]),
    (2, ["--parallel.pp=2", "--train.micro_batch_size=4"]),
    (2, ["--parallel.tp=2", "--train.micro_batch_size=4", "--parallel.activation_checkpointing=full"]),
    (4, ["--parallel.dp=4", "--train.micro_batch_size=4", "--parallel.zero_stage=1"]),
    (4, ["--parallel.dp=2", "--parallel.tp=2", "--train.micro_batch_size=4"]),
    (4, ["--parallel.pp=4", "--train.micro_batch_size=2"]),
    (8, ["--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2", "--train.micro_batch_size=2"]),
    (8, ["--parallel.dp=8", "--train.micro_batch_size=2", "--parallel.zero_stage=1"]),
]


def spread_layouts(meshlm, rates, mo, common):
    """For 1, 2, 4 and 8 ranks: the first, a third down, two thirds down and
    the last of the planner's distinct candidates (ZeRO stages of one layout
    count once: the first of them, as the planner ranks them)."""
    picked = []
    for n in (1, 2, 4, 8):
        seen, distinct = set(), []
        for c in plan_fits(meshlm, os.path.join(ROOT, "inputs/tiny.cfg"), n, rates, common + mo):
            key = (c["dp"], c["tp"], c["pp"], c["micro_batch_size"], c["micro_batches"],
                   c["activation_checkpointing"], c["schedule"] if c["pp"] > 1 else "")
            if key not in seen:
                seen.add(key)
                distinct.append(c)
        at = sorted({int(round(x)) for x in np.linspace(0, len(distinct) - 1, 4)})
        picked += [(n, layout_args(distinct[i])) for i in at]
    return picked


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("scratch")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of every layout, in rounds over all of them; the median is compared")
    ap.add_argument("--set", choices=["fixed", "spread", "both"], default="both",
                    help="which layouts: the hand-chosen ones, the planner's spread, or both")
    a = ap.parse_args()
    meshlm = os.path.join(a.build, "meshlm")
    os.makedirs(a.scratch, exist_ok=True)
    tokens = os.path.join(a.scratch, "tokens.h5")
    if not os.path.exists(tokens):
        subprocess.run([meshlm, "tokenize", "/usr/share/common-licenses/GPL-3", tokens], check=True,
                       stdout=subprocess.DEVNULL)
    mpiexec = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    rates = os.path.join(a.scratch, "rates.json")
    # As many ranks as the largest layout: the calibration measures how the
    # cores serve ranks that share them.
    most = 8  # the most ranks of any layout of either set
    subprocess.run(mpiexec + ["-n", str(most), meshlm, "plan", "--calibrate", rates], check=True,
                   env=run_env(False))
    cores = os.cpu_count()

    def common_args(mo, lo):
        return [f"--data.path={tokens}", f"--train.steps={a.steps}", "--train.log_every=1",
                "--checkpoint.final=false", "--train.warmup_steps=1"] + mo + lo

    # The planner's estimate of every layout (no MPI, nothing run).
    cases = []
    sets = ["fixed", "spread"] if a.set == "both" else [a.set]
    for kind, (model, mo) in [(k, m) for k in sets for m in MODELS.items()]:
        chosen = LAYOUTS if kind == "fixed" else spread_layouts(meshlm, rates, mo, common_args([], []))
        for n, lo in chosen:
            p = subprocess.run([meshlm, "plan", os.path.join(ROOT, "inputs/tiny.cfg"), "--ranks", str(n),
                                "--ranks-per-node", str(n), "--json", f"--cluster.rates={rates}"] +
                               common_args(mo, lo), capture_output=True, text=True)
            c = json.loads(p.stdout)["configured"]
            if "step_seconds" not in c:
                print(f"plan: {c}", file=sys.stderr)
                continue
            cases.append({"set": kind, "model": model, "mo": mo, "n": n, "lo": lo, "pred": c["step_seconds"], "runs": []})

    # Every layout once per round, the rounds one after the other, so that
    # a slow spell of the machine touches one run of a layout, not all.
    for r in range(a.rounds):
        for case in cases:
            n, mo, lo = case["n"], case["mo"], case["lo"]
            out = os.path.join(a.scratch, f"{case['model']}_{n}_{abs(hash(' '.join(lo))) % 10**8}")
            threads = max(1, cores // n)
            t = subprocess.run(mpiexec + ["-n", str(n), meshlm, "train", os.path.join(ROOT, "inputs/tiny.cfg")] +
                               common_args(mo, lo) + [f"--output.dir={out}", "--output.overwrite=true",
                                                      f"--runtime.threads={threads}"],
                               capture_output=True, text=True, env=run_env(n * threads > cores))
            if t.returncode != 0:
                print(t.stdout[-1500:], t.stderr[-1500:], file=sys.stderr)
                continue
            with h5py.File(os.path.join(out, "run.h5"), "r") as f:
                tps = f["metrics/tokens_per_s"][a.skip:]
            batch = 16 * int([x for x in mo if "seq_len=" in x and "max" not in x][0].split("=")[1])
            case["runs"].append(float(np.median(batch / tps)))
        print(f"# round {r + 1} of {a.rounds} done", file=sys.stderr)

    print(f"| set | model | ranks | layout | predicted s | measured s (median of {a.rounds} runs' medians) | runs |")
    print("|---|---|---:|---|---:|---:|---|")
    summary = []
    for kind, model in [(k, m) for k in sets for m in MODELS]:
        done = [c for c in cases if c["set"] == kind and c["model"] == model and c["runs"]]
        pred = [c["pred"] for c in done]
        meas = [float(np.median(c["runs"])) for c in done]
        for c, m in zip(done, meas):
            runs = ", ".join(f"{x:.3f}" for x in c["runs"])
            print(f"| {kind} | {model} | {c['n']} | {' '.join(x[2:] for x in c['lo'])} | {c['pred']:.4f} | {m:.4f} | {runs} |")
        rho = spearman(pred, meas)
        best = int(np.argmin(pred))
        within = meas[best] <= 1.10 * min(meas)
        # Each round on its own, for the spread of the figure.
        per_round = [spearman(pred, [c["runs"][r] for c in done]) for r in range(a.rounds)
                     if all(len(c["runs"]) > r for c in done)]
        summary.append((f"{kind} {model}", len(pred), rho, meas[best] / min(meas), within, per_round))
    print()
    for model, n, rho, ratio, within, per_round in summary:
        rounds = ", ".join(f"{x:.2f}" for x in per_round)
        print(f"{model}: {n} layouts, Spearman {rho:.2f} (each round alone: {rounds}); the planner's first at "
              f"{ratio:.2f}x the fastest measured ({'within' if within else 'not within'} 10%)")


if __name__ == "__main__":
    main()
