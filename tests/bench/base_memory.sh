#!/bin/bash
# The frozen-base measurement of docs/PERFORMANCE.md ("Frozen base: one
# quantized copy per node"): memory per node and rank 0's peak while the
# NF4 base is loaded, and the start-up time from the source and from the
# quantized-model cache.
#
#   tests/bench/base_memory.sh [SCRATCH_DIR]
#
# SCRATCH_DIR (default: $TMPDIR/meshlm-base-bench, or /tmp/...) receives the
# model (made once, reused), the parameter file, the cache and one log per
# run. Environment: MESHLM_BUILD (build directory, default build), NP (ranks,
# default 8). Needs meshlm_base_bench built:
#   cmake --build build --target meshlm_base_bench
#
# Runs, all with NP ranks on this one machine, OMP_NUM_THREADS=1:
#   a  share = node, ranks_per_node = 0 (one node)           from the source
#   b  share = node, ranks_per_node = NP/2 (two nodes)       from the source
#   c  share = per_rank (every rank quantizes its own copy)  from the source
#   d  share = node, one node, quant.cache empty             start-up from the source
#   e  as d with quant.cache set, no file there              miss: quantize + write the cache
#   f  as e again                                            hit: load the cache
#   g  as a, with glibc's mmap threshold fixed at 1 MiB      diagnosis of a's extra memory
#      (GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1048576: freed blocks of
#      1 MiB and more go back to the system at once)
#   h  as d, the source evicted from the page cache first     cold start-up from the source
#   i  as f, source and cache evicted first                   cold start-up from the cache
#      (a hit still reads the whole source: the cache key is its XXH3-128)
# Runs a-g find both files in the page cache (just written or read).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${MESHLM_BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BENCH=$BUILD/tests/bench/meshlm_base_bench
NP=${NP:-8}
SCRATCH=${1:-${TMPDIR:-/tmp}/meshlm-base-bench}
PY=/usr/bin/python3

# The model: GPT-2-shaped, random weights, Hugging Face layout.
L=6 C=1024 NH=16 V=50257 MAXT=1024

if [[ ! -x $BENCH ]]; then
  echo "no $BENCH: build it first (cmake --build $BUILD --target meshlm_base_bench)" >&2
  exit 1
fi
mkdir -p "$SCRATCH/logs"
MODEL=$SCRATCH/gpt2-L$L-C$C-V$V-T$MAXT.safetensors
CACHE=$SCRATCH/base-nf4.h5
CFG=$SCRATCH/base_memory.cfg

# Open MPI refuses root and more ranks than cores unless told; with more
# ranks than cores, no binding.
MPIEXEC=(mpiexec -n "$NP")
if mpiexec --version 2>/dev/null | grep -q "Open MPI\|OpenRTE"; then
  MPIEXEC+=(--allow-run-as-root --oversubscribe --bind-to none)
fi
CORES=$(nproc)  # before OMP_NUM_THREADS, which GNU nproc obeys
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

echo "# meshlm frozen-base memory | $(date -u '+%Y-%m-%d %H:%M UTC') | $(hostname)"
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p') | $CORES cores | $(free -g | awk '/^Mem:/{print $2}') GiB | $(. /etc/os-release && echo "$PRETTY_NAME")"
echo "# git: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown) | bench: $BENCH | $NP ranks, OMP_NUM_THREADS=1"

if [[ ! -f $MODEL ]]; then
  $PY "$ROOT/tests/bench/make_gpt2_safetensors.py" --n_layer $L --n_embd $C --n_head $NH \
    --vocab_size $V --max_seq_len $MAXT --out "$MODEL"
fi
echo "# model: $MODEL ($(du -m "$MODEL" | cut -f1) MiB)"

# data.path must be set for the parameter file to parse; the bench never opens it.
cat > "$CFG" <<EOF
# Written by tests/bench/base_memory.sh: LoRA on an NF4 base, only what
# meshlm_base_bench reads ([model], [quant], [parallel] ranks_per_node).
[model]
n_layer = $L
n_head = $NH
n_embd = $C
vocab_size = $V
max_seq_len = $MAXT
seq_len = 128

[finetune]
mode = lora

[quant]
type = nf4
share = node
base = $MODEL
cache =

[parallel]
ranks_per_node = 0

[data]
path = $SCRATCH/tokens-unused.h5
EOF

# Drops a file's pages from the page cache (GNU dd; only this file).
evict() { dd if="$1" iflag=nocache count=0 status=none; }

SUMMARY=$SCRATCH/summary.txt
: > "$SUMMARY"
# run NAME [VAR=VALUE ...] -- [--section.key=value ...]: one mpiexec, its log, its result line
run() {
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local log=$SCRATCH/logs/run-$name.txt
  echo "# run $name: ${envs[*]}${envs[*]:+ }$*"
  env "${envs[@]}" "${MPIEXEC[@]}" "$BENCH" "$CFG" "$@" --label "$name" > "$log" 2>&1 || {
    cat "$log"; echo "run $name failed" >&2; exit 1; }
  grep -v '^# quantize' "$log"
  grep -m1 '^# label' "$log" > "$SCRATCH/header.txt"
  grep '^  ' "$log" >> "$SUMMARY"
}

run a-node-1node          -- --quant.share=node --parallel.ranks_per_node=0
run b-node-2nodes         -- --quant.share=node --parallel.ranks_per_node=$((NP / 2))
run c-per_rank            -- --quant.share=per_rank
run d-source-nocache      -- --quant.share=node --quant.cache=
rm -f "$CACHE"
run e-cache-miss          -- --quant.share=node --quant.cache="$CACHE"
run f-cache-hit           -- --quant.share=node --quant.cache="$CACHE"
run g-a-mmap_threshold1M  GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1048576 -- \
                             --quant.share=node --parallel.ranks_per_node=0
evict "$MODEL"
run h-source-cold         -- --quant.share=node --quant.cache=
evict "$MODEL"; evict "$CACHE"
run i-cache-hit-cold      -- --quant.share=node --quant.cache="$CACHE"

echo "#"
echo "# summary (logs: $SCRATCH/logs)"
cat "$SCRATCH/header.txt" "$SUMMARY"
# Start-up: load_s is column 7 of a result line.
awk '{t[substr($1, 1, 1)] = $7}
     function line(what, src, hit,   r) {
       r = t[src] / t[hit]
       printf "# start-up, %s: source %.2f s, cache hit %.2f s: %.1fx faster from the cache (target >= 5x: %s)\n",
              what, t[src], t[hit], r, (r >= 5 ? "met" : "missed")
     }
     END {
       printf "# cache miss (quantize + write the cache): %.2f s\n", t["e"]
       line("warm page cache (d, f)", "d", "f")
       line("cold page cache (h, i)", "h", "i")
     }' "$SUMMARY"
