#!/usr/bin/env python3
"""meshlm's predicted peak memory per rank against what the operating system
measured: VmHWM, read by tests/tools/memprobe.cpp from /proc as each rank
exits (not by meshlm).

  tests/bench/memory_accuracy.py BUILD SCRATCH [--only NAME,...] [--every-ms N] [--list]

BUILD is a build directory holding meshlm and tests/meshlm_memprobe; SCRATCH
receives one folder per configuration (parameter overrides, run.h5, probe
files, log). Prints one row per rank and a summary per configuration:
predicted peak, VmHWM, error = (predicted - VmHWM) / VmHWM. Exits 1 when a
rank is off by more than the tolerance (3% of VmHWM or 4 MiB, the larger),
when asked to (--check).

The prediction is what meshlm writes to run.h5: memory/process/
predicted_peak_bytes when it is there, else the sum of the categories'
predicted_bytes (the tracked buffers only).

Per node, a second line: the node's memory, the summed PSS of its ranks
(memprobe samples each rank's /proc/<pid>/smaps_rollup every 20 ms, --every-ms;
--only quick samples QUICK_SAMPLED's only; PSS
splits a page mapped by k processes 1/k to each, so the sum counts the
shared base and the libraries once), its largest sampled value against
meshlm's memory/node/predicted_peak_bytes: within 3% under --check.

With a frozen base (finetune.mode = lora), the base's part of the node in
quantized copies, the largest over each window of the run:
  copies(t) = (node PSS(t) - sum of the ranks' runtime_pss_bytes (the
              empty rank: PSS outside meshlm's buffers before the base is
              loaded) - the ranks' own predicted state) / store bytes
The windows are marked by the times rank 0's lines arrive: start-up until
"# base loading:" (state: the start-up's predicted total, the data's shuffle
order and the GEMM warm-up), base loading until "# base:" (state: the
shuffle order only; the quantizer's staging counts as the base's),
initialisation until "# model:" (state: the predicted initialisation total
without the store), training after it (the training total without the
store). A window leaves out its last 500 ms (the other ranks go on while
rank 0's line travels through mpiexec) and sums with a sample older than
its start; a window shorter than that shows no figure. Under --check, with share = node
and a store of 32 MiB or more, every window is at most 1.10 copies.
"""
import argparse
import os
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20

# mid = L6 C768 T256 B8, g124 = L12 C768 T128 B4 (both V = 50304).
MID = ["--model.n_layer=6", "--model.n_head=12", "--model.n_embd=768", "--model.vocab_size=50304",
       "--model.seq_len=256", "--model.max_seq_len=256", "--train.micro_batch_size=8"]
G124 = ["--model.n_layer=12", "--model.n_head=12", "--model.n_embd=768",
        "--model.vocab_size=50304", "--model.seq_len=128", "--model.max_seq_len=128",
        "--train.micro_batch_size=4"]
SMALL = ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=256", "--model.vocab_size=8192",
         "--model.seq_len=128", "--model.max_seq_len=128", "--train.micro_batch_size=4"]
LORA = ["--finetune.mode=lora", "--quant.type=nf4"]
# A Llama of SMALL's size: grouped-query attention (2 key/value heads for 8
# query heads: split over tp 2, replicated over tp 4), SwiGLU, untied lm_head.
LLAMA = ["--model.arch=llama", "--model.n_layer=4", "--model.n_head=8", "--model.n_kv_head=2",
         "--model.n_embd=256", "--model.intermediate_size=704", "--model.vocab_size=8192",
         "--model.seq_len=128", "--model.max_seq_len=128", "--model.tie_word_embeddings=false",
         "--train.micro_batch_size=4"]

