#!/usr/bin/python3
"""`meshlm ckpt inspect | stats | diff | verify` against h5py and numpy, on
checkpoints written by make_fixture.py (the format of docs/formats.md,
written without meshlm), each run as `MPIEXEC meshlm ckpt ...` on 2 ranks in
a scratch directory whose files must be left as they were (the tools write
nothing). One case per ctest:

usage: check_tools.py --mpiexec "mpiexec -n 2 ..." --meshlm PATH CASE

cases: inspect, stats, stats_blocks, diff, verify_good, verify_bitflip,
verify_truncated, verify_no_checksum, verify_format_version, verify_not_a_checkpoint,
arguments, plot_run (also --config FILE --plot PATH)
"""
import argparse
import hashlib
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixture  # noqa: E402

failures = []
# A tool that hangs fails its case; mpiexec of 2 ranks on a loaded machine
# starts in a few seconds.
TIMEOUT_S = 120


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def snapshot(d):
    """{relative path: sha256} of every file below d."""
    out = {}
    for root, _, files in os.walk(d):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, d)] = hashlib.sha256(f.read()).hexdigest()
    return out


class Runner:
    def __init__(self, mpiexec, meshlm, scratch):
        self.mpiexec = shlex.split(mpiexec)
        self.meshlm = os.path.abspath(meshlm)
        self.scratch = scratch

    def ckpt(self, *args, expect_ok=True):
        """Runs `meshlm ckpt ARGS` in the scratch directory; returns (rc, stdout, stderr).
        Checks that nothing there was created, changed or removed."""
        cmd = self.mpiexec + [self.meshlm, "ckpt"] + [str(a) for a in args]
        tool = args[0] if args else "(no tool)"
        print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
        before = snapshot(self.scratch)
        try:
            p = subprocess.run(cmd, cwd=self.scratch, capture_output=True, text=True,
                               timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            check(False, f"meshlm ckpt {tool} ended within {TIMEOUT_S} s (no hang)")
            return 124, "", ""
        sys.stdout.write(p.stdout)
        sys.stdout.write(p.stderr)
        check(snapshot(self.scratch) == before, f"meshlm ckpt {tool} wrote nothing")
        if expect_ok is not None:
            check((p.returncode == 0) == expect_ok,
                  f"meshlm ckpt {tool} exits {'0' if expect_ok else 'non-zero'} (got {p.returncode})")
        if p.returncode != 0:
            # An error of some ranks only is printed "ERROR on rank N:" and aborts the job.
            check(re.search(r"ERROR on rank \d+:", p.stdout + p.stderr) is None,
                  f"meshlm ckpt {tool}: every rank reached the error (the job was not aborted)")
        return p.returncode, p.stdout, p.stderr


def rows(stdout, sep=None):
    """The data rows of a tool's output (lines not starting with '#'), split."""
    return [l.split(sep) if sep else l.split() for l in stdout.splitlines()
            if l.strip() and not l.startswith("#")]


def close(a, b, rel=1e-10, abs_=0.0):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_)


def reference_stats(arrays):
    """numpy: the tool's columns over the values of `arrays` together."""
    x = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    fin = x[np.isfinite(x)]
    n = fin.size
    return dict(numel=x.size,
                min=fin.min() if n else math.nan, max=fin.max() if n else math.nan,
                mean=fin.mean() if n else math.nan, std=fin.std() if n else math.nan,
                l2=math.sqrt(np.sum(fin * fin)), nan=int(np.isnan(x).sum()),
                inf=int(np.isinf(x).sum()))


def compare_stats(label, got, ref):
    """got: the 8 printed columns (strings); ref: reference_stats."""
    keys = ["numel", "min", "max", "mean", "std", "l2", "nan", "inf"]
    g = dict(zip(keys, got))
    ok = int(g["numel"]) == ref["numel"] and int(g["nan"]) == ref["nan"] \
        and int(g["inf"]) == ref["inf"]
    ok = ok and float(g["min"]) == ref["min"] and float(g["max"]) == ref["max"]
    scale = ref["l2"] / math.sqrt(max(ref["numel"], 1)) + 1e-300
    for k in ("mean", "std", "l2"):
        ok = ok and close(float(g[k]), float(ref[k]), 1e-10, 1e-13 * scale)
    if not ok:
        print(f"      {label}: meshlm {g}\n      {label}: numpy  {ref}")
    return ok


