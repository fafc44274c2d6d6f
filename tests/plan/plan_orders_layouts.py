#!/usr/bin/env python3
"""meshlm plan's step-time estimate against measured step times: the light
form of tests/bench/plan_accuracy.py, for CI.

On this machine, with the rates `meshlm plan --calibrate` measures here (2
ranks under mpiexec), the planner lists every layout of a small model that
fits on the ranks of one thread each that the machine's cores hold: of 1,
2, 4 and 8 ranks, those with more than half as many ranks as cores (2 on a
2-core machine; the most that fit where none does). Ranks that share cores
are the benchmark's (tests/bench/plan_accuracy.py), whose ZeRO 2 layouts
the model underestimates there; so are ranks of several threads: on a VM
they run at the pace the host gives all their vCPUs at once, which moves
from run to run far more than a chain's gap (one rank on 2 threads read
0.73x, 1.02x, 1.29x and, in CI, 1.39x its estimate in four of the test's
runs, while the ranks of one thread beside it read 0.87-1.10x;
docs/planner.md). From all of them, fastest first, the test takes a
chain of layouts each estimated at least 1.15 times slower than the one
before (1.1 where the range holds fewer than MIN_CHAIN layouts so; the
chain covers the planner's range, from its best layout to its slowest),
runs each for a few steps and compares its median step with the estimate.
The noise of a shared machine only ever adds time: while the checks fail, the layouts measured more than
1.1x the chain's median ratio to their estimate run again, up to three more
rounds, each layout's fastest median counting (one run's median moves 7-10%
here, as much as the chain's gap); while the first pick fails, it runs again
too, with every layout measured more than 1.1x faster than it (a CI run
here failed with the first two layouts, estimated 1.13x apart, measured
once each the other way round by 1.12x, the whole chain 1.20x its
estimates). A model that misjudges a regime stays slow there; a slow spell
does not:

  * the chain holds at least MIN_CHAIN layouts, so it spans at least
    1.15**4 = 1.75x (how many it holds depends on the machine's rates: 5-7
    of the 52 layouts of 2 ranks that fit here);
  * the Spearman rank correlation of estimate and measurement is at least
    0.9 (one neighbouring pair may swap among 5 or 6 layouts, two among 7);
  * the layout estimated fastest is within 10% of the fastest measured.

A calibration taken while the machine was busy reads rates too low, and
the layouts that lean on them then measure faster than estimated. So
while the checks fail and some layouts measured faster than the median
ratio / 1.1, the machine is calibrated once more and the
chain is estimated again under the second calibration, which the checks
then use (both are printed). A planner that misjudges a regime misjudges it
under either calibration.

A planner that left out recomputation, the pipeline bubble, tensor-parallel
communication or the cost of small micro-batches misorders layouts this far
apart; the noise of a shared 2-core machine (about 7% between runs) does not.

The first calibration is the fixture plan_rates's (RATES, measured alone on
the machine by tests/plan/calibrate_rates.py); without RATES the test
calibrates first.

  plan_orders_layouts.py MPIEXEC MESHLM CFG [RATES]
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layouts import calibrate, layout_args, plan_fits, run_env, spearman  # noqa: E402

mpiexec, meshlm, cfg = shlex.split(sys.argv[1]), sys.argv[2], sys.argv[3]
fixture_rates = sys.argv[4] if len(sys.argv) > 4 else None
# Layouts 1.15x apart: a calibration's figures drift 10-15% from one
# calibration to the next here, and one run's step 7-10%; with layouts 1.1x
# apart the check failed 2 of 13 runs (a pair swapped on the first pick, and
# Spearman 0.86), a planner that misorders a regime aside (docs/planner.md).
# 1.1x apart where the planner's range holds fewer than MIN_CHAIN layouts
# 1.15x apart (its range read 1.89-2.7x here).
GAPS = (1.15, 1.1)
MIN_CHAIN = 5
STEPS, SKIP = 6, 2
ROUNDS = 1
EXTRA_ROUNDS, SLOW = 3, 1.1
FIRST = 1.10  # the first pick within 10% of the fastest measured
MODEL = ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=256", "--model.vocab_size=8192",
         "--model.seq_len=128", "--model.max_seq_len=128", "--train.batch_size=16"]


def rank_counts(cores):
    """The rank counts of 1, 2, 4 and 8 whose ranks get one thread each
    (more than half as many ranks as cores), or the most that fit."""
    fit = [n for n in (1, 2, 4, 8) if n <= cores]
    return [n for n in fit if 2 * n > cores] or fit[-1:]


def measure(mpiexec, meshlm, cfg, common, c, n, cores, out):
    """The median step of layout `c` on `n` ranks, its first SKIP steps left out."""
    threads = max(1, cores // n)
    r = subprocess.run(mpiexec + ["-n", str(n), "--bind-to", "none", meshlm, "train", cfg] + common +
                       layout_args(c) + [f"--output.dir={out}", f"--runtime.threads={threads}"],
                       capture_output=True, text=True, timeout=600, env=run_env(n * threads > cores))
    if r.returncode != 0:
        sys.exit(f"FAIL: training layout {layout_args(c)} on {n} ranks:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    with h5py.File(os.path.join(out, "run.h5"), "r") as f:
        tps = f["metrics/tokens_per_s"][SKIP:]
    return float(np.median(16 * 128 / tps))


def calibrate_or_fail(mpiexec, meshlm, rates):
    """This machine's figures, by meshlm plan --calibrate on 2 ranks, into `rates`."""
    r = calibrate(mpiexec, meshlm, rates)
    if r.returncode != 0:
        sys.exit(f"FAIL: meshlm plan --calibrate exited {r.returncode}:\n{r.stdout}{r.stderr}")


