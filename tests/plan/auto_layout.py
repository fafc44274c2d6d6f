#!/usr/bin/env python3
"""parallel.layout = auto in meshlm train, against meshlm plan, on tiny.cfg
with a small model on 4 ranks:

  * the run trains with the layout `meshlm plan --json` puts first among
    those that fit the same memory.limit_per_rank (dp, tp, pp, ZeRO stage,
    micro-batch size and count, checkpointing, schedule), read back from the
    resolved configuration in run.h5 (h5py), which keeps layout = auto and
    holds the attribute layout_choice naming the layout and why; the chosen
    layout fits the limit;
  * a limit below the fastest layout's peak moves the choice to one that
    fits it (a different layout), and the run's own predicted peaks
    (memory/process/predicted_peak_bytes) stay under that limit;
  * a [parallel] key given with auto holds in the search (tp = 2);
  * a limit nothing fits ends the run with an error naming
    parallel.layout, the limit and the nearest layout, before anything is
    written to output.dir; so does parallel.stage_layers with auto.

  auto_layout.py MPIEXEC MESHLM CFG
"""
import configparser
import json
import os
import shlex
import subprocess
import sys
import tempfile

import h5py

mpiexec, meshlm, cfg = shlex.split(sys.argv[1]), sys.argv[2], sys.argv[3]
failures = []
MODEL = ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=128", "--model.vocab_size=4096",
         "--model.seq_len=64", "--model.max_seq_len=64", "--train.batch_size=8"]
KEYS = ["dp", "tp", "pp", "zero_stage", "micro_batches", "activation_checkpointing", "schedule"]


def plan_first(common, limit):
    r = subprocess.run([meshlm, "plan", cfg, "--ranks", "4", "--ranks-per-node", "4", "--json",
                        "--mem-per-rank", str(limit)] + common, capture_output=True, text=True, timeout=120)
    j = json.loads(r.stdout)
    return j["fits"][0] if j["fits"] else None, j


def train(out, common, extra):
    return subprocess.run(mpiexec + ["-n", "4", meshlm, "train", cfg, f"--output.dir={out}"] + common + extra,
                          capture_output=True, text=True, timeout=300)


def chosen(out):
    with h5py.File(os.path.join(out, "run.h5"), "r") as f:
        ini = f.attrs["config"]
        why = f.attrs.get("layout_choice", "")
        peaks = f["memory/process/predicted_peak_bytes"][:]
    c = configparser.ConfigParser(strict=False)  # a section may come twice
    c.read_string(ini if isinstance(ini, str) else ini.decode())
    got = {k: c["parallel"][k] for k in KEYS + ["layout"]}
    got["micro_batch_size"] = c["train"]["micro_batch_size"]
    return got, (why if isinstance(why, str) else why.decode()), peaks


def same(got, planned):
    return all(str(planned[k]) == got[k] for k in KEYS) and str(planned["micro_batch_size"]) == got["micro_batch_size"]


with tempfile.TemporaryDirectory() as scratch:
    tokens = os.path.join(scratch, "tokens.h5")
    subprocess.run([meshlm, "tokenize", "/usr/share/common-licenses/GPL-3", tokens], check=True,
                   capture_output=True)
    common = [f"--data.path={tokens}", "--train.steps=2", "--train.log_every=1",
              "--checkpoint.final=false", "--parallel.layout=auto"] + MODEL

    # 1. No limit but the machine's: the plan's first.
    big = 64 << 30
    first, j = plan_first(common, big)
    out = os.path.join(scratch, "auto")
    r = train(out, common, [f"--memory.limit_per_rank={big}"])
    if r.returncode != 0:
        failures.append(f"auto: exit {r.returncode}: {r.stdout[-600:]}{r.stderr[-600:]}")
    else:
        got, why, peaks = chosen(out)
        if not same(got, first) or got["layout"] != "auto":
            failures.append(f"auto chose {got}, the plan's first is {first}")
        if "parallel.layout = auto chose" not in why or "# layout:" not in r.stdout:
            failures.append(f"no layout_choice / printed reason: {why!r}")
        print(f"ok: auto = plan's first: {got}")

        # 2. A limit under that layout's peak: another layout, which fits.
        peaks_sorted = sorted({L["peak_bytes_max"] for L in j["fits"]})
        below = [p for p in peaks_sorted if p < first["peak_bytes_max"] * 0.97]
        if below:
            limit = int(below[-1] * 1.01)
            first2, _ = plan_first(common, limit)
            out2 = os.path.join(scratch, "auto_limited")
            r = train(out2, common, [f"--memory.limit_per_rank={limit}"])
            if r.returncode != 0:
                failures.append(f"auto under {limit}: exit {r.returncode}: {r.stdout[-600:]}{r.stderr[-600:]}")
            else:
                got2, why2, peaks2 = chosen(out2)
                if not same(got2, first2) or same(got2, first):
                    failures.append(f"auto under {limit} chose {got2}; plan: {first2}; unlimited: {first}")
                if max(peaks2) > limit:
                    failures.append(f"auto under {limit}: the run predicts {max(peaks2)}")
                print(f"ok: under {limit} bytes: {got2}, predicted peak {max(peaks2)}")
        else:
            failures.append("no layout with a smaller peak to test a limit with")

    # 3. A [parallel] key given explicitly holds.
    out3 = os.path.join(scratch, "auto_tp2")
    r = train(out3, common, ["--parallel.tp=2"])
    if r.returncode != 0:
        failures.append(f"auto with tp = 2: exit {r.returncode}: {r.stderr[-600:]}")
    elif chosen(out3)[0]["tp"] != "2":
        failures.append(f"auto with tp = 2 chose {chosen(out3)[0]}")

    # 4. Nothing fits / stage_layers with auto: an error, nothing written.
    for extra, want in [(["--memory.limit_per_rank=1MiB"], ["parallel.layout = auto", "1.0 MiB", "does not fit"]),
                        (["--parallel.stage_layers=2,2"], ["parallel.stage_layers", "parallel.layout = auto"])]:
        out4 = os.path.join(scratch, "refused")
        r = train(out4, common, extra)
        if r.returncode == 0 or not all(w in r.stderr + r.stdout for w in want):
            failures.append(f"{extra}: exit {r.returncode}, no error naming {want}: {r.stderr[-600:]}")
        if os.path.exists(out4):
            failures.append(f"{extra}: {out4} was created")

if failures:
    print("FAIL:\n" + "\n".join(failures))
    sys.exit(1)
print("PASS")