# name: (ranks, overrides). batch_size = dp x micro_batches x micro_batch_size.
CONFIGS = {
    "mid": (1, MID + ["--train.batch_size=8"]),
    "mid_dp2_z0": (2, MID + ["--parallel.dp=2", "--train.batch_size=16"]),
    "mid_dp2_z1": (2, MID + ["--parallel.dp=2", "--parallel.zero_stage=1", "--train.batch_size=16"]),
    "mid_pp2": (2, MID + ["--parallel.pp=2", "--parallel.micro_batches=2", "--train.batch_size=16"]),
    "g124_lora": (1, G124 + LORA + ["--train.batch_size=4"]),
    "g124_lora_d2t2p2": (8, G124 + LORA + ["--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2",
                                           "--parallel.micro_batches=2", "--train.batch_size=16"]),
    "mid_tp2": (2, MID + ["--parallel.tp=2", "--train.batch_size=8"]),
    "mid_dp2_z2": (2, MID + ["--parallel.dp=2", "--parallel.zero_stage=2", "--train.batch_size=16"]),
    "mid_ckpt": (1, MID + ["--parallel.activation_checkpointing=full", "--train.batch_size=8"]),
    "mid_pp2_dp2_z1": (4, MID + ["--parallel.pp=2", "--parallel.dp=2", "--parallel.zero_stage=1",
                                 "--parallel.micro_batches=2", "--train.batch_size=32"]),
    "g124_lora_int8_tp2": (2, G124 + ["--finetune.mode=lora", "--quant.type=int8", "--parallel.tp=2",
                                      "--train.batch_size=4"]),
    "small": (1, SMALL + ["--train.batch_size=4"]),
    "small_d2t2p2_z2": (8, SMALL + ["--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2",
                                    "--parallel.zero_stage=2", "--parallel.micro_batches=2",
                                    "--train.batch_size=16"]),
    "small_dp2_z1": (2, SMALL + ["--parallel.dp=2", "--parallel.zero_stage=1", "--train.batch_size=8"]),
    "small_tp4_ckpt": (4, SMALL + ["--parallel.tp=4", "--parallel.activation_checkpointing=full",
                                   "--train.batch_size=4"]),
    "small_pp4": (4, SMALL + ["--parallel.pp=4", "--parallel.micro_batches=4", "--train.batch_size=16"]),
    "small_dp8_z2": (8, SMALL + ["--parallel.dp=8", "--parallel.zero_stage=2", "--train.batch_size=32"]),
    "small_lora": (1, SMALL + LORA + ["--train.batch_size=4"]),
    "small_lora_d2t2_z2": (4, SMALL + LORA + ["--parallel.dp=2", "--parallel.tp=2",
                                              "--parallel.zero_stage=2", "--train.batch_size=8"]),
    "g124_lora_tp2": (2, G124 + LORA + ["--parallel.tp=2", "--train.batch_size=4"]),
    "g124_lora_per_rank_dp2": (2, G124 + LORA + ["--quant.share=per_rank", "--parallel.dp=2",
                                                 "--train.batch_size=8"]),
    "mid_pp2_dp2_z2": (4, MID + ["--parallel.pp=2", "--parallel.dp=2", "--parallel.zero_stage=2",
                                 "--parallel.micro_batches=2", "--train.batch_size=32"]),
    "mid_tp2_ckpt": (2, MID + ["--parallel.tp=2", "--parallel.activation_checkpointing=full",
                               "--train.batch_size=8"]),
    "llama": (1, LLAMA + ["--train.batch_size=4"]),
    "llama_d2t2p2_z2": (8, LLAMA + ["--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2",
                                    "--parallel.zero_stage=2", "--parallel.micro_batches=2",
                                    "--train.batch_size=16"]),
    "llama_tp4_ckpt": (4, LLAMA + ["--parallel.tp=4", "--parallel.activation_checkpointing=full",
                                   "--train.batch_size=4"]),
    "llama_lora_d2t2_z2": (4, LLAMA + LORA + ["--parallel.dp=2", "--parallel.tp=2",
                                              "--parallel.zero_stage=2", "--train.batch_size=8"]),
    # train.precision bf16 / fp16: the CPU rounds each GEMM's inputs in
    # tiles held in a tracked scratch per thread (ops/precision.h).
    "mid_bf16": (1, MID + ["--train.precision=bf16", "--train.batch_size=8"]),
    "small_bf16_dp2": (2, SMALL + ["--train.precision=bf16", "--parallel.dp=2",
                                   "--train.batch_size=8"]),
    "llama_fp16_tp2": (2, LLAMA + ["--train.precision=fp16", "--parallel.tp=2",
                                   "--train.batch_size=4"]),
    "g124_lora_bf16": (1, G124 + LORA + ["--train.precision=bf16", "--train.batch_size=4"]),
}
# The node: its summed PSS, sampled, against meshlm's predicted node peak.
NODE_TOLERANCE = 0.03
# With a node-shared base, the base's part at most 1.10 quantized copies in
# every window; checked where the store is large enough (32 MiB) for the
# figure to be the base's and not the ranks' untracked mebibytes.
COPIES_LIMIT = 1.10
MARK_LAG_MS = 500
COPIES_MIN_STORE = 32 * MIB
# What the ctest (label memory) runs: the configurations that take seconds.
# The quick set (the ctest memory_accuracy_quick): each axis, ZeRO 1 and 2,
# checkpointing, 8 ranks, LoRA on a node-shared base, Llama, bf16.
QUICK = ["small", "small_tp4_ckpt", "small_pp4", "small_dp8_z2", "small_lora_d2t2_z2",
         "small_d2t2p2_z2", "g124_lora_tp2", "llama_d2t2p2_z2", "llama_lora_d2t2_z2", "small_bf16_dp2"]