def estimate(meshlm, cfg, n, rates, common, c):
    """meshlm plan's step estimate of the layout `c` (its stage split as run) under `rates`."""
    p = subprocess.run([meshlm, "plan", cfg, "--ranks", str(n), "--ranks-per-node", str(n), "--json",
                        "--top", "1", f"--cluster.rates={rates}"] + common + layout_args(c),
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL: meshlm plan of {layout_args(c)} on {n} ranks: {p.stderr}")
    return json.loads(p.stdout)["configured"]["step_seconds"]


def ratios_to_estimates(pred, meas):
    """Each layout's measured step over its estimate, and their median."""
    ratios = [m / e for m, e in zip(meas, pred)]
    return ratios, float(np.median(ratios))


def failures_of(pred, meas):
    """What the chain's estimates `pred` and measured steps `meas` fail of the checks."""
    failures = []
    rho, first = spearman(pred, meas), meas[0] / min(meas)
    if rho < 0.9 - 1e-9:  # "at least 0.9": ranks give it exactly (9 layouts, sum of d^2 = 12)
        failures.append(f"Spearman {rho:.2f} < 0.9")
    if first > FIRST:
        failures.append(f"the layout estimated fastest is {first:.2f}x the fastest measured (> {FIRST:.2f})")
    return failures


def main():
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory(prefix="plan_orders_") as tmp:
        tokens = os.path.join(tmp, "tokens.h5")
        subprocess.run([meshlm, "tokenize", "/usr/share/common-licenses/GPL-3", tokens], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)
        if fixture_rates:
            rates = fixture_rates
        else:
            rates = os.path.join(tmp, "rates.json")
            calibrate_or_fail(mpiexec, meshlm, rates)
        common = [f"--data.path={tokens}", f"--train.steps={STEPS}", "--train.log_every=1",
                  "--checkpoint.final=false", "--train.warmup_steps=1"] + MODEL

        candidates, counts = [], []
        for n in rank_counts(cores):
            fits = plan_fits(meshlm, cfg, n, rates, common)
            counts.append(f"{len(fits)} on {n} ranks")
            candidates += [(c["step_seconds"], n, c) for c in fits]
        candidates.sort(key=lambda x: x[0])
        for gap in GAPS:
            chain = [candidates[0]]
            for cand in candidates[1:]:
                if cand[0] >= gap * chain[-1][0]:
                    chain.append(cand)
            if len(chain) >= MIN_CHAIN:
                break
        print(f"{', '.join(counts)} fit, estimated {candidates[0][0]:.3f}-{candidates[-1][0]:.3f} s; "
              f"{len(chain)} of them each >= {gap}x the one before")
        if len(chain) < MIN_CHAIN:
            sys.exit(f"FAIL: only {len(chain)} layouts {gap}x apart")

        runs = [[] for _ in chain]

        def run_round(rnd, which):
            for i in which:
                est, n, c = chain[i]
                runs[i].append(measure(mpiexec, meshlm, cfg, common, c, n, cores,
                                       os.path.join(tmp, f"run{rnd}_{i}")))

        for rnd in range(ROUNDS):
            run_round(rnd, range(len(chain)))
        pred = [est for est, _, _ in chain]
        meas = [min(r) for r in runs]
        # Noise only adds time: while the check fails, the layouts measured
        # more than SLOW x the chain's median ratio to their estimate run
        # again (a model that misjudges a regime stays slow there; a spell
        # of a busy machine does not), and while the first pick fails, it and
        # every layout measured FIRST x faster than it run again, each as
        # often: the fastest of each's runs decides.
        for rnd in range(ROUNDS, ROUNDS + EXTRA_ROUNDS):
            if not failures_of(pred, meas):
                break
            ratios, median = ratios_to_estimates(pred, meas)
            slow = [i for i, r in enumerate(ratios) if r > SLOW * median]
            faster = [i for i, m in enumerate(meas) if m * FIRST < meas[0]]
            again = sorted(set(slow) | ({0, *faster} if faster else set()))
            if not again:
                break
            print(f"round {rnd + 1}: again {len(slow)} layouts measured > {SLOW}x the median ratio "
                  f"{median:.2f}, and the first pick beside {len(faster)} measured > {FIRST}x faster")
            run_round(rnd, again)
            meas = [min(r) for r in runs]
        for (est, n, c), r, seconds in zip(chain, runs, meas):
            print(f"  {n} ranks {' '.join(x[2:] for x in layout_args(c))}: estimated {est:.3f} s, "
                  f"measured {seconds:.3f} s ({seconds / est:.2f}x; rounds "
                  f"{', '.join(f'{x:.3f}' for x in r)})")
        # A busy spell in the calibration: layouts measured faster than
        # estimated. The machine calibrated again; the chain estimated anew.
        ratios, median = ratios_to_estimates(pred, meas)
        fast = [i for i, r in enumerate(ratios) if r < median / SLOW]
        if failures_of(pred, meas) and fast:
            print(f"FAIL under the first calibration: {'; '.join(failures_of(pred, meas))}; "
                  f"{len(fast)} layouts measured < 1/{SLOW} x the median ratio {median:.2f}: calibrating again")
            again = os.path.join(tmp, "rates_again.json")
            calibrate_or_fail(mpiexec, meshlm, again)
            pred = [estimate(meshlm, cfg, n, again, common, c) for _, n, c in chain]
            for (_, n, c), e, seconds in zip(chain, pred, meas):
                print(f"  {n} ranks {' '.join(x[2:] for x in layout_args(c))}: estimated {e:.3f} s "
                      f"under the second calibration ({seconds / e:.2f}x)")

    print(f"Spearman {spearman(pred, meas):.2f}; the layout estimated fastest at "
          f"{meas[0] / min(meas):.2f}x the fastest measured")
    failures = failures_of(pred, meas)
    if failures:
        print("FAIL: " + "; ".join(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
