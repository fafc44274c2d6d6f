#!/usr/bin/python3
"""Benchmark driver: meshlm's training step against the PyTorch CPU peer.

Usage:
  compare.py --meshlm-bench PATH [--threads 1,2] [--configs all|small|NAME[,NAME]]
             [--steps S --warmup W] [--markdown] [--budget] [--python /usr/bin/python3]
             [--tcmalloc PATH | --no-tcmalloc]

For each config and thread count N it runs

  PATH --n_layer .. --n_head .. --n_embd .. --vocab_size .. --seq_len ..
       --batch .. --threads N --steps S --warmup W
  torch_step.py (same arguments)

both with OMP_NUM_THREADS=N and OMP_WAIT_POLICY=PASSIVE. Each prints one JSON
line ({"impl": ..., "ms_per_step": ..., "tokens_per_s": ..., "gflops": ...});
the last line of stdout that parses as a JSON object is taken. Prints a
fixed-column table (ratio = meshlm tok/s / torch tok/s) and, with
--markdown, a markdown version for docs/PERFORMANCE.md headed by the date,
`uname -m`, the CPU model, the torch version and the peer's allocator.

The PyTorch peer runs at its best, as PyTorch's CPU performance tuning
guide sets it up: with tcmalloc preloaded (LD_PRELOAD of Debian's
libtcmalloc-minimal4, libtcmalloc_minimal.so.4). With glibc's malloc,
Debian's PyTorch spends most of a step in page faults: its large activation
and gradient buffers are mmap'ed and unmapped again on every step. The
preload is checked, not assumed: torch_step.py reports the allocator mapped
into its own process, and a peer that did not get tcmalloc is an error.
Without tcmalloc the driver stops, naming the package; --no-tcmalloc runs a
deliberately weakened peer on glibc's malloc, labelled "torch-glibc" in the
table. meshlm's benchmark runs without any preload.

Configs (steps timed after warmup unless --steps/--warmup are given):
  gpt2-124m  L=12 NH=12 C=768 V=50304 B=4 T=64    5 after 2
  small-a    L=4  NH=4  C=256 V=50304 B=8 T=128   10 after 3
  small-b    L=6  NH=6  C=384 V=50304 B=8 T=256   10 after 3
  llama-124m Llama L=12 NH=12 NKV=4 C=768 F=2048 V=50304 tied B=4 T=64   5 after 2
             (meshlm_bench and torch_step.py with --llama 1: RMSNorm, rope,
             grouped-query attention, SwiGLU; the peer tests/torch/llama_torch.py's
             LlamaModule)
"""

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig

CONFIGS = {
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, batch=4, seq_len=64,
                      steps=5, warmup=2),
    "small-a": dict(n_layer=4, n_head=4, n_embd=256, vocab_size=50304, batch=8, seq_len=128,
                    steps=10, warmup=3),
    "small-b": dict(n_layer=6, n_head=6, n_embd=384, vocab_size=50304, batch=8, seq_len=256,
                    steps=10, warmup=3),
    # A Llama of about GPT-2 124M's size (tied, as Llama 3.2's small models).
    "llama-124m": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, batch=4, seq_len=64,
                       steps=5, warmup=2, llama=dict(n_kv_head=4, intermediate_size=2048, tied=1)),
}
SMALL = ["small-a", "small-b"]
HERE = os.path.dirname(os.path.abspath(__file__))
TCMALLOC = "libtcmalloc_minimal.so.4"
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"