# The quick set's configurations whose node PSS is sampled (--every-ms): those
# with a frozen base (its copies per node) and one of 8 ranks per family; the
# others' samples cost a core of kernel time for no other check.
QUICK_SAMPLED = {"small_lora_d2t2_z2", "g124_lora_tp2", "llama_lora_d2t2_z2", "small_d2t2p2_z2",
                 "llama_d2t2p2_z2"}


def mpiexec(n):
    cmd = ["mpiexec", "-n", str(n)]
    v = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in v or "OpenRTE" in v:
        cmd += ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    return cmd


def read_probe(prefix, rank):
    out = {"samples": []}
    with open(f"{prefix}.{rank}.txt") as f:
        for line in f:
            w = line.split()
            if w[0] == "sample":
                out["samples"].append((float(w[1]), int(w[2]) * 1024, int(w[3]) * 1024))
            elif w[0] in ("hwm_kb", "maxrss_kb"):
                out[w[0][:-3]] = int(w[1]) * 1024
            elif w[0] in ("exit", "signal"):
                out[w[0]] = int(w[1])
    return out


def predicted_peaks(run_h5):
    with h5py.File(run_h5, "r") as f:
        mem = f["memory"]
        if "predicted_peak_bytes" in mem.get("process", {}):
            return np.asarray(mem["process/predicted_peak_bytes"][...], dtype=np.int64)
        total = None
        for name in mem:
            if name != "process" and "predicted_bytes" in mem[name]:
                v = np.asarray(mem[name]["predicted_bytes"][...], dtype=np.int64)
                total = v if total is None else total + v
        return total


