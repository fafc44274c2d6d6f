#!/usr/bin/env bash
# train_cuda.sh MPIEXEC1 MESHLM CFG [BACKEND]
#
# `meshlm train CFG` on one rank, 200 steps logged every step, with
# runtime.backend = cpu (fp32) and = BACKEND (cuda, or emulated: the CPU's
# kernels behind the GPU's rules, train/emulated_device.h, which runs every
# check below on a machine without a GPU) at each train.precision; the
# curves are read from run.h5 with h5py (the directories are named cuda_*
# for either):
#   * cuda fp32 (TF32 off): loss and gradient norm within 1e-3 relative of
#     the CPU's at each of the first 60 steps;
#   * cuda bf16 and fp16: the loss within the bf16 tolerance of the CPU's
#     fp32 curve, 1.5% at every step and 0.2% on average over the 200 (as
#     the CPU's own emulated bf16 in tests/cli/precision.sh); fp16 starts
#     from a loss scale of 4096, under which this model never overflows
#     (at 65536 a GPU run skipped one step where another did not; the
#     skipping itself is tested on the CPU, tests/cli/precision.sh); and
#     cuda bf16 with train.attention = flash (the fused kernels) likewise;
#   * QLoRA (finetune.mode = lora on an NF4 base, 100 steps at lr 0.003,
#     or $LORA_LR):
#     cuda fp32 within 1e-3 of the CPU's LoRA curve at every step, cuda bf16
#     within the bf16 tolerance of it; the loss falls by 0.1 (the random
#     base leaves the adapters little more: the CPU's curve goes 5.56 ->
#     5.41); the device memory line books the base as quantized. At lr 0.01
#     the run is unstable from step 33 on: the CPU's own curve moves by
#     4.5e-3 when only OpenBLAS's GEMM kernel changes (OPENBLAS_CORETYPE),
#     by 4e-8 at lr 0.003. llama-tiny.cfg runs at LORA_LR=0.001: at 0.003
#     a difference of 2e-8 in step 3 grows to 2e-4 by step 100 (its curve
#     going 5.57 -> 5.23), at 0.001 it stays below 1e-7 (5.57 -> 5.27);
#   * cuda fp16 with a NaN injected into step 3's gradients on the device
#     (debug.nan_step): the step is skipped, logged and counted, and the
#     scale halves once;
#   * in every CUDA run, each memory category's peak (host and device
#     together, run.h5 memory/<category>) is its prediction, within 1% or
#     1 MiB;
#   * checkpoint.async = true on the GPU (20 steps, a checkpoint every 10):
#     its files equal the synchronous run's within 1e-5 of each dataset's
#     largest value (every dataset but /meta), the step-20 file verifies,
#     its memory categories (checkpoint among them) are their predictions,
#     and 10 steps resumed from its step-10 file end where it ended;
#   * the loss falls; the rank line names the GPU (the emulated device).
# Exit 77 (skipped) when meshlm says this machine has no GPU it can use.
# The checks run under $MESHLM_PYTHON (python3 by default), which needs h5py.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")/../cli" && pwd)/limit.sh
mpiexec1=$1
meshlm=$2
cfg=$3
backend=${4:-cuda}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=$(dirname "$cfg")/../README.md
common=(--data.path=tokens.h5 --data.tokenize_from="$text" --train.steps=200 --train.log_every=1 --runtime.threads=2)
# shellcheck disable=SC2086
bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cuda_fp32 \
  --runtime.backend=$backend >cuda_fp32.log 2>&1
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
bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cpu_fp32 >cpu_fp32.log 2>&1 ||
  { cat cpu_fp32.log; echo "FAIL: the CPU run"; exit 1; }
for p in bf16 fp16; do
  # shellcheck disable=SC2086
  bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cuda_$p \
    --runtime.backend=$backend --train.precision=$p --train.loss_scale=4096 >cuda_$p.log 2>&1 ||
    { cat cuda_$p.log; echo "FAIL: the CUDA $p run"; exit 1; }
done
# shellcheck disable=SC2086
bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" --output.dir=cuda_bf16_flash \
  --runtime.backend=$backend --train.precision=bf16 --train.attention=flash >cuda_bf16_flash.log 2>&1 ||
  { cat cuda_bf16_flash.log; echo "FAIL: the CUDA bf16 run with flash attention"; exit 1; }
grep -q "attention flash" cuda_bf16_flash.log ||
  { grep "^# parallel" cuda_bf16_flash.log; echo "FAIL: the flash run does not say so"; exit 1; }
lora=(--train.steps=100 --finetune.mode=lora --quant.type=nf4 --train.lr=${LORA_LR:-0.003})
# shellcheck disable=SC2086
bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" "${lora[@]}" --output.dir=cpu_lora \
  >cpu_lora.log 2>&1 || { cat cpu_lora.log; echo "FAIL: the CPU LoRA run"; exit 1; }
for p in fp32 bf16; do
  # shellcheck disable=SC2086
  bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" "${lora[@]}" --output.dir=cuda_lora_$p \
    --runtime.backend=$backend --train.precision=$p >cuda_lora_$p.log 2>&1 ||
    { cat cuda_lora_$p.log; echo "FAIL: the CUDA LoRA $p run"; exit 1; }
done
# shellcheck disable=SC2086
bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" --data.path=tokens.h5 --runtime.threads=2 \
  --train.steps=6 --output.dir=cuda_fp16_nan --runtime.backend=$backend --train.precision=fp16 \
  --train.loss_scale=4096 --debug.nan_step=3 --train.on_nonfinite=stop >cuda_fp16_nan.log 2>&1 ||
  { cat cuda_fp16_nan.log; echo "FAIL: the CUDA fp16 run with an injected NaN"; exit 1; }
