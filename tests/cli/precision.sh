#!/usr/bin/env bash
# precision.sh "MPIEXEC LINE (2 ranks)" "MPIEXEC LINE (1 rank)" MESHLM TINY_CFG
#
# train.precision on the CPU backend, which emulates the rounding of the GEMM
# inputs (ops/precision.h):
#   1. bf16, 200 steps of tiny.cfg on one rank: the loss curve follows fp32's
#      within the bf16 tolerance (1.5% of the loss at every step, 0.2% on
#      average) but is not fp32's bit for bit (the rounding happened);
#      the loss falls. The same on two ranks (dp = 2).
#   2. fp16 from train.loss_scale = 2^32: the first steps overflow for real
#      (scaled gradients beyond fp16's 65504), each is skipped, logged and
#      counted, the scale halves until it fits, and the run then trains.
#   3. fp16 with a NaN injected into one step's gradient (debug.nan_step):
#      under train.on_nonfinite = stop the step is an overflow, not an
#      error; it is skipped and the scale halves once.
#   4. fp16 with gradients that stay NaN: once the scale has halved below
#      2^-24 the run ends with an error naming the step.
#   5. LoRA on an NF4 base at bf16 (the dequantized tiles rounded like any
#      GEMM input): 100 steps follow LoRA at fp32 within the bf16 tolerance,
#      not bit for bit, and the loss falls (by 0.15 in 100 steps: the
#      base is a random GPT-2, which a low-rank adapter can do little with).
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
mpiexec2=$1
mpiexec1=$2
meshlm=$3
tiny=$4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail=0
"$meshlm" tokenize /usr/share/common-licenses/GPL-3 tokens.h5 >/dev/null || exit 1
train() {  # train MPIEXEC NAME ARGS...: the run's log in NAME.log, its exit status returned
  local mpi=$1 name=$2
  shift 2
  # shellcheck disable=SC2086
  bash "$limit" 300 $mpi "$meshlm" train "$tiny" --data.path=tokens.h5 --runtime.threads=1 \
    --output.dir="$name" "$@" >"$name.log" 2>&1
}
must() {  # must NAME REGEX: NAME.log matches
  if ! grep -Eq -- "$2" "$1.log"; then
    echo "FAIL $1: output does not match: $2"; tail -20 "$1.log"; fail=1
  fi
}

