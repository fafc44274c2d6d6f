#!/usr/bin/env bash
# train_cuda.sh MPIEXEC1 MESHLM CFG
#
# `meshlm train CFG` on one rank, 200 steps logged every step, with
# runtime.backend = cpu (fp32) and = cuda at each train.precision; the curves
# are read from run.h5 with h5py:
#   * cuda fp32 (TF32 off): loss and gradient norm within 1e-3 relative of
#     the CPU's at each of the first 60 steps;
#   * cuda bf16 and fp16: the loss within the bf16 tolerance of the CPU's
#     fp32 curve, 1.5% at every step and 0.2% on average over the 200 (as
#     the CPU's own emulated bf16 in tests/cli/precision.sh); fp16 starts
#     from a loss scale of 4096, under which this model never overflows
#     (at 65536 a GPU run skipped one step where another did not; the
#     skipping itself is tested on the CPU, tests/cli/precision.sh);
#   * the loss falls; the rank line names the GPU.
# Exit 77 (skipped) when meshlm says this machine has no GPU it can use.
set -u
mpiexec1=$1
meshlm=$2
cfg=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=$(dirname "$cfg")/../README.md
common=(--data.path=tokens.h5 --data.tokenize_from="$text" --train.steps=200 --train.log_every=1 --runtime.threads=2)
# shellcheck disable=SC2086
timeout 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cuda_fp32 \
  --runtime.backend=cuda >cuda_fp32.log 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  if grep -q "can use no GPU" cuda_fp32.log; then
    grep -m1 "can use no GPU" cuda_fp32.log
    echo "SKIP: no GPU"
    exit 77
  fi
  cat cuda_fp32.log; echo "FAIL: the CUDA run"; exit 1
fi
# shellcheck disable=SC2086
timeout 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cpu_fp32 >cpu_fp32.log 2>&1 ||
  { cat cpu_fp32.log; echo "FAIL: the CPU run"; exit 1; }
for p in bf16 fp16; do
  # shellcheck disable=SC2086
  timeout 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cuda_$p \
    --runtime.backend=cuda --train.precision=$p --train.loss_scale=4096 >cuda_$p.log 2>&1 ||
    { cat cuda_$p.log; echo "FAIL: the CUDA $p run"; exit 1; }
done
grep -E "^# (precision|device)|device cuda:" cuda_*.log
grep -q "device cuda:" cuda_fp32.log || { echo "FAIL: the rank line names no GPU"; exit 1; }
/usr/bin/env python3 - <<'PY'
import sys
import h5py
import numpy as np
def curve(d, steps=False):
    with h5py.File(f"{d}/run.h5", "r") as f:
        if steps:
            return f["metrics/step"][()], f["metrics/loss"][()]
        return f["metrics/loss"][()], f["metrics/grad_norm"][()]
lc, gc = curve("cpu_fp32")
bad = False
lg, gg = curve("cuda_fp32")
assert len(lc) == len(lg) == 200, (len(lc), len(lg))
rl = np.abs(lg[:60] - lc[:60]) / np.abs(lc[:60])
rg = np.abs(gg[:60] - gc[:60]) / np.abs(gc[:60])
print(f"fp32: loss {lc[0]:.5f} -> {lc[-1]:.5f} (cpu), {lg[0]:.5f} -> {lg[-1]:.5f} (cuda); "
      f"largest relative difference over 60 steps: loss {rl.max():.2e} (step {rl.argmax() + 1}), "
      f"grad norm {rg.max():.2e} (step {rg.argmax() + 1})")
if not (np.all(np.isfinite(lg)) and rl.max() <= 1e-3 and rg.max() <= 1e-3 and lg[-1] < lg[0] - 0.5):
    print("FAIL: cuda fp32"); bad = True
for p in ["bf16", "fp16"]:
    s16, l16 = curve(f"cuda_{p}", steps=True)
    skipped = 200 - len(s16)
    if skipped > 0:
        print(f"FAIL: cuda {p} logged {len(l16)} steps"); bad = True; continue
    ref = lc[s16 - 1]
    d = np.abs(l16 - ref) / np.abs(ref)
    print(f"{p}: loss {l16[0]:.5f} -> {l16[-1]:.5f} (cuda) vs fp32 {lc[0]:.5f} -> {lc[-1]:.5f} "
          f"(cpu); relative difference largest {d.max():.2e} (step {s16[d.argmax()]}), "
          f"mean {d.mean():.2e}; {skipped} overflowing step(s) skipped")
    if not (np.all(np.isfinite(l16)) and d.max() <= 0.015 and d.mean() <= 0.002
            and l16[-1] < l16[0] - 0.5):
        print(f"FAIL: cuda {p}"); bad = True
sys.exit("FAIL" if bad else 0)
PY
