"""Shared pieces of the PyTorch cross-checks of meshlm (check_gpt2_grads.py,
check_adamw.py).

Each of those scripts runs one subcommand of meshlm's reference-dump tool,
which writes an HDF5 dump, and compares the dump with a reference computed in
PyTorch. What they share lives here:

  scalar       a Python scalar from an HDF5 attribute (stored as scalar or array)
  Checks       the PASS/FAIL verdict of one dump check, `FAIL: ...` per failure
  compare      max|ref|, max|ours - ref| and their ratio for one tensor
  ratio        diff / scale, with 0 / 0 = 0 and x / 0 = inf
  run_tool     runs `TOOL SUBCOMMAND OUT.h5 ...` and checks the dump it writes
  self_test    checks a checker against a correct dump and deliberately
               corrupted ones: the first must pass, every other must fail
"""

import io
import os
import subprocess
import sys
import tempfile

import numpy as np


def scalar(v):
    return np.asarray(v).reshape(-1)[0].item()


class Checks:
    """The verdict of one dump check, printed to `out`: a `FAIL: msg` line per
    failure, and a closing PASS or FAIL line from finish()."""

    def __init__(self, out):
        self.out = out
        self.ok = True

    def fail(self, msg):
        self.ok = False
        print(f"FAIL: {msg}", file=self.out)

    def finish(self):
        """Prints the closing line; returns True on PASS."""
        print("PASS" if self.ok else "FAIL", file=self.out)
        return self.ok


def ratio(diff, scale):
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def compare(ours, ref):
    """Returns (max|ref|, max|ours - ref|, their ratio) of two arrays of the
    same shape; 0 for empty arrays. A NaN anywhere gives a NaN diff."""
    ref_max = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(ours - ref))) if ref.size else 0.0
    return ref_max, diff, ratio(diff, ref_max)


def run_tool(tool, subcommand, dump_name, options, check):
    """Runs `TOOL SUBCOMMAND OUT.h5 OPTIONS...`, OUT.h5 being `dump_name` in a
    temporary folder, and returns check(OUT.h5) (True on PASS). A tool that
    fails, or writes no dump, is a FAIL."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, dump_name)
        cmd = [tool, subcommand, path] + list(options)
        print("running:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout)
            sys.stderr.write(r.stderr)
            print(f"FAIL: tool exited with status {r.returncode}")
            return False
        if not os.path.exists(path):
            print(f"FAIL: tool did not write {path}")
            return False
        return check(path)


def self_test(variants, write, check, dump_name, width):
    """For each variant (None = correct dump, else the name of a defect) calls
    write(path, variant), then check(path, out) with the check's report going
    to a buffer. The correct dump must pass and every corrupted one must fail;
    the report is shown for the correct dump and for every wrong verdict.
    `width` pads the variant names. Returns True when all verdicts are right."""
    ok = True
    with tempfile.TemporaryDirectory() as d:
        for corrupt in variants:
            path = os.path.join(d, dump_name)
            write(path, corrupt)
            buf = io.StringIO()
            passed = check(path, buf)
            expected = corrupt is None
            good = passed == expected
            ok = ok and good
            print(f"self-test {str(corrupt or 'correct'):<{width}s}: check {'passed' if passed else 'failed'}"
                  f" ({'as expected' if good else 'WRONG'})")
            if corrupt is None or not good:
                print(buf.getvalue())
    print("SELF-TEST PASS" if ok else "SELF-TEST FAIL")
    return ok