def all_datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[...]
        f.visititems(visit)
    return out


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def case_inspect(r, d):
    path = os.path.join(d, "ckpt.h5")
    make_fixture.write(path)
    rc, out, _ = r.ckpt("inspect", "ckpt.h5")
    listed = {row[0]: row for row in rows(out) if len(row) == 8 and row[1] == "dataset"}
    groups = {row[0] for row in rows(out) if len(row) >= 2 and row[1] == "group"}
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        check(sorted(listed) == sorted(names), f"inspect lists the {len(names)} datasets, no more")
        bad = []
        for n in names:
            row, ds = listed.get(n), f[n]
            want = ["x".join(str(s) for s in ds.shape), "float32", str(ds.size * 4),
                    str(len(ds.attrs)), f"{int(ds.attrs['xxh3']):016x}", "same"]
            if row is None or row[2:] != want:
                bad.append(f"{n}: {row} != {want}")
        check(not bad, "every dataset's shape, dtype, bytes, attributes, xxh3 and "
              "/meta/checksums agreement as h5py reads them" + "".join("\n      " + b for b in bad))
    check({"/", "params/", "optimizer/", "meta/", "meta/checksums/"} <= groups,
          "the groups are listed, /meta/checksums among them")
    n_params = sum(1 for n in names if n.startswith("params/"))
    check(re.search(rf"^\s+params\s+{n_params}\s", out, re.M) is not None,
          f"totals: params has {n_params} datasets")
    check(re.search(r"^\s+step\s+int64\s+100$", out, re.M) is not None, "/meta step = 100 shown")
    check(re.search(r"^\s+kind\s+string\s+'meshlm checkpoint'$", out, re.M) is not None,
          "/meta kind shown as a string")
    check("[model]" not in out and re.search(r"config\s+string\s+\(\d+ lines", out) is not None,
          "config summarised (lines, bytes) without --config")
    rc, out, _ = r.ckpt("inspect", "ckpt.h5", "--config")
    check("[model]" in out and "n_embd = 16" in out, "--config prints the parameter file")
    check(out.count("# inspect ") == 1, "printed once on 2 ranks")


def stats_case(r, d, **fixture):
    path = os.path.join(d, "ckpt.h5")
    make_fixture.write(path, **fixture)
    data = all_datasets(path)
    rc, out, _ = r.ckpt("stats", "ckpt.h5", "--layers", "--format", "tsv")
    section, per = None, {"dataset": [], "layer": []}
    for line in out.splitlines():
        if line.startswith("# per dataset"):
            section = "dataset"
        elif line.startswith("# per layer"):
            section = "layer"
        elif line and not line.startswith("#") and section:
            per[section].append(line.split("\t"))
    got = {row[0]: row for row in per["dataset"]}
    check(sorted(got) == sorted(data), f"stats has one row per dataset ({len(data)})")
    bad = [n for n, a in data.items()
           if n not in got or not (got[n][1] == "x".join(map(str, a.shape))
                                and compare_stats(n, got[n][2:], reference_stats([a])))]
    check(not bad, "per dataset: numel, min, max, mean, std, l2, nan, inf equal numpy's "
          f"(float64, finite values; 1e-10 relative){' -- differ: ' + ', '.join(bad) if bad else ''}")

    def group(name):
        parts = name.split("/")
        s, t = parts[0], "/".join(parts[1:])
        if s in ("optimizer", "lora"):
            s, t = s + "/" + parts[-1], "/".join(parts[1:-1])
        m = re.match(r"^(h\.\d+)\.", t)
        if m:
            return s, m.group(1)
        if t.startswith(("wte.", "wpe.")):
            return s, "embeddings"
        return s, t.split(".")[0]

    groups = {}
    for n, a in data.items():
        groups.setdefault(group(n), []).append(a)
    lgot = {(row[0], row[1]): row for row in per["layer"]}
    check(sorted(lgot) == sorted(groups),
          f"--layers has one row per set and layer ({len(groups)}: embeddings, h.<l>, ln_f "
          "of params, optimizer/m, optimizer/v)")
    bad = [f"{k}" for k, arrs in groups.items()
           if k not in lgot or not (int(lgot[k][2]) == len(arrs)
                                 and compare_stats(str(k), lgot[k][3:], reference_stats(arrs)))]
    check(not bad, f"per layer: the statistics of the group's values together equal numpy's"
          f"{' -- differ: ' + ', '.join(bad) if bad else ''}")
    layers = [row[1] for row in per["layer"] if row[0] == "params"]
    check(layers[:1] == ["embeddings"] and layers[-1:] == ["ln_f"], f"layers in model order: {layers}")
    # The aligned table holds the same rows.
    rc, out, _ = r.ckpt("stats", "ckpt.h5")
    check(len([row for row in rows(out) if len(row) == 10]) == len(data),
          "the aligned table has a row of 10 columns per dataset")
    return data


