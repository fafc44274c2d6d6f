#!/usr/bin/env bash
# train_cuda.sh MPIEXEC1 MESHLM CFG
#
# `meshlm train CFG` on one rank with runtime.backend = cpu and = cuda (fp32,
# TF32 off), 60 steps logged every step: the two loss curves and gradient
# norms (read from run.h5 with h5py) agree within 1e-3 relative at every
# step, the loss falls, and the rank line names the GPU. Exit 77 (skipped)
# when meshlm says this machine has no GPU it can use.
set -u
mpiexec1=$1
meshlm=$2
cfg=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=$(dirname "$cfg")/../README.md
common=(--data.path=tokens.h5 --data.tokenize_from="$text" --train.steps=60 --train.log_every=1 --runtime.threads=2)
# shellcheck disable=SC2086
timeout 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cuda \
  --runtime.backend=cuda >cuda.log 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  if grep -q "can use no GPU" cuda.log; then
    grep -m1 "can use no GPU" cuda.log
    echo "SKIP: no GPU"
    exit 77
  fi
  cat cuda.log; echo "FAIL: the CUDA run"; exit 1
fi
# shellcheck disable=SC2086
timeout 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cpu >cpu.log 2>&1 ||
  { cat cpu.log; echo "FAIL: the CPU run"; exit 1; }
cat cuda.log
grep -q "device cuda:" cuda.log || { echo "FAIL: the rank line names no GPU"; exit 1; }
/usr/bin/env python3 - <<'PY'
import sys
import h5py
import numpy as np
with h5py.File("cpu/run.h5", "r") as f:
    lc, gc = f["metrics/loss"][()], f["metrics/grad_norm"][()]
with h5py.File("cuda/run.h5", "r") as f:
    lg, gg = f["metrics/loss"][()], f["metrics/grad_norm"][()]
assert len(lc) == len(lg) == 60, (len(lc), len(lg))
rl = np.abs(lg - lc) / np.abs(lc)
rg = np.abs(gg - gc) / np.abs(gc)
print(f"loss {lc[0]:.5f} -> {lc[-1]:.5f} (cpu), {lg[0]:.5f} -> {lg[-1]:.5f} (cuda); "
      f"largest relative difference: loss {rl.max():.2e} (step {rl.argmax() + 1}), "
      f"grad norm {rg.max():.2e} (step {rg.argmax() + 1})")
bad = not (np.all(np.isfinite(lg)) and rl.max() <= 1e-3 and rg.max() <= 1e-3 and lg[-1] < lg[0] - 0.5)
sys.exit("FAIL" if bad else 0)
PY