def find_tcmalloc():
    """The path of tcmalloc's shared library, or None: first the multiarch
    folders of this interpreter's architecture (Debian puts it in
    /usr/lib/<triplet>/), then ldconfig's cache, then any library folder."""
    candidates = []
    triplet = sysconfig.get_config_var("MULTIARCH")
    if triplet:
        candidates += [f"/usr/lib/{triplet}/{TCMALLOC}", f"/lib/{triplet}/{TCMALLOC}"]
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if ldconfig:
        try:
            out = subprocess.run([ldconfig, "-p"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            name, arrow, path = line.partition("=>")
            if arrow and name.split() and name.split()[0] == TCMALLOC:
                candidates.append(path.strip())
    candidates += sorted(glob.glob(f"/usr/lib*/{TCMALLOC}") + glob.glob(f"/usr/lib/*/{TCMALLOC}"))
    return next((c for c in candidates if os.path.isfile(c)), None)


def last_json(stdout):
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def run_one(cmd, threads, timeout, preload=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    if preload:
        env["LD_PRELOAD"] = preload + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
        print(f"+ LD_PRELOAD={env['LD_PRELOAD']} \\", file=sys.stderr)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    except OSError as e:
        return None, str(e)
    if r.returncode != 0:
        return None, f"exit status {r.returncode}: {r.stderr.strip()[-2000:]}"
    obj = last_json(r.stdout)
    if obj is not None:
        obj["_stderr"] = r.stderr
    if obj is None:
        return None, f"no JSON line in output: {r.stdout.strip()[-500:]}"
    for k in ["ms_per_step", "tokens_per_s", "gflops"]:
        if not isinstance(obj.get(k), (int, float)):
            return None, f"JSON line lacks numeric {k}: {obj}"
    return obj, None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model", "cpu model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def main():
    ap = argparse.ArgumentParser(description="meshlm vs PyTorch CPU training-step benchmark")
    ap.add_argument("--meshlm-bench", required=True, help="meshlm's benchmark executable")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--configs", default="all",
                    help="all | small | comma-separated names from: " + ", ".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: per config)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup steps (default: per config)")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--budget", action="store_true",
                    help="meshlm's step time budget too (meshlm_bench --budget 1: every op's time and "
                         "rate against an SGEMM and a memory copy of the same run, the GEMMs by shape, "
                         "the page faults), printed per config after the tables")
    ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                    help="interpreter with torch for torch_step.py (default: Debian's /usr/bin/python3)")
    ap.add_argument("--tcmalloc", metavar="PATH", default=None,
                    help=f"tcmalloc library preloaded into the PyTorch peer (default: Debian's {TCMALLOC}, "
                         f"package {TCMALLOC_PACKAGE}, found by the driver)")
    ap.add_argument("--no-tcmalloc", action="store_true",
                    help="run the PyTorch peer on glibc's malloc: a deliberately weakened peer, "
                         "labelled torch-glibc in the tables")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    args = ap.parse_args()

    if args.configs == "all":
        names = list(CONFIGS)
    elif args.configs == "small":
        names = SMALL
    else:
        names = [n.strip() for n in args.configs.split(",") if n.strip()]
        bad = [n for n in names if n not in CONFIGS]
        if bad:
            ap.error(f"unknown configs {bad}; known: {', '.join(CONFIGS)}")
    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        ap.error("--threads must be comma-separated integers")
    if not threads or min(threads) < 1:
        ap.error("--threads must be positive")
    bench = os.path.abspath(args.meshlm_bench)
    torch_step = os.path.join(HERE, "torch_step.py")

    # The peer's allocator: tcmalloc, or glibc's malloc only when asked for.
    if args.no_tcmalloc and args.tcmalloc:
        ap.error("--tcmalloc and --no-tcmalloc exclude each other")
    if args.no_tcmalloc:
        preload = None
        peer = "torch-glibc"
        allocator_note = "glibc malloc (--no-tcmalloc: a deliberately weakened peer, not for docs/PERFORMANCE.md)"
    else:
        preload = args.tcmalloc or find_tcmalloc()
        if not preload or not os.path.isfile(preload):
            sys.exit(f"compare.py: error: tcmalloc ({args.tcmalloc or TCMALLOC}) not found. The PyTorch "
                     f"peer runs with it preloaded, as PyTorch's CPU tuning guide advises (on glibc's "
                     f"malloc it spends most of a step in page faults). Install Debian's "
                     f"{TCMALLOC_PACKAGE} (apt-get install {TCMALLOC_PACKAGE}), or give the library "
                     f"with --tcmalloc PATH, or run a weakened peer with --no-tcmalloc.")
        preload = os.path.abspath(preload)
        peer = "torch"
        allocator_note = f"tcmalloc (LD_PRELOAD={preload})"
    print(f"# PyTorch peer: {allocator_note}; OMP_WAIT_POLICY=PASSIVE", flush=True)

    rows, errors, torch_version, peer_allocators = [], [], None, set()
    for name in names:
        c = CONFIGS[name]
        steps = args.steps if args.steps is not None else c["steps"]
        warmup = args.warmup if args.warmup is not None else c["warmup"]
        for n in threads:
            common = ["--n_layer", str(c["n_layer"]), "--n_head", str(c["n_head"]), "--n_embd", str(c["n_embd"]),
                      "--vocab_size", str(c["vocab_size"]), "--seq_len", str(c["seq_len"]),
                      "--batch", str(c["batch"]), "--threads", str(n), "--steps", str(steps),
                      "--warmup", str(warmup)]
            if "llama" in c:
                common += ["--llama", "1"] + [a for k, v in c["llama"].items() for a in (f"--{k}", str(v))]
            m, err = run_one([bench] + common + (["--budget", "1"] if args.budget else []), n, args.timeout)
            if err:
                errors.append(f"{name} threads={n} meshlm: {err}")
            t, err = run_one([args.python, torch_step] + common, n, args.timeout, preload)
            if err:
                errors.append(f"{name} threads={n} pytorch: {err}")
            elif preload and not str(t.get("allocator", "")).startswith("libtcmalloc"):
                # e.g. a library of another architecture, which ld.so ignores with a warning
                errors.append(f"{name} threads={n} pytorch: LD_PRELOAD={preload} did not take effect "
                              f"(the peer reports allocator {t.get('allocator')!r})")
                t = None
            elif not preload and t.get("allocator") != "glibc":
                errors.append(f"{name} threads={n} pytorch: --no-tcmalloc, but the peer reports "
                              f"allocator {t.get('allocator')!r} (an LD_PRELOAD in the environment?)")
                t = None
            if t and t.get("torch"):
                torch_version = t["torch"]
            if t and t.get("allocator"):
                peer_allocators.add(t["allocator"])
            ratio = m["tokens_per_s"] / t["tokens_per_s"] if m and t and t["tokens_per_s"] > 0 else None
            rows.append(dict(config=name, threads=n, m=m, t=t, ratio=ratio))

    header = ["config", "threads", "meshlm ms/step", "meshlm tok/s", "meshlm GFLOP/s",
              f"{peer} ms/step", f"{peer} tok/s", "ratio"]
    widths = [max(w, len(h)) for w, h in zip([10, 7, 14, 12, 14, 13, 11, 6], header)]
    cells = []
    for r in rows:
        m, t = r["m"] or {}, r["t"] or {}
        cells.append([r["config"], str(r["threads"]),
                      fmt(m.get("ms_per_step"), ".1f"), fmt(m.get("tokens_per_s"), ".0f"),
                      fmt(m.get("gflops"), ".2f"),
                      fmt(t.get("ms_per_step"), ".1f"), fmt(t.get("tokens_per_s"), ".0f"),
                      fmt(r["ratio"], ".2f")])
    print("  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for row in cells:
        print("  ".join(v.rjust(w) if i > 1 else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))))

    if preload and peer_allocators:  # the library the peers really mapped, with its version
        allocator_note = f"tcmalloc, {', '.join(sorted(peer_allocators))} (LD_PRELOAD={preload})"
    if args.markdown:
        uname_m = subprocess.run(["uname", "-m"], stdout=subprocess.PIPE, text=True).stdout.strip() \
            or platform.machine()
        print()
        print(f"Date: {datetime.date.today().isoformat()}; machine: `{uname_m}`, {cpu_model()}; "
              f"torch {torch_version or 'unknown'}; OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS = threads; "
              f"PyTorch peer's allocator: {allocator_note}.")
        print()
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|")
        for row in cells:
            print("| " + " | ".join(row) + " |")

    if args.budget:
        for r in rows:
            lines = [l for l in (r["m"] or {}).get("_stderr", "").splitlines() if l.startswith(("|", "#"))]
            if lines:
                print(f"\n### Step budget: {r['config']}, {r['threads']} thread(s)\n")
                print("\n".join(lines))

    for e in errors:
        print("error: " + e, file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
