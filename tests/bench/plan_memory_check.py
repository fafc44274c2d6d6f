#!/usr/bin/env python3
"""Runs the layouts `meshlm plan` says fit a memory limit, and some it
rejects, and measures their memory the way the system sees it:

  cpu   every rank's VmHWM, read from /proc by tests/meshlm_memprobe as the
        rank exits (not by meshlm); the largest over the ranks;
  cuda  the GPU's memory in use (nvidia-smi, polled every 50 ms during the
        run) less what was in use before it: one rank on one GPU.

  tests/bench/plan_memory_check.py BUILD SCRATCH [--ranks 4] [--backend cpu]
      [--model small|mid|gpt2-124m] [--limit auto|BYTES|20GiB] [--fits 3]
      [--rejected 2] [--steps 2] [--check] [--section.key=value ...]

The limit (--limit auto): the planner's peaks of every layout of the
search, sorted; the limit sits in the middle (geometric mean) of the widest
relative gap between consecutive peaks, leaving out the lowest and highest
eighth, so that the
layouts on either side of it are at least that gap apart. `meshlm plan
--mem-per-rank LIMIT` then splits them into fits and rejected. Run: the
planner's first layout (the fastest), the fitting ones with the largest
peaks (the nearest to the limit), the fastest rejected one (the layout the
planner would have taken without the limit) and the rejected ones with the
smallest peaks. Each row: predicted peak, measured peak, the limit, and
whether the measurement agrees with the plan. --check: exit 1 when a layout
the planner says fits measures above the limit, or a rejected one below it.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = {
    "small": ("inputs/tiny.cfg",
              ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=256", "--model.vocab_size=8192",
               "--model.seq_len=128", "--model.max_seq_len=128", "--train.batch_size=16"]),
    "mid": ("inputs/tiny.cfg",
            ["--model.n_layer=6", "--model.n_head=12", "--model.n_embd=384", "--model.vocab_size=8192",
             "--model.seq_len=256", "--model.max_seq_len=256", "--train.batch_size=16"]),
    "gpt2-124m": ("inputs/gpt2-124m.cfg", ["--train.batch_size=32"]),
}
MIB = 1 << 20


def layout_overrides(L):
    o = [f"--parallel.dp={L['dp']}", f"--parallel.tp={L['tp']}", f"--parallel.pp={L['pp']}",
         f"--parallel.zero_stage={L['zero_stage']}", f"--train.micro_batch_size={L['micro_batch_size']}",
         f"--parallel.micro_batches={L['micro_batches']}",
         f"--parallel.activation_checkpointing={L['activation_checkpointing']}",
         f"--parallel.schedule={L['schedule']}"]
    if L["pp"] > 1:
        o.append("--parallel.stage_layers=" + ",".join(str(x) for x in L["stage_layers"]))
    return o


def describe(L):
    s = (f"dp{L['dp']} tp{L['tp']} pp{L['pp']} zero{L['zero_stage']} "
         f"B{L['micro_batch_size']}x{L['micro_batches']}")
    if L["activation_checkpointing"] != "none":
        s += " ckpt"
    if L["pp"] > 1:
        s += " " + L["schedule"] + " " + ",".join(str(x) for x in L["stage_layers"])
    return s


def plan(meshlm, cfg, ranks, backend, limit, common):
    cmd = [meshlm, "plan", cfg, "--ranks", str(ranks), "--ranks-per-node", str(ranks), "--json",
           "--top", "100000", "--backend", backend, "--mem-per-rank", str(limit)] + common
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.stdout.strip() == "":
        sys.exit(f"meshlm plan failed:\n{p.stderr}")
    return json.loads(p.stdout)


def auto_limit(layouts):
    peaks = sorted({L["peak_bytes_max"] for L in layouts})
    if len(peaks) < 4:
        sys.exit("plan_memory_check: fewer than 4 distinct peaks to place a limit between")
    lo, hi = len(peaks) // 8, max(len(peaks) * 7 // 8, len(peaks) // 8 + 1)
    best = max(range(lo, hi), key=lambda i: peaks[i + 1] / peaks[i])
    return int((peaks[best] * peaks[best + 1]) ** 0.5), peaks[best + 1] / peaks[best]


class GpuPoll:
    """Largest nvidia-smi memory.used (MiB) of GPU 0 while running."""

    def __init__(self):
        self.peak, self.stop = 0, False
        self.base = self.read()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    @staticmethod
    def read():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True).stdout
        return int(out.split()[0])

    def loop(self):
        while not self.stop:
            self.peak = max(self.peak, self.read())
            time.sleep(0.05)

    def finish(self):
        self.stop = True
        self.t.join()
        return (self.peak - self.base) * MIB


def run(meshlm, build, cfg, ranks, backend, L, common, scratch, name):
    out = os.path.join(scratch, name)
    os.makedirs(out, exist_ok=True)
    probe = os.path.join(out, "probe")
    mpiexec = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(ranks)]
    prog = [meshlm, "train", cfg] + common + layout_overrides(L) + [
        f"--output.dir={out}", "--output.overwrite=true", "--checkpoint.final=false"]
    poll = GpuPoll() if backend == "cuda" else None
    # memprobe: VmHWM only, no samples of PSS over time (--every-ms 0).
    cmd = mpiexec + (prog if poll else [os.path.join(build, "tests", "meshlm_memprobe"), probe, "--every-ms", "0",
                                        "--"] + prog)
    t = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    measured = poll.finish() if poll else 0
    with open(os.path.join(out, "log.txt"), "w") as f:
        f.write(t.stdout + t.stderr)
    if t.returncode != 0:
        tail = (t.stdout + t.stderr).strip().splitlines()[-3:]
        return None, " / ".join(tail)
    if not poll:
        for r in range(ranks):
            with open(f"{probe}.{r}.txt") as f:
                for line in f:
                    if line.startswith("hwm_kb "):
                        measured = max(measured, int(line.split()[1]) * 1024)
    return measured, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("scratch")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="small", choices=sorted(MODELS))
    ap.add_argument("--limit", default="auto")
    ap.add_argument("--fits", type=int, default=3)
    ap.add_argument("--rejected", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    a, extra = ap.parse_known_args()
    meshlm = os.path.join(a.build, "meshlm")
    os.makedirs(a.scratch, exist_ok=True)
    tokens = os.path.join(a.scratch, "tokens.h5")
    if not os.path.exists(tokens):
        subprocess.run([meshlm, "tokenize", "/usr/share/common-licenses/GPL-3", tokens], check=True,
                       stdout=subprocess.DEVNULL)
    # This machine's figures (a rank's runtime memory among them), measured
    # by the ranks of a job of this size.
    rates = os.path.join(a.scratch, f"rates{a.ranks}.json")
    subprocess.run(["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n",
                    str(a.ranks), meshlm, "plan", "--calibrate", rates], check=True, stdout=subprocess.DEVNULL)
    cfg_file, model = MODELS[a.model]
    cfg = os.path.join(ROOT, cfg_file)
    common = [f"--data.path={tokens}", f"--train.steps={a.steps}", "--train.log_every=1",
              "--train.warmup_steps=1", f"--runtime.backend={a.backend}", f"--cluster.rates={rates}"] + model + extra
    if a.backend == "cpu":
        common.append(f"--runtime.threads={max(1, (os.cpu_count() or 1) // a.ranks)}")

    if a.limit == "auto":
        every = plan(meshlm, cfg, a.ranks, a.backend, str(1 << 60), common)
        limit, gap = auto_limit(every["fits"])
        how = f"auto: in a gap of {gap:.2f}x between the planned peaks of {len(every['fits'])} layouts"
    else:
        units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        mult = next((v for k, v in units.items() if a.limit.endswith(k)), 1)
        limit = int(float(a.limit[:-3] if mult > 1 else a.limit) * mult)
        how = "given"
    p = plan(meshlm, cfg, a.ranks, a.backend, str(limit), common)
    fits, rejected = p["fits"], p["rejected"]
    if not fits or not rejected:
        sys.exit(f"plan_memory_check: at {limit} bytes {len(fits)} layouts fit and {len(rejected)} "
                 "do not; need some of each")
    chosen = [("fits: the planner's first", fits[0])]
    chosen += [("fits: nearest the limit", L) for L in
               sorted(fits[1:], key=lambda L: -L["peak_bytes_max"])[:max(0, a.fits - 1)]]
    chosen += [("rejected: the fastest", rejected[0])]
    chosen += [("rejected: nearest the limit", L) for L in
               sorted(rejected[1:], key=lambda L: L["peak_bytes_max"])[:max(0, a.rejected - 1)]]

    print(f"# plan_memory_check: {a.model} on {a.ranks} ranks, backend {a.backend}; limit "
          f"{limit / MIB:.1f} MiB per rank ({how}); {len(fits)} layouts fit, {len(rejected)} do not")
    print("| layout | planner | predicted peak MiB | measured peak MiB | predicted/measured | limit MiB | agrees |")
    print("|---|---|---:|---:|---:|---:|---|")
    bad = 0
    for i, (why, L) in enumerate(chosen):
        measured, err = run(meshlm, a.build, cfg, a.ranks, a.backend, L, common, a.scratch, f"layout{i}")
        pred = L["peak_bytes_max"]
        if measured is None:
            print(f"| {describe(L)} | {why} | {pred / MIB:.1f} | run failed: {err} | | {limit / MIB:.1f} | no |")
            bad += 1
            continue
        ok = (measured <= limit) == L["fits"]
        bad += not ok
        print(f"| {describe(L)} | {why} | {pred / MIB:.1f} | {measured / MIB:.1f} | {pred / measured:.3f} | "
              f"{limit / MIB:.1f} | {'yes' if ok else 'NO'} |")
        sys.stdout.flush()
    print(f"# {len(chosen) - bad} of {len(chosen)} layouts measured on the side of the limit the plan put them")
    return 1 if (a.check and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
