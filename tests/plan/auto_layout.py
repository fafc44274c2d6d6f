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
  * with pp 2 fixed and a limit the balanced stage split exceeds, the plan
    and the run take the split that fits (a layer moved off the fuller
    stage), and the ranks' VmHWM (tests/meshlm_memprobe) stays under it;
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
    got["stage_layers"] = c["parallel"].get("stage_layers", "")
    return got, (why if isinstance(why, str) else why.decode()), peaks


def same(got, planned):
    """The run's layout is the plan's: its keys, and the stage split the plan
    chose where auto wrote one (a split under memory; two layouts may differ
    in that alone). An empty parallel.stage_layers is the split balanced by
    cost, the plan's own where it did not split under memory."""
    split = ",".join(str(n) for n in planned.get("stage_layers", []))
    return (all(str(planned[k]) == got[k] for k in KEYS) and
            str(planned["micro_batch_size"]) == got["micro_batch_size"] and
            (int(planned["pp"]) == 1 or got["stage_layers"] in ("", split)))


with tempfile.TemporaryDirectory() as scratch:
    tokens = os.path.join(scratch, "tokens.h5")
    subprocess.run([meshlm, "tokenize", "/usr/share/common-licenses/GPL-3", tokens], check=True,
                   stdout=subprocess.DEVNULL)
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

    # 5. Stages split under memory: on 2 ranks, pp 2, B 2 x 8, 1F1B, the
    # balanced split (5 layers and 3 with the classifier) puts 203 MiB on
    # stage 0, over a 190 MiB limit; the plan moves a layer to the last stage
    # (4,4), which fits, and the run takes that split; its ranks' VmHWM
    # (memprobe) stays under the limit.
    model8 = ["--model.n_layer=8", "--model.n_head=4", "--model.n_embd=256", "--model.vocab_size=8192",
              "--model.seq_len=128", "--model.max_seq_len=128", "--train.batch_size=16"]
    fixed = ["--parallel.pp=2", "--parallel.micro_batches=8", "--parallel.activation_checkpointing=none",
             "--parallel.schedule=1f1b", "--parallel.zero_stage=0"]
    c8 = [f"--data.path={tokens}", "--train.steps=2", "--train.log_every=1", "--checkpoint.final=false",
          "--parallel.layout=auto"] + model8 + fixed
    limit = 190 << 20

    def plan2(lim):
        r = subprocess.run([meshlm, "plan", cfg, "--ranks", "2", "--ranks-per-node", "2", "--json",
                            "--mem-per-rank", str(lim)] + c8, capture_output=True, text=True, timeout=120)
        return json.loads(r.stdout)
    free, capped = plan2(64 << 30)["fits"][0], plan2(limit)
    if not capped["fits"]:
        failures.append(f"split under memory: nothing fits {limit}: {capped['rejected'][:1]}")
    else:
        split = capped["fits"][0]
        if split["stage_layers"] == free["stage_layers"] or split["peak_bytes_max"] > limit or \
                free["peak_bytes_max"] <= limit:
            failures.append(f"split under memory: balanced {free['stage_layers']} at {free['peak_bytes_max']}, "
                            f"under {limit}: {split['stage_layers']} at {split['peak_bytes_max']}")
        out5 = os.path.join(scratch, "split")
        probe = os.path.join(scratch, "split_probe")
        memprobe = os.path.join(os.path.dirname(meshlm), "tests", "meshlm_memprobe")
        r = subprocess.run(mpiexec + ["-n", "2", memprobe, probe, "--", meshlm, "train", cfg,
                                      f"--output.dir={out5}", f"--memory.limit_per_rank={limit}"] + c8,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            failures.append(f"split under memory: exit {r.returncode}: {r.stderr[-600:]}")
        else:
            with h5py.File(os.path.join(out5, "run.h5"), "r") as f:
                ini = f.attrs["config"]
            c = configparser.ConfigParser(strict=False)
            c.read_string(ini if isinstance(ini, str) else ini.decode())
            got = [int(x) for x in c["parallel"]["stage_layers"].split(",")]
            hwm = []
            for rank in range(2):
                with open(f"{probe}.{rank}.txt") as f:
                    hwm += [int(l.split()[1]) * 1024 for l in f if l.startswith("hwm_kb ")]
            if got != split["stage_layers"] or max(hwm) > limit:
                failures.append(f"split under memory: the run split {got} (plan {split['stage_layers']}), "
                                f"VmHWM {hwm} against {limit}")
            print(f"ok: stages {free['stage_layers']} -> {got} under {limit >> 20} MiB, VmHWM "
                  f"{[h >> 20 for h in hwm]} MiB")

if failures:
    print("FAIL:\n" + "\n".join(failures))
    sys.exit(1)
print("PASS")
