#!/usr/bin/env bash
# gpu_bench.sh BUILD_DIR OUT_DIR [SECTION ...]
#
# The GPU benchmark of docs/PERFORMANCE.md: meshlm's training step
# (meshlm_bench, bf16, train.attention = flash, T = 1024, median of 5 steps
# after 2 warm-up ones) beside PyTorch at its best on the same GPU in the
# same call (tests/bench/torch_gpu_step.py: bf16 autocast, SDPA, fused AdamW,
# torch.compile; peft LoRA on a bf16 base for the LoRA rows). Sections, run
# in the order given (default: 124m lora ops 1.5b):
#   124m  GPT-2 124M full training: meshlm at B = 16 and 64, PyTorch at
#         B = 16 and 64;
#   124m16  the same at B = 16 only (a shorter call);
#   lora  GPT-2 124M, LoRA r = 16 on every linear layer, B = 16: meshlm on
#         an NF4 base (mode lora-nf4), peft on a bf16 base (lora-bf16);
#   ops   meshlm's 124M step at B = 16 with every op timed (op_ms; each op
#         waited for), full training and LoRA;
#   1.5b  GPT-2 1.5B full training at B = 8, meshlm and PyTorch.
# Every JSON line goes to OUT_DIR/bench.jsonl as it is made (appended), logs
# to OUT_DIR/*.log; then OUT_DIR/gpu.json (the format of docs/bench/gpu.json)
# is made from all lines of bench.jsonl and a table is printed. The commit
# is $MESHLM_COMMIT, else git's HEAD.
set -u
build=$1
out=$2
shift 2
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(124m lora ops 1.5b)
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/tests/bench/meshlm_bench
jsonl=$out/bench.jsonl
touch "$jsonl"
G=(--n_layer 12 --n_head 12 --n_embd 768)
X=(--n_layer 48 --n_head 25 --n_embd 1600)
meshlm() {  # meshlm_bench ARGS...: its JSON line, or a note on stderr
  "$bench" "$@" --vocab_size 50257 --seq_len 1024 --steps 5 --warmup 2 --cuda 1 --bf16 1 \
    --flash 1 >"$out/meshlm.log" 2>&1
  grep '^{"impl"' "$out/meshlm.log" >>"$jsonl" ||
    { echo "meshlm_bench $* failed:" >&2; tail -3 "$out/meshlm.log" >&2; }
}
torch() {  # torch_gpu_step.py ARGS...
  python3 "$here/torch_gpu_step.py" "$@" --steps 10 --warmup 3 2>>"$out/torch.log" |
    grep '^{' >>"$jsonl" || echo "torch_gpu_step.py $* failed (torch.log)" >&2
}
for section in "${sections[@]}"; do
  case "$section" in
    124m) meshlm "${G[@]}" --batch 16; meshlm "${G[@]}" --batch 64
          torch "${G[@]}" --batch 16; torch "${G[@]}" --batch 64 ;;
    124m16) meshlm "${G[@]}" --batch 16; torch "${G[@]}" --batch 16 ;;
    lora) meshlm "${G[@]}" --batch 16 --lora 16; torch "${G[@]}" --batch 16 --lora 16 ;;
    ops)  meshlm "${G[@]}" --batch 16 --op_timings 1
          meshlm "${G[@]}" --batch 16 --lora 16 --op_timings 1 ;;
    1.5b) meshlm "${X[@]}" --batch 8; torch "${X[@]}" --batch 8 ;;
    *) echo "gpu_bench.sh: unknown section '$section' (124m, 124m16, lora, ops, 1.5b)" >&2; exit 2 ;;
  esac
done

commit=${MESHLM_COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}
python3 - "$jsonl" "$out/gpu.json" "$commit" <<'PY'
import datetime, json, sys
# Dense bf16 peak (datasheet, SXM): the H100 and the H200 share the chip.
PEAK = {"H100": 989.4e12, "H200": 989.4e12}
rows, device = [], "?"
for line in open(sys.argv[1]):
    r = json.loads(line)
    L, C, T, B = r["n_layer"], r["n_embd"], r["seq_len"], r["batch"]
    V = r.get("vocab_size", 50257)
    flops = 3 * B * T * (2 * (12 * L * C * C + V * C) + 4 * L * T * C)  # PERFORMANCE.md
    device = r["device"]
    peak = next((v for k, v in PEAK.items() if k in device), float("nan"))
    s = r["ms_per_step"] / 1e3
    meshlm = r["impl"] == "meshlm"
    row = {"model": "124M" if L == 12 else "1.5B", "impl": "meshlm" if meshlm else "pytorch",
           "mode": r.get("mode", "full"), "batch": B, "seq_len": T,
           "ms_per_step": round(r["ms_per_step"], 2), "tokens_per_s": round(B * T / s),
           "mfu": round(flops / s / peak, 4),
           "peak_device_bytes": int((r["peak_tracked_gib"] if meshlm else r["peak_mem_gib"]) * 2**30)}
    if meshlm:
        row["device_in_use_bytes"] = int(r["device_in_use_gib"] * 2**30)
    if "op_ms" in r:
        row["op_timings"] = True
        row["op_ms"] = {k: round(v, 3) for k, v in r["op_ms"].items()}
    rows.append(row)
doc = {"device": device, "date": datetime.date.today().isoformat(), "commit": sys.argv[3],
       "peak_bf16_flops": next((v for k, v in PEAK.items() if k in device), None),
       "rows": rows}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print(f"# {device}, commit {sys.argv[3]}")
print(f"{'model':5} {'impl':7} {'mode':9} {'B':>3} {'ms/step':>8} {'tokens/s':>9} {'MFU':>6} {'peak GiB':>8}")
for w in rows:
    mark = " (ops timed)" if w.get("op_timings") else ""
    print(f"{w['model']:5} {w['impl']:7} {w['mode']:9} {w['batch']:>3} {w['ms_per_step']:>8.1f} "
          f"{w['tokens_per_s']:>9} {100 * w['mfu']:>5.1f}% {w['peak_device_bytes'] / 2**30:>8.2f}{mark}")
    for k, v in sorted(w.get("op_ms", {}).items(), key=lambda x: -x[1])[:12]:
        print(f"      {k:28} {v:8.3f} ms")
PY