for want in "step 3: fp16 gradients overflowed at loss scale 4096 .*loss scale now 2048 \(1 overflowing step\(s\) in all\)" \
            "# fp16 loss scaling: 1 overflowing step\(s\) skipped \| loss scale at the end 2048"; do
  grep -Eq -- "$want" cuda_fp16_nan.log ||
    { cat cuda_fp16_nan.log; echo "FAIL: cuda fp16 injected overflow: no line matching $want"; exit 1; }
done
# checkpoint.async on the GPU: a checkpoint every 10 steps of 20, from the
# background thread and from the training thread; then 10 steps resumed from
# the async run's step-10 file.
ck=(--data.path=tokens.h5 --runtime.threads=2 --train.steps=20 --train.log_every=1
    --runtime.backend=$backend --checkpoint.every=10)
for a in false true; do
  # shellcheck disable=SC2086
  bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${ck[@]}" --checkpoint.async=$a \
    --output.dir=cuda_ck_$a >cuda_ck_$a.log 2>&1 ||
    { cat cuda_ck_$a.log; echo "FAIL: the CUDA run with checkpoint.async = $a"; exit 1; }
done
# shellcheck disable=SC2086
bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${ck[@]}" --checkpoint.async=true \
  --checkpoint.resume=cuda_ck_true/checkpoints/step_00000010.h5 --output.dir=cuda_ck_resumed \
  >cuda_ck_resumed.log 2>&1 ||
  { cat cuda_ck_resumed.log; echo "FAIL: the CUDA run resumed from an async checkpoint"; exit 1; }
"$meshlm" ckpt verify cuda_ck_true/checkpoints/step_00000020.h5 >/dev/null ||
  { echo "FAIL: the async checkpoint does not verify"; exit 1; }
grep -Eq "^# device memory, .*quantized" cuda_lora_fp32.log ||
  { grep "^# device memory" cuda_lora_fp32.log; echo "FAIL: no quantized base on the device"; exit 1; }
device_named="device cuda:"
[ "$backend" = emulated ] && device_named="device emulated"
grep -E "^# (precision|device)|$device_named" cuda_*.log
grep -q "$device_named" cuda_fp32.log || { echo "FAIL: the rank line names no GPU"; exit 1; }
${MESHLM_PYTHON:-python3} - <<'PY'
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
for p in ["bf16", "fp16", "bf16_flash"]:
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
lc, gc = curve("cpu_lora")
for p in ["fp32", "bf16"]:
    lg, gg = curve(f"cuda_lora_{p}")
    if len(lg) != 100 or len(lc) != 100:
        print(f"FAIL: LoRA {p}: {len(lg)} and {len(lc)} steps logged"); bad = True; continue
    n = 100
    d = np.abs(lg - lc) / np.abs(lc)
    tol_max, tol_mean = (1e-3, 1e-3) if p == "fp32" else (0.015, 0.002)
    print(f"QLoRA {p}: loss {lg[0]:.5f} -> {lg[-1]:.5f} (cuda) vs {lc[0]:.5f} -> {lc[-1]:.5f} "
          f"(cpu fp32); relative difference over {n} steps largest {d.max():.2e} "
          f"(step {d.argmax() + 1}), mean {d.mean():.2e}")
    if not (np.all(np.isfinite(lg)) and d.max() <= tol_max and d.mean() <= tol_mean
            and lg[-1] < lg[0] - 0.1):
        print(f"FAIL: cuda QLoRA {p}"); bad = True
def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                     and not n.startswith("meta") else None)
    return out
for a, b, what in [("cuda_ck_false/checkpoints/step_00000010.h5",
                    "cuda_ck_true/checkpoints/step_00000010.h5", "async step 10"),
                   ("cuda_ck_false/checkpoints/step_00000020.h5",
                    "cuda_ck_true/checkpoints/step_00000020.h5", "async step 20"),
                   ("cuda_ck_true/checkpoints/step_00000020.h5",
                    "cuda_ck_resumed/checkpoints/step_00000020.h5", "resumed step 20")]:
    x, y = datasets(a), datasets(b)
    worst = max((float(np.max(np.abs(x[k].astype(np.float64) - y[k]))) /
                 max(float(np.max(np.abs(x[k]))), 1e-30) for k in x if k in y), default=None)
    if sorted(x) != sorted(y) or worst is None or worst > 1e-5:
        print(f"FAIL: {what}: {sorted(set(x) ^ set(y))} differ in name, largest difference {worst}")
        bad = True
    else:
        print(f"{what}: {len(x)} datasets, largest difference {worst:.1e} of the largest value")
for d in ["cuda_fp32", "cuda_bf16", "cuda_fp16", "cuda_bf16_flash", "cuda_lora_fp32",
          "cuda_lora_bf16", "cuda_ck_true"]:
    off = []
    with h5py.File(f"{d}/run.h5", "r") as f:
        for c in ["params", "grads", "optimizer", "activations", "quantized", "comm",
                  "workspace", "checkpoint", "other"]:
            pred = int(f[f"memory/{c}/predicted_bytes"][0])
            peak = int(f[f"memory/{c}/peak_bytes"][0])
            if abs(peak - pred) > max(0.01 * pred, 1 << 20):
                off.append(f"{c} peaked at {peak} bytes, predicted {pred}")
    if off:
        print(f"FAIL: {d}: " + "; ".join(off)); bad = True
    else:
        print(f"{d}: every memory category within 1% or 1 MiB of its prediction")
sys.exit("FAIL" if bad else 0)
PY