def case_stats(r, d):
    data = stats_case(r, d, nonfinite="h.0.attn.c_attn.weight")
    check(np.isnan(data["params/h.0.attn.c_attn.weight"]).sum() == 2,
          "(the fixture holds NaNs and infinities in one tensor)")


def case_stats_blocks(r, d):
    # wte is 8192 x 192 float32 (6 MiB): more than one block of 4 MiB (5461
    # rows, then 2731), so the per-block statistics are merged. Its mean is
    # 1e4 and its std 0.02: std from E[x^2] - mean^2 in double would be
    # wrong by about 1e-5 relative there, far beyond the 1e-10 allowed.
    stats_case(r, d, n_layer=1, n_head=2, n_embd=192, vocab=8192, offset=("wte.weight", 1e4))


def case_diff(r, d):
    a, b, c = (os.path.join(d, n) for n in ("a.h5", "b.h5", "c.h5"))
    name = "h.1.mlp.c_fc.weight"
    da = make_fixture.write(a, seed=7)
    db = make_fixture.write(b, seed=7, perturb=(name, 1e-3))
    rc, out, _ = r.ckpt("diff", "a.h5", "b.h5", "--top", "0", "--format", "tsv")
    table = [row for row in rows(out, "\t") if len(row) == 7]
    check(len(table) == len(da), f"one row per dataset in both ({len(da)})")
    check(table[0][0] == "params/" + name, f"the perturbed tensor ranks first: {table[0][0]}")
    x = da["params/" + name].astype(np.float64)
    y = db["params/" + name].astype(np.float64)
    rel = np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)
    mx = np.abs(x - y).max()
    check(close(float(table[0][2]), rel, 1e-10) and close(float(table[0][3]), mx, 1e-12),
          f"its rel_diff {table[0][2]} = numpy's {rel:.17g}, max_abs {table[0][3]} = {mx:.17g}")
    check(table[0][6] == "no" and all(row[2] == "0" and row[6] == "yes" for row in table[1:]),
          "every other dataset is identical, rel_diff 0")
    check("# 0 attributes differ" in out, "no attribute differs")

    # --top, and one file's extra, missing and reshaped datasets, attributes.
    shutil.copy(b, c)
    with h5py.File(c, "r+") as f:
        del f["optimizer/ln_f.bias/v"]
        f.create_dataset("extra/x", data=np.zeros(3, np.float32))
        del f["params/wpe.weight"]
        f.create_dataset("params/wpe.weight", data=np.zeros((16, 16), np.float32))
        f["meta"].attrs["step"] = np.int64(200)
        f["meta"].attrs["config"] = f["meta"].attrs["config"].replace("lr = 0.001", "lr = 0.002")
    rc, out, _ = r.ckpt("diff", "a.h5", "c.h5", "--top", "3")
    table = [row for row in rows(out) if len(row) == 7]
    check(len(table) == 3 and table[0][0] == "params/" + name,
          "--top 3 prints 3 rows, the perturbed tensor first")
    check(re.search(rf"# \.\.\. {len(da) - 2 - 3} more datasets", out) is not None,
          "says how many rows --top left out")
    check("# only in A: optimizer/ln_f.bias/v" in out, "a dataset only in A is listed")
    check("# only in B: extra/x" in out, "a dataset only in B is listed")
    check("# shapes differ: params/wpe.weight: 32x16 in A, 16x16 in B" in out,
          "a shape mismatch is reported with both shapes")
    check(re.search(r"/meta:step\s+A: 100 \(int64\)\s+B: 200 \(int64\)", out) is not None,
          "/meta step differs: both values")
    check("A: lr = 0.001" in out and "B: lr = 0.002" in out,
          "the config attribute's differing lines")


