#!/usr/bin/env python3
"""This machine's figures for the planner tests, measured once (the ctest
fixture plan_rates, run alone: plan_orders_layouts compares them with timed
steps): `meshlm plan --calibrate` under mpiexec -n 2 (or 1 on one core),
over a file that an older meshlm's calibration wrote (fewer keys, no cores),
which it must rewrite. plan_matches_train checks what the file holds;
plan_orders_layouts estimates its layouts with it.

  calibrate_rates.py MPIEXEC MESHLM OUT.json
"""
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layouts import calibrate  # noqa: E402

mpiexec, meshlm, out = shlex.split(sys.argv[1]), sys.argv[2], sys.argv[3]
os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
with open(out, "w") as f:
    json.dump({"what": "meshlm plan --calibrate", "cores": 0}, f)
r = calibrate(mpiexec, meshlm, out)
print(r.stdout + r.stderr)
if r.returncode != 0:
    os.remove(out)  # no half-calibrated file for the tests that read it
    sys.exit(f"FAIL: meshlm plan --calibrate exited {r.returncode}")
