#!/usr/bin/env bash
# gpu_bench.sh BUILD_DIR OUT_DIR [train|124m|1.5b|all]
#
# The GPU benchmark of docs/PERFORMANCE.md, in sections that each fit one
# 10-minute call of a GPU machine (all: every section, in this order):
#   train  meshlm train on inputs/gpt2-124m.cfg at bf16 (6 optimizer steps
#          of 16 x 1024 tokens, on a corpus of meshlm's own sources): LoRA on
#          an NF4 base against LoRA on an f32 base and full training, and the
#          time of each op of the full training step, probabilities and
#          flash (runtime.op_timings);
#   124m   meshlm's training step (meshlm_bench) on GPU 0 for GPT-2 124M at
#          bf16, the attention probabilities kept and train.attention =
#          flash, and the same GPT-2 in PyTorch at its best
#          (tests/bench/torch_gpu_step.py);
#   1.5b   the same for GPT-2 1.5B (its initialisation alone takes minutes).
# Every JSON line goes to OUT_DIR/bench.jsonl (appended), every log to
# OUT_DIR; a table of what ran is printed last.
set -u
build=$1
out=$2
section=${3:-all}
case "$section" in train|124m|1.5b|all) ;; *) echo "gpu_bench.sh: unknown section '$section' (train, 124m, 1.5b or all)" >&2; exit 2 ;; esac
mkdir -p "$out"
bench=$build/tests/bench/meshlm_bench
meshlm=$build/meshlm
here=$(cd "$(dirname "$0")" && pwd)
jsonl=$out/bench.jsonl
touch "$jsonl"
G=(--n_layer 12 --n_head 12 --n_embd 768)
X=(--n_layer 48 --n_head 25 --n_embd 1600)
want() { [ "$section" = all ] || [ "$section" = "$1" ]; }
step() {  # meshlm_bench ARGS...: one JSON line, or a note on stderr
  "$bench" "$@" --vocab_size 50257 --seq_len 1024 --steps 5 --warmup 2 --cuda 1 --bf16 1 \
    >"$out/step.log" 2>&1
  grep '^{"impl"' "$out/step.log" >>"$jsonl" || { echo "meshlm_bench $* failed:" >&2; tail -3 "$out/step.log" >&2; }
}
# LoRA (rank 16 on every linear layer) against full training, bf16, flash.
if want train; then
scratch=$(mktemp -d)
cat "$here"/../../src/*/*.cpp "$here"/../../src/*/*.h "$here"/../../cuda/* >"$scratch/corpus.txt"
"$meshlm" tokenize "$scratch/corpus.txt" "$scratch/corpus.h5" >"$out/tokenize.log" 2>&1
run=(--runtime.backend=cuda --train.precision=bf16 --train.attention=flash
     --data.path="$scratch/corpus.h5" --train.steps=6 --train.batch_size=16
     --train.micro_batch_size=16 --train.log_every=1 --train.warmup_steps=1)
for mode in full nf4 f32; do
  extra=()
  [ "$mode" != full ] && extra=(--finetune.mode=lora --finetune.lora_rank=16 --quant.type="$mode")
  "$meshlm" train "$here/../../inputs/gpt2-124m.cfg" "${run[@]}" "${extra[@]}" \
    --output.dir="$scratch/$mode" >"$out/train_$mode.log" 2>&1 ||
    { echo "meshlm train ($mode) failed:" >&2; tail -5 "$out/train_$mode.log" >&2; }
done
for att in probabilities flash; do
  "$meshlm" train "$here/../../inputs/gpt2-124m.cfg" "${run[@]}" --train.attention=$att \
    --train.steps=3 --runtime.op_timings=true --output.dir="$scratch/ops_$att" \
    >"$out/ops_$att.log" 2>&1 || { echo "op timings ($att) failed:" >&2; tail -5 "$out/ops_$att.log" >&2; }
done
rm -rf "$scratch"
fi

if want 124m; then
  step "${G[@]}" --batch 16
  for b in 16 32 64; do step "${G[@]}" --batch "$b" --flash 1; done
  python3 "$here/torch_gpu_step.py" "${G[@]}" --batch 16 2>"$out/torch124.log" | tail -1 >>"$jsonl"
fi
if want 1.5b; then
  step "${X[@]}" --batch 2
  for b in 2 4 8; do step "${X[@]}" --batch "$b" --flash 1; done
  python3 "$here/torch_gpu_step.py" "${X[@]}" --batch 8 2>"$out/torch1558.log" | tail -1 >>"$jsonl"
fi

echo "---- training step (median of 5 after 2 warm-up steps)"
python3 - "$jsonl" <<'PY'
import json, sys
peak = 989.4e12  # H100 SXM dense bf16
print(f"{'impl':8} {'model':6} {'attention':13} {'B':>3} {'ms/step':>9} {'tokens/s':>10} {'MFU':>6} {'device GiB':>10}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    model = "124M" if r["n_layer"] == 12 else "1.5B"
    if r["impl"] == "meshlm":
        mfu = r["gflops"] * 1e9 / peak
        mem = r.get("device_in_use_gib", float("nan"))
        att = r.get("attention", "?")
    else:
        mfu, mem, att = r["mfu"], r["peak_mem_gib"], "sdpa"
    print(f"{r['impl'][:8]:8} {model:6} {att:13} {r['batch']:>3} {r['ms_per_step']:>9.1f} "
          f"{r['tokens_per_s']:>10.0f} {100 * mfu:>5.1f}% {mem:>10.2f}")
PY
if want train; then
echo "---- meshlm train inputs/gpt2-124m.cfg, bf16, flash, B = 16: full, LoRA NF4, LoRA f32"
for mode in full nf4 f32; do
  echo "[$mode]"
  grep -E "^# (device memory|memory|base)|tokens/s|^ +[0-9]+ " "$out/train_$mode.log" | tail -8
done
for att in probabilities flash; do
  echo "---- op timings, full training, attention $att (each op waited for; slowest first)"
  table=$(sed -n '/^# Time per op/,/all ops/p' "$out/ops_$att.log")
  echo "$table" | head -2
  echo "$table" | tail -n +3 | grep -v "all ops" | sort -k6 -n -r | head -16
  echo "$table" | grep "all ops"
done
fi