def run_config(build, scratch, name, ranks, overrides, steps, threads, every_ms):
    d = os.path.join(scratch, name)
    os.makedirs(d, exist_ok=True)
    probe = os.path.join(d, "probe")
    for f in os.listdir(d):
        if f.startswith("probe."):
            os.remove(os.path.join(d, f))
    data = os.path.join(scratch, "gpl3.h5")
    cmd = mpiexec(ranks) + [os.path.join(build, "tests", "meshlm_memprobe"), probe,
                            "--every-ms", str(every_ms), "--",
                            os.path.join(build, "meshlm"), "train", os.path.join(ROOT, "inputs", "tiny.cfg"),
                            "--data.path=" + data,
                            "--data.tokenize_from=/usr/share/common-licenses/GPL-3",
                            f"--train.steps={steps}", "--train.log_every=1",
                            f"--runtime.threads={threads}",
                            "--output.dir=" + os.path.join(d, "out"), "--output.overwrite=true"]
    cmd += overrides
    t0 = time.time()
    # Rank 0's lines, each with the time it arrived (CLOCK_MONOTONIC, in ms:
    # memprobe's clock), mark the phases: "# base loading:" when the frozen
    # base starts loading, "# base:" when it is loaded, "# model:" when the
    # model is made (initialisation done).
    marks = {}
    with open(os.path.join(d, "log.txt"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            t = time.clock_gettime(time.CLOCK_MONOTONIC) * 1e3
            log.write(line)
            for key, prefix in (("loading", "# base loading:"), ("base", "# base:"),
                                ("model", "# model:")):
                if line.startswith(prefix):
                    marks.setdefault(key, t)
        rc = proc.wait()
    with open(os.path.join(d, "marks.txt"), "w") as f:
        for key, t in marks.items():
            f.write(f"{key} {t:.1f}\n")
    if rc != 0:
        raise SystemExit(f"{name}: meshlm failed (exit {rc}); see {d}/log.txt")
    run_h5 = os.path.join(d, "out", "run.h5")
    pred = predicted_peaks(run_h5)
    rows, probes = [], []
    for r in range(ranks):
        p = read_probe(probe, r)
        probes.append(p)
        rows.append((r, int(pred[r]), p["hwm"], p["maxrss"]))
    return rows, node_figures(run_h5, probes, marks), time.time() - t0


def node_series(probes, ranks):
    """The summed PSS of `ranks` over time: at each sample time t of any of
    them (while all are sampled), (t, the sum of each rank's latest sample,
    the time of the oldest of those samples)."""
    series = [probes[r]["samples"] for r in ranks]
    if any(not s for s in series):
        return []
    lo = max(s[0][0] for s in series)
    hi = min(s[-1][0] for s in series)
    times = sorted({t for s in series for (t, _, _) in s if lo <= t <= hi})
    out, idx = [], [0] * len(series)
    for t in times:
        total, oldest = 0, t
        for k, s in enumerate(series):
            while idx[k] + 1 < len(s) and s[idx[k] + 1][0] <= t:
                idx[k] += 1
            total += s[idx[k]][2]
            oldest = min(oldest, s[idx[k]][0])
        out.append((t, total, oldest))
    return out


def node_figures(run_h5, probes, marks):
    """Per node: the predicted peak of its summed PSS (run.h5) against the
    largest sum memprobe sampled; with a frozen base, the base's part in
    quantized copies per phase window (see the module's docstring)."""
    with h5py.File(run_h5, "r") as f:
        mem = f["memory"]
        if "node" not in mem:
            return []
        node_of = np.asarray(mem["process/node"][...])
        node_pred = np.asarray(mem["node/predicted_peak_bytes"][...], dtype=np.int64)
        runtime_pss = np.asarray(mem["process/runtime_pss_bytes"][...], dtype=np.int64)
        quantized = np.asarray(mem["quantized/predicted_bytes"][...], dtype=np.int64)
        other = np.asarray(mem["other/predicted_bytes"][...], dtype=np.int64)
        phase = {k: np.asarray(mem[f"phases/{k}/predicted_bytes"][...], dtype=np.int64)
                 for k in ("start_up", "base_loading", "initialisation", "training")
                 if f"phases/{k}" in mem}
    out = []
    for n in range(len(node_pred)):
        ranks = [r for r in range(len(node_of)) if node_of[r] == n]
        series = node_series(probes, ranks)
        if not series:
            continue
        fig = {"node": n, "ranks": len(ranks), "predicted": int(node_pred[n]),
               "pss_peak": max(v for _, v, _ in series)}
        # The store: one copy per node under share = node (its holder's
        # quantized bytes), one per rank under per_rank.
        store = max(int(quantized[r]) for r in ranks)
        if store > 0 and all(k in marks for k in ("loading", "base", "model")):
            base_runtime = sum(int(runtime_pss[r]) for r in ranks)

            # The ranks' own tracked state in a window: the phase's predicted
            # total without the store. At start-up, the data's shuffle order
            # and the GEMM warm-up (start_up's total); while the base loads,
            # the shuffle order only (category other): the quantizer's
            # staging is the base's.
            def state(key):
                if key == "start_up":
                    return sum(int(phase[key][r]) for r in ranks)
                if key is None:
                    return sum(int(other[r]) for r in ranks)
                return sum(int(phase[key][r]) - int(quantized[r]) for r in ranks)

            windows = (("start-up", None, marks["loading"], "start_up"),
                       ("base loading", marks["loading"], marks["base"], None),
                       ("initialisation", marks["base"], marks["model"], "initialisation"),
                       ("training", marks["model"], None, "training"))
            copies = {}
            for label, a, b, key in windows:
                # Sums whose every sample lies in the window (a rank's latest
                # sample can be up to 20 ms older than the sum's time), and
                # none from the last MARK_LAG_MS before the line that ends it:
                # the other ranks go on while the line travels through mpiexec.
                vals = [v for t, v, oldest in series
                        if (a is None or oldest >= a) and (b is None or t < b - MARK_LAG_MS)]
                if vals:
                    copies[label] = (max(vals) - base_runtime - state(key)) / store
            fig.update(store=store, copies=copies, holders=sum(int(quantized[r]) > 0 for r in ranks))
        out.append(fig)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("scratch")
    ap.add_argument("--only", default="",
                    help="comma-separated configuration names; 'quick' = those that take seconds")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="runtime.threads of each rank")
    ap.add_argument("--every-ms", type=int, default=20,
                    help="memprobe's interval between samples of each rank's PSS (0: none, no node figures)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a rank is off by more than 3%% / 4 MiB")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for k, (n, o) in CONFIGS.items():
            print(k, n, " ".join(o))
        return 0
    names = QUICK if a.only == "quick" else a.only.split(",") if a.only else list(CONFIGS)
    for n in names:
        if n not in CONFIGS:
            raise SystemExit(f"unknown configuration '{n}'; --list shows them")
    os.makedirs(a.scratch, exist_ok=True)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    bad = 0
    print(f"# {'config':<20} {'rank':>4} {'predicted':>10} {'VmHWM':>10} {'maxrss':>10} {'error':>8}   (MiB)")
    for n in names:
        ranks, over = CONFIGS[n]
        every_ms = a.every_ms if a.only != "quick" or n in QUICK_SAMPLED else 0
        rows, nodes, secs = run_config(a.build, a.scratch, n, ranks, over, a.steps, a.threads, every_ms)
        worst = 0.0
        for r, pred, hwm, maxrss in rows:
            err = (pred - hwm) / hwm
            tol = max(0.03 * hwm, 4 * MIB)
            flag = "" if abs(pred - hwm) <= tol else "  OUT"
            bad += flag != ""
            worst = max(worst, abs(err))
            print(f"  {n:<20} {r:>4} {pred / MIB:>10.1f} {hwm / MIB:>10.1f} {maxrss / MIB:>10.1f} "
                  f"{100 * err:>+7.1f}%{flag}")
        pmax = max(r[1] for r in rows) / MIB
        hmax = max(r[2] for r in rows) / MIB
        print(f"# {n}: {ranks} rank(s), predicted max {pmax:.0f} MiB, VmHWM max {hmax:.0f} MiB, "
              f"error of the maxima {100 * (pmax - hmax) / hmax:+.1f}%, worst rank {100 * worst:.1f}% "
              f"({secs:.0f} s)", flush=True)
        for fig in nodes:
            err = (fig["predicted"] - fig["pss_peak"]) / fig["pss_peak"]
            flag = "" if abs(err) <= NODE_TOLERANCE else "  OUT"
            line = (f"#   node {fig['node']} ({fig['ranks']} ranks): summed PSS predicted "
                    f"{fig['predicted'] / MIB:.1f} MiB, sampled peak {fig['pss_peak'] / MIB:.1f} MiB, "
                    f"error {100 * err:+.1f}%{flag}")
            bad += flag != ""
            if "copies" in fig:
                c = fig["copies"]
                shared = fig["holders"] == 1
                over = shared and fig["store"] >= COPIES_MIN_STORE and \
                    max(c.values(), default=0) > COPIES_LIMIT
                bad += over
                line += (f" | base {fig['store'] / MIB:.1f} MiB x {fig['holders']}: "
                         + ", ".join(f"{k} {v:.3f}" for k, v in c.items()) + " copies"
                         + ("  OUT" if over else ""))
            print(line, flush=True)
    if a.check and bad:
        print(f"# {bad} rank(s) outside 3% / 4 MiB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
