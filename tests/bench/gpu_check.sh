#!/usr/bin/env bash
# gpu_check.sh OUT_DIR [BASELINE_TREE]
#
# One call to a GPU machine (../shared/device/README.md: its kit of packages
# made here by tests/bench/gpu_devkit.sh and carried as .devkit; run it after
# `source .devkit/setup.sh`, from the repository root): builds the CUDA
# targets in build-gpu, runs the `cuda` tests (in parallel: ctest -j8), then
# meshlm train on 1, 2 and 4 ranks sharing the GPU (losses, step times),
# meshlm_bench's GPT-2 124M step (bf16, flash, B = 16) beside PyTorch's
# (tests/bench/torch_gpu_step.py), compute-sanitizer (memcheck and
# racecheck) on the fused attention's tests, the attention benchmark beside
# PyTorch's scaled_dot_product_attention at GPT-2 124M's and 1.5B's shapes,
# op timings of meshlm train, and meshlm generate on the GPU against
# PyTorch (tokens/s, ids). With BASELINE_TREE (a copy of an earlier
# commit's sources), that tree's meshlm_bench is built too, in the
# background while the tests run, and timed on the same GPU right before
# this tree's. GPU_CHECK_SECONDS (default 540) bounds the whole: each stage
# after the build runs only with time left, under a timeout of its own, in
# the order above. GPU_CHECK_SKIP: stages left out (words among ctest ranks
# step sanitizers attention ops generate). Logs and JSON lines go to
# OUT_DIR; a summary is printed last.
set -u
out=$1
base=${2:-}
mkdir -p "$out"
root=$(pwd)
budget=${GPU_CHECK_SECONDS:-540}
skip=" ${GPU_CHECK_SKIP:-} "
left() { echo $((budget - SECONDS)); }
# stage NAME SECONDS: whether to run stage NAME (not skipped, and at least
# SECONDS left); says why not.
stage() {
  if [[ "$skip" == *" $1 "* ]]; then echo "# $1: skipped (GPU_CHECK_SKIP)"; return 1; fi
  if [ "$(left)" -lt "$2" ]; then echo "# $1: not run, $(left) s left of ${budget}"; return 1; fi
  echo "# $1: starting at ${SECONDS} s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/# GPU: /'

cuda_tests=$(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//')
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
t0=$SECONDS
# shellcheck disable=SC2086
cmake -S . -B build-gpu $gen $DEVKIT_CMAKE_ARGS -DMESHLM_CUDA=ON >"$out/configure.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" --target meshlm meshlm_bench meshlm_attention_bench \
    test_emulated_layouts $cuda_tests >"$out/build.log" 2>&1 ||
  { echo "build failed after $((SECONDS - t0)) s:"; grep -E "error|Error" "$out/build.log" | head -20; exit 1; }
echo "# build: $((SECONDS - t0)) s"
old_pid=""
if [ -n "$base" ]; then
  # shellcheck disable=SC2086
  (cd "$base" && cmake -S . -B build-old $gen $DEVKIT_CMAKE_ARGS -DMESHLM_CUDA=ON &&
     cmake --build build-old -j8 --target meshlm_bench) >"$out/build_old.log" 2>&1 &
  old_pid=$!
fi

if stage ctest 170; then
  t0=$SECONDS
  timeout $(($(left) - 110)) ctest --test-dir build-gpu -L cuda -j8 --output-on-failure \
    >"$out/ctest.log" 2>&1
  echo "# ctest -L cuda: $((SECONDS - t0)) s: $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
  grep -E "^ *[0-9]+/[0-9]+ Test" "$out/ctest.log" | sed 's/^/#   /'
fi

scratch=$(mktemp -d)
cat src/*/*.cpp src/*/*.h cuda/* >"$scratch/corpus.txt"
build-gpu/meshlm tokenize "$scratch/corpus.txt" "$scratch/corpus.h5" >"$out/tokenize.log" 2>&1

# Several ranks on the one GPU (comm.device = auto: staged through the
# host): GPT-2 124M fp32, 10 steps of batch 16 (micro-batches of 4) on one
# rank, pp 2 and dp 2 x pp 2; the losses of each against one rank's and the
# step times (what the host path costs).
if command -v mpiexec >/dev/null && stage ranks 60; then
  layouts=("1 --parallel.dp=1" "2 --parallel.pp=2" "4 --parallel.dp=2 --parallel.pp=2")
  for l in "${layouts[@]}"; do
    set -- $l
    n=$1; shift
    timeout $(($(left) - 10)) mpiexec --allow-run-as-root --oversubscribe -n "$n" build-gpu/meshlm train \
      inputs/gpt2-124m.cfg --runtime.backend=cuda --train.steps=10 --train.log_every=1 \
      --train.batch_size=16 --train.micro_batch_size=4 --train.warmup_steps=2 \
      --data.path="$scratch/corpus.h5" --output.dir="$scratch/ranks$n" "$@" \
      >"$out/ranks$n.log" 2>&1 || echo "# $n ranks on one GPU failed: $(grep -m1 ERROR "$out/ranks$n.log")"
  done
  python3 - "$scratch" <<'PY'
import sys
import h5py
import numpy as np
d = sys.argv[1]
def run(n):
    with h5py.File(f"{d}/ranks{n}/run.h5", "r") as f:
        return f["metrics/loss"][()], f["metrics/tokens_per_s"][()]
try:
    ref, ref_ms = run(1)
    for n in (2, 4):
        loss, tps = run(n)
        rel = float(np.max(np.abs(loss - ref) / np.abs(ref)))
        t = f", {np.median(tps[2:]):.0f} tokens/s against one rank's {np.median(ref_ms[2:]):.0f}"
        print(f"# {n} ranks on one GPU: loss within {rel:.1e} of one rank's{t}"
              f"{'' if rel <= 1e-4 else ' FAIL'}")
except (OSError, KeyError) as e:
    print(f"# ranks on one GPU: no result ({e})")
PY
fi

jsonl=$out/bench.jsonl
: >"$jsonl"
step=(--n_layer 12 --n_head 12 --n_embd 768 --vocab_size 50257 --seq_len 1024 --batch 16
      --steps 5 --warmup 2 --cuda 1 --bf16 1 --flash 1)
if stage step 60; then
  if [ -n "$old_pid" ]; then
    wait "$old_pid" && "$base/build-old/tests/bench/meshlm_bench" "${step[@]}" 2>>"$out/step.log" |
      sed 's/"impl": "meshlm"/"impl": "meshlm-baseline"/' >>"$jsonl" ||
      { echo "# baseline build or run failed:"; tail -5 "$out/build_old.log"; }
  fi
  timeout 60 build-gpu/tests/bench/meshlm_bench "${step[@]}" 2>>"$out/step.log" | grep '^{' >>"$jsonl"
  timeout 60 build-gpu/tests/bench/meshlm_bench "${step[@]}" --lora 16 2>>"$out/step.log" |
    grep '^{' >>"$jsonl"
  # The peer at its best (bf16 autocast, SDPA, fused AdamW, torch.compile).
  timeout $(($(left) - 10)) python3 tests/bench/torch_gpu_step.py --n_layer 12 --n_head 12 \
    --n_embd 768 --batch 16 --steps 10 --warmup 3 2>>"$out/torch.log" | grep '^{' >>"$jsonl" ||
    echo "# torch_gpu_step.py failed or ran out of time (torch.log)"
fi

if stage sanitizers 60; then
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 9 build-gpu/tests/test_cuda_ops \
      --gtest_filter='*Flash*' >"$out/sanitizer_$tool.log" 2>&1
    echo "# compute-sanitizer $tool (flash tests): exit $? ($(grep -E 'ERROR SUMMARY' "$out/sanitizer_$tool.log" | tail -1))"
  done
fi

if stage attention 40; then
  for shape in "16 768 12" "8 1600 25" "4 1024 8"; do
    set -- $shape
    timeout 30 build-gpu/tests/bench/meshlm_attention_bench --batch "$1" --n_embd "$2" --n_head "$3" \
      >>"$jsonl" 2>>"$out/attention.log"
    timeout 60 python3 tests/bench/torch_attention.py --batch "$1" --n_embd "$2" --n_head "$3" \
      >>"$jsonl" 2>>"$out/attention.log"
  done
fi

# Op timings (each op waited for) of meshlm train on GPT-2 124M, bf16, flash,
# B = 16: full training and LoRA r = 16 on an NF4 base, 3 steps each.
run=(--runtime.backend=cuda --train.precision=bf16 --train.attention=flash --train.steps=3
     --data.path="$scratch/corpus.h5" --train.batch_size=16 --train.micro_batch_size=16
     --train.log_every=1 --train.warmup_steps=1 --runtime.op_timings=true)
if stage ops 40; then
  for mode in full nf4; do
    extra=()
    [ "$mode" = nf4 ] && extra=(--finetune.mode=lora --finetune.lora_rank=16 --quant.type=nf4)
    timeout 60 build-gpu/meshlm train inputs/gpt2-124m.cfg "${run[@]}" "${extra[@]}" \
      --output.dir="$scratch/$mode" >"$out/ops_$mode.log" 2>&1 || echo "# op timings ($mode) failed"
  done
fi

# meshlm generate on the GPU against PyTorch's loop on the same random
# GPT-2 124M (fp32, and bf16 autocast): prefill and decode tokens/s, and
# how many greedy ids agree with PyTorch's fp32 (tests/bench/generate_bench.py).
if stage generate 60; then
  timeout $(($(left) - 5)) python3 tests/bench/generate_bench.py --meshlm build-gpu/meshlm \
    --backend cuda --threads 16 --repeats 2 >"$out/generate.log" 2>&1 || echo "# generate bench failed"
  sed 's/^/# generate: /' "$out/generate.log" | tail -6
fi
rm -rf "$scratch"
cd "$root" || exit 1
python3 - "$jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("op") == "attention":
        print(f"attention {r['impl']:8} B={r['batch']:2} C={r['n_embd']:4} NH={r['n_head']:2}: "
              f"fwd {r['fwd_ms']:.3f} ms ({r['fwd_tflops']} TFLOP/s), "
              f"bwd {r['bwd_ms']:.3f} ms ({r['bwd_tflops']} TFLOP/s)")
    else:
        tflops = r["gflops"] / 1e3 if "gflops" in r else r.get("tflops", 0)
        mem = r.get("device_in_use_gib", r.get("peak_mem_gib", 0))
        print(f"step {r['impl']:16} {r.get('mode', 'full'):8} B={r['batch']} {r['ms_per_step']:.1f} ms "
              f"{r['tokens_per_s']:.0f} tokens/s {tflops:.1f} TFLOP/s device {mem:.1f} GiB")
PY
for mode in full nf4; do
  [ -f "$out/ops_$mode.log" ] || continue
  echo "---- op timings, $mode (slowest first)"
  sed -n '/^# Time per op/,/all ops/p' "$out/ops_$mode.log" | tail -n +3 | grep -v "all ops" |
    sort -k6 -n -r | head -12
  grep "all ops" "$out/ops_$mode.log"
done
echo "# gpu_check.sh: ${SECONDS} s"