def flip_bit(path, dataset, element, bit):
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        offset = ds.id.get_offset()
        assert offset is not None, "contiguous dataset expected"
    with open(path, "r+b") as f:
        f.seek(offset + 4 * element + bit // 8)
        byte = f.read(1)[0]
        f.seek(offset + 4 * element + bit // 8)
        f.write(bytes([byte ^ (1 << (bit % 8))]))


def case_verify_good(r, d):
    path = os.path.join(d, "ckpt.h5")
    data = make_fixture.write(path)
    rc, out, _ = r.ckpt("verify", "ckpt.h5")
    status = {row[0]: row[-1] for row in rows(out) if len(row) == 6}
    check(sorted(status) == sorted(data) and set(status.values()) == {"ok"},
          f"every one of the {len(data)} datasets ok")
    check(re.search(r"# verify ckpt\.h5: OK", out) is not None, "says OK")
    check(out.count("# verify ckpt.h5: OK") == 1, "printed once on 2 ranks")


def case_verify_bitflip(r, d):
    path = os.path.join(d, "ckpt.h5")
    name = "params/h.0.mlp.c_fc.weight"
    data = make_fixture.write(path)
    flip_bit(path, name, element=37, bit=3)
    flipped = data[name].copy().reshape(-1)
    flipped.view(np.uint32)[37] ^= 1 << 3
    with h5py.File(path, "r") as f:
        check(np.array_equal(f[name][...].reshape(-1), flipped), "(one bit of the raw bytes flipped)")
        stored = int(f[name].attrs["xxh3"])
    computed = xxhash.xxh3_64_intdigest(flipped.astype("<f4").tobytes())
    rc, out, err = r.ckpt("verify", "ckpt.h5", expect_ok=False)
    want = f"{name}: checksum mismatch (stored {stored:016x}, computed {computed:016x})"
    check(want in err and "ckpt.h5" in err.split(want)[0],
          f"the error names the file and the tensor: {want}")
    check(err.count("ERROR") == 1, "one error line on 2 ranks")
    bad = [row[0] for row in rows(out) if len(row) == 6 and row[-1] == "BAD"]
    check(bad == [name], f"only that dataset is BAD: {bad}")


def case_verify_truncated(r, d):
    path = os.path.join(d, "ckpt.h5")
    make_fixture.write(path)
    with open(path, "rb") as f:
        raw = f.read()
    with open(os.path.join(d, "cut.h5"), "wb") as f:
        f.write(raw[: len(raw) // 2])
    for tool in ("verify", "inspect", "stats"):
        rc, out, err = r.ckpt(tool, "cut.h5", expect_ok=False)
        check(re.search(r"ERROR: .*cut\.h5", err) is not None and "truncated" in err,
              f"{tool}: a clear error naming the truncated file")
    rc, out, err = r.ckpt("verify", "missing.h5", expect_ok=False)
    check("missing.h5: no such file" in err, "a missing file is named")
    with open(os.path.join(d, "text.h5"), "w") as f:
        f.write("not hdf5\n" * 100)
    rc, out, err = r.ckpt("verify", "text.h5", expect_ok=False)
    check("text.h5: not an HDF5 file" in err, "a file that is not HDF5 is named")


def case_verify_no_checksum(r, d):
    path = os.path.join(d, "ckpt.h5")
    make_fixture.write(path)
    shutil.copy(path, os.path.join(d, "meta.h5"))
    with h5py.File(path, "r+") as f:
        del f["optimizer/wpe.weight/v"].attrs["xxh3"]
    rc, out, err = r.ckpt("verify", "ckpt.h5", expect_ok=False)
    check("optimizer/wpe.weight/v: no xxh3 attribute" in err,
          "a dataset without its xxh3 attribute is an error naming it")
    with h5py.File(os.path.join(d, "meta.h5"), "r+") as f:
        del f["meta/checksums"].attrs["params/ln_f.bias"]
    rc, out, err = r.ckpt("verify", "meta.h5", expect_ok=False)
    check("params/ln_f.bias: no entry in /meta/checksums" in err,
          "a dataset missing from /meta/checksums is an error naming it")


def case_verify_format_version(r, d):
    path = os.path.join(d, "ckpt.h5")
    make_fixture.write(path)
    with h5py.File(path, "r+") as f:
        f["meta"].attrs["format_version"] = np.int64(2)
    rc, out, err = r.ckpt("verify", "ckpt.h5", expect_ok=False)
    check("/meta format_version is 2" in err, "format_version 2 is refused, named")


def case_verify_not_a_checkpoint(r, d):
    path = os.path.join(d, "ckpt.h5")
    make_fixture.write(path)
    with h5py.File(path, "r+") as f:
        f["meta"].attrs["kind"] = "something else"
    rc, out, err = r.ckpt("verify", "ckpt.h5", expect_ok=False)
    check("/meta kind is 'something else', not 'meshlm checkpoint'" in err, "a wrong kind is named")
    with h5py.File(os.path.join(d, "plain.h5"), "w") as f:
        f["x"] = np.ones(3, np.float32)
    rc, out, err = r.ckpt("verify", "plain.h5", expect_ok=False)
    check("no /meta group" in err, "an HDF5 file without /meta is not a checkpoint")


def case_arguments(r, d):
    make_fixture.write(os.path.join(d, "ckpt.h5"))
    rc, out, _ = r.ckpt("--help")
    check(all(f"meshlm ckpt {t} " in out for t in
              ("inspect", "stats", "diff", "verify", "export", "import")),
          "--help describes every tool")
    check(all(o in out for o in ("--config", "--layers", "--top", "--format")),
          "--help describes every option")
    rc, out, _ = r.ckpt("help")
    check("meshlm ckpt verify" in out, "`meshlm ckpt help` too")
    rc, out, _ = r.ckpt("stats", "--help")
    check("meshlm ckpt stats FILE" in out, "`meshlm ckpt stats --help` gives its usage")
    for args, want in [(["frobnicate"], "unknown tool 'frobnicate'"),
                       ([], "needs a tool"),
                       (["stats", "ckpt.h5", "--bogus"], "unknown option '--bogus'"),
                       (["stats", "ckpt.h5", "--layer"], "unknown option '--layer'; did you mean '--layers'?"),
                       (["diff", "ckpt.h5"], "needs 2 files, got 1"),
                       (["diff", "ckpt.h5", "ckpt.h5", "--top", "many"], "--top 'many'"),
                       (["diff", "ckpt.h5", "ckpt.h5", "--top"], "option --top needs a value"),
                       (["stats", "ckpt.h5", "--format", "csv"], "--format 'csv'"),
                       (["inspect", "ckpt.h5", "--config=yes"], "takes no value")]:
        rc, out, err = r.ckpt(*args, expect_ok=False) if args else r.ckpt(expect_ok=False)
        check(want in err and err.count("ERROR") == 1,
              f"meshlm ckpt {' '.join(args)}: one error naming {want!r}")


def case_plot_run(r, d, config, plot):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        check(False, "matplotlib imports (Debian: apt-get install python3-matplotlib)")
        return
    # Held-out tokens, evaluated every 3 steps: plotted on the loss axis.
    with h5py.File(os.path.join(d, "val.h5"), "w") as f:
        f["tokens"] = np.frombuffer(b"held-out text, " * 200, dtype=np.uint8).astype(np.uint16)
    cmd = r.mpiexec + [r.meshlm, "train", os.path.abspath(config), "--output.dir=out", "--data.path=tokens.h5",
                       "--train.steps=6", "--train.log_every=2", "--data.val_path=val.h5",
                       "--train.eval_every=3", "--train.eval_batches=2"]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=240)
    print(p.stdout, p.stderr)
    check(p.returncode == 0 and os.path.exists(os.path.join(d, "out", "run.h5")),
          "a training run on 2 ranks wrote out/run.h5")
    make_fixture.write(os.path.join(d, "step_a.h5"), seed=1)
    make_fixture.write(os.path.join(d, "step_b.h5"), seed=2)
    with h5py.File(os.path.join(d, "step_b.h5"), "r+") as f:
        f["meta"].attrs["step"] = np.int64(200)
    cmd = [sys.executable, os.path.abspath(plot), "out", "--checkpoint", "step_a.h5", "step_b.h5", "-o", "plots"]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=240)
    print(p.stdout, p.stderr)
    check(p.returncode == 0, "plot_run.py exits 0")
    check("val_loss: 2 evaluations plotted" in p.stdout,
          "the held-out loss of the run's 2 evaluations is plotted")
    want = ["loss_lr.png", "tokens_per_s.png", "memory.png", "timing.png",
            "norms_step_a.png", "norms_step_b.png", "norms_over_checkpoints.png"]
    for name in want:
        f = os.path.join(d, "plots", name)
        ok = os.path.exists(f) and os.path.getsize(f) > 1000
        if ok:
            with open(f, "rb") as fh:
                ok = fh.read(8) == b"\x89PNG\r\n\x1a\n"
        check(ok, f"plots/{name} is a non-empty PNG")
    # The run log's own path works too.
    p = subprocess.run([sys.executable, os.path.abspath(plot), "out/run.h5", "-o", "plots2"], cwd=d,
                       capture_output=True, text=True, timeout=240)
    print(p.stdout, p.stderr)
    check(p.returncode == 0 and os.path.getsize(os.path.join(d, "plots2", "loss_lr.png")) > 1000,
          "plot_run.py takes the run.h5 path as well")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--config", help="parameter file of the training run (plot_run)")
    ap.add_argument("--plot", help="jobscripts/plot_run.py (plot_run)")
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = Runner(a.mpiexec, a.meshlm, d)
        if a.case == "plot_run":
            case_plot_run(r, d, a.config, a.plot)
        else:
            CASES[a.case](r, d)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
