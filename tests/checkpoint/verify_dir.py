#!/usr/bin/env python3
"""verify_dir.py DIR [--latest STEP] [--steps S1,S2,...]

Independent check (h5py + xxhash) of a checkpoint directory: every
step_*.h5 is complete (every dataset's XXH3-64 equals its attribute and its
/meta/checksums entry, /meta says kind and format_version 1), `latest` names
one of them, and no temporary file is left. With --latest, `latest` must name
that step; with --steps, exactly those checkpoints must be there.
"""
import argparse, glob, os, re, sys
import h5py, numpy as np, xxhash

def verify(path):
    with h5py.File(path, "r") as f:
        meta = f["meta"].attrs
        assert meta["kind"] == "meshlm checkpoint", path
        assert int(meta["format_version"]) == 1, path
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert names, f"{path}: no datasets"
        sums = f["meta/checksums"].attrs
        for n in names:
            data = np.ascontiguousarray(f[n][()], dtype="<f4")
            h = xxhash.xxh3_64_intdigest(data.tobytes())
            assert int(f[n].attrs["xxh3"]) == h, f"{path}: {n}: attribute differs from content"
            assert int(sums[n]) == h, f"{path}: {n}: /meta/checksums differs from content"
        return int(meta["step"])

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--latest", type=int)
    ap.add_argument("--steps")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "step_*.h5")))
    steps = [verify(p) for p in files]
    for p, s in zip(files, steps):
        assert os.path.basename(p) == f"step_{s:08d}.h5", f"{p} holds step {s}"
    left = [n for n in os.listdir(a.dir) if ".tmp." in n]
    assert not left, f"temporary files left: {left}"
    latest = open(os.path.join(a.dir, "latest")).read().strip()
    assert os.path.join(a.dir, latest) in files, f"latest names {latest}, not a complete checkpoint"
    if a.latest is not None:
        assert latest == f"step_{a.latest:08d}.h5", f"latest is {latest}, expected step {a.latest}"
    if a.steps is not None:
        want = sorted(int(x) for x in a.steps.split(","))
        assert sorted(steps) == want, f"checkpoints of steps {sorted(steps)}, expected {want}"
    print(f"{a.dir}: {len(files)} complete checkpoint(s) {steps}, latest {latest}")

if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL:", e)
        sys.exit(1)