# 1. bf16 against fp32
for run in "fp32 $mpiexec1 fp32" "bf16 $mpiexec1 bf16" "bf16_dp2 $mpiexec2 bf16"; do
  set -- $run
  name=$1; p=${*: -1}; mpi=${run#"$name "}; mpi=${mpi% "$p"}
  train "$mpi" "$name" --train.steps=200 --train.log_every=1 --train.precision="$p" ||
    { echo "FAIL $name: exit status $?"; tail -20 "$name.log"; fail=1; }
done
must bf16 "# precision: bf16 GEMM inputs, fp32 accumulation \(emulated on the CPU\)"
# compare REFERENCE STEPS FALL NAME...: each run NAME logged STEPS losses
# that follow REFERENCE's within the bf16 tolerance (1.5% of the loss at
# every step, 0.2% on average) without being its bits, and fell by FALL.
compare() {
  /usr/bin/python3 - "$@" <<'PY'
import sys
import h5py
import numpy as np
ref, steps, fall, names = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
def curve(d):
    with h5py.File(f"{d}/run.h5", "r") as f:
        return f["metrics/loss"][()], f["metrics/grad_norm"][()]
l32, g32 = curve(ref)
bad = False
for name in names:
    l16, g16 = curve(name)
    if len(l16) != steps or len(l32) != steps:
        print(f"FAIL {name}: {len(l16)} and {len(l32)} logged steps, not {steps}"); bad = True; continue
    d = np.abs(l16 - l32) / np.abs(l32)
    print(f"{name}: loss {l16[0]:.4f} -> {l16[-1]:.4f} ({ref} {l32[0]:.4f} -> {l32[-1]:.4f}); "
          f"largest relative difference from {ref} {d.max():.2e} at step {d.argmax() + 1}, "
          f"mean {d.mean():.2e}")
    if not np.all(np.isfinite(l16)) or d.max() > 0.015 or d.mean() > 0.002:
        print(f"FAIL {name}: the loss curve leaves {ref}'s by more than the bf16 tolerance"); bad = True
    if np.array_equal(l16, l32) and np.array_equal(g16, g32):
        print(f"FAIL {name}: bit for bit {ref}'s curve: nothing was rounded"); bad = True
    if not l16[-1] < l16[0] - fall:
        print(f"FAIL {name}: the loss does not fall by {fall}"); bad = True
sys.exit(1 if bad else 0)
PY
}
compare fp32 200 1.0 bf16 bf16_dp2 || fail=1

# 2. real overflows from too large a scale
train "$mpiexec1" fp16_big --train.steps=40 --train.precision=fp16 --train.loss_scale=4294967296 \
  --train.loss_scale_window=1000 || { echo "FAIL fp16_big: exit status $?"; tail -20 fp16_big.log; fail=1; }
must fp16_big "step 1: fp16 gradients overflowed at loss scale 4.29497e\+09 .*loss scale now 2.14748e\+09 \(1 overflowing step\(s\) in all\)"
/usr/bin/python3 - <<'PY' || fail=1
import re, sys
import h5py
log = open("fp16_big.log").read()
skipped = [int(s) for s in re.findall(r"step (\d+): fp16 gradients overflowed", log)]
m = re.search(r"# fp16 loss scaling: (\d+) overflowing step\(s\) skipped \| loss scale at the end (\S+)", log)
with h5py.File("fp16_big/run.h5", "r") as f:
    steps, loss = f["metrics/step"][()], f["metrics/loss"][()]
print(f"fp16_big: overflowing steps {skipped}; end: {m.group(0) if m else None}; "
      f"loss {loss[0]:.4f} (step {steps[0]}) -> {loss[-1]:.4f}")
ok = (m is not None and len(skipped) >= 3 and skipped == list(range(1, len(skipped) + 1))
      and int(m.group(1)) == len(skipped)
      and abs(float(m.group(2)) / (2.0 ** 32 / 2 ** len(skipped)) - 1) < 1e-5
      and all(s not in skipped for s in steps) and loss[-1] < loss[0])
sys.exit(0 if ok else "FAIL fp16_big: overflows not skipped, counted and halved as they should")
PY

# 3. an injected NaN is an overflow under fp16
train "$mpiexec2" fp16_nan --train.steps=6 --train.precision=fp16 --debug.nan_step=3 \
  --train.on_nonfinite=stop || { echo "FAIL fp16_nan: exit status $?"; tail -20 fp16_nan.log; fail=1; }
must fp16_nan "step 3: fp16 gradients overflowed at loss scale 65536 .*loss scale now 32768 \(1 overflowing step\(s\) in all\)"
must fp16_nan "# fp16 loss scaling: 1 overflowing step\(s\) skipped \| loss scale at the end 32768"

# 4. gradients NaN at every scale
if train "$mpiexec2" fp16_diverged --train.steps=40 --train.precision=fp16 --train.loss_scale=1 \
  --debug.nan_step=2 --debug.nan_count=100; then
  echo "FAIL fp16_diverged: the run succeeded"; fail=1
fi
must fp16_diverged "step 26: the loss is .* and the gradient norm is nan at every fp16 loss scale down to 5.96046e-08; the first tensor whose gradient is not finite is wte.weight \(train.on_nonfinite = stop\)"

# 5. LoRA on an NF4 base at bf16
for p in fp32 bf16; do
  train "$mpiexec1" "lora_$p" --train.steps=100 --train.log_every=1 --train.precision="$p" \
    --finetune.mode=lora --quant.type=nf4 --train.lr=0.03 ||
    { echo "FAIL lora_$p: exit status $?"; tail -20 "lora_$p.log"; fail=1; }
done
must lora_bf16 "# precision: bf16 GEMM inputs"
compare lora_fp32 100 0.1 lora_bf16 || fail=1

[ $fail -eq 0 ] && echo "precision: all passed"
exit $fail
