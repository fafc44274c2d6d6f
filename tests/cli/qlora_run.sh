#!/usr/bin/env bash
# qlora_run.sh "MPIEXEC 1 RANK" "MPIEXEC 8 RANKS" MESHLM QLORA_CFG
#
# The LoRA fine-tuning run as a user meets it, in a scratch directory:
#  1. `meshlm quantize` builds quant.cache ahead of the run (a miss, written);
#  2. `mpiexec -n 8 meshlm train qlora-tiny.cfg` (dp 2 x tp 2 x pp 2) loads it
#     (a hit), shares it once per node and trains: the loss falls;
#  3. the same run with the cache cut in half warns, quantizes again,
#     replaces the cache, and logs the same losses;
#  4. quant.broadcast = nccl on the emulated device (four nodes of two
#     ranks, a wider model), from the cache and from the source: the losses
#     of quant.broadcast = mpi;
#  5. the same run with quant.share = per_rank and no cache logs the same
#     losses (the same bytes, held once per rank);
#  6. one rank with the whole model logs the same losses (4 decimals).
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
one=$1
many=$2
meshlm=$3
cfg=$4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
losses() { awk 'NF == 6 && $1 ~ /^[0-9]+$/ { print $1, $2 }' "$1"; }
common=(--data.path=tokens.h5 --quant.cache=cache/base.h5 --train.steps=12 --train.log_every=4)

# shellcheck disable=SC2086
bash "$limit" 60 $one "$meshlm" quantize "$cfg" "${common[@]}" >quantize.log 2>&1 ||
  { cat quantize.log; fail "meshlm quantize"; }
cat quantize.log
grep -q "written to cache/base.h5" quantize.log || fail "quantize did not write the cache"
[ -s cache/base.h5 ] || fail "no cache file"
# shellcheck disable=SC2086
bash "$limit" 60 $one "$meshlm" quantize "$cfg" "${common[@]}" >quantize2.log 2>&1 || fail "second quantize"
grep -q "cache is up to date" quantize2.log || { cat quantize2.log; fail "second quantize did not find the cache"; }

# shellcheck disable=SC2086
bash "$limit" 120 $many "$meshlm" train "$cfg" "${common[@]}" --output.dir=hit >hit.log 2>&1 ||
  { cat hit.log; fail "8-rank LoRA run"; }
cat hit.log
grep -q "node-shared windows" hit.log || fail "the base is not in node-shared windows"
grep -q "cache hit" hit.log || fail "the run did not load the cache"
losses hit.log >hit.txt
[ "$(wc -l <hit.txt)" -ge 3 ] || fail "no losses logged"
awk 'NR == 1 { first = $2 } { last = $2 } END { exit !(last < first - 0.2) }' hit.txt ||
  fail "the loss did not fall: $(tr '\n' ' ' <hit.txt)"

# A truncated cache: a warning, quantized again, replaced, same losses.
size=$(stat -c %s cache/base.h5)
truncate -s $((size / 2)) cache/base.h5
# shellcheck disable=SC2086
bash "$limit" 120 $many "$meshlm" train "$cfg" "${common[@]}" --output.dir=corrupt >corrupt.log 2>&1 ||
  { cat corrupt.log; fail "run with a corrupt cache"; }
grep -q "WARNING: quant.cache" corrupt.log || { cat corrupt.log; fail "no warning about the corrupt cache"; }
[ "$(stat -c %s cache/base.h5)" -eq "$size" ] || fail "the corrupt cache was not replaced"
losses corrupt.log >corrupt.txt
cmp -s hit.txt corrupt.txt || { paste hit.txt corrupt.txt; fail "losses differ after re-quantizing"; }

# quant.broadcast = nccl on the emulated device, four nodes of two ranks,
# n_embd 256 (a store of 1.6 MiB): MPI_Bcast into the windows (the cache
# written), then through the four leaders' "GPUs" in chunks of 1 MiB from
# the cache (whole) and from the source (tensor by tensor): the same losses.
wide=(--data.path=tokens.h5 --train.steps=4 --train.log_every=1 --model.n_embd=256
      --runtime.backend=emulated --parallel.ranks_per_node=2 --comm.bucket_mb=1)
for run in mpi:cache/wide.h5 nccl:cache/wide.h5 nccl:; do
  how=${run%%:*} cache=${run#*:}
  # shellcheck disable=SC2086
  bash "$limit" 120 $many "$meshlm" train "$cfg" "${wide[@]}" --quant.broadcast="$how" \
    --quant.cache="$cache" --output.dir="wide_$how${cache:+_cache}" >"wide_$how${cache:+_cache}.log" 2>&1 ||
    { cat "wide_$how${cache:+_cache}.log"; fail "quant.broadcast = $how (cache '$cache')"; }
  losses "wide_$how${cache:+_cache}.log" >"wide_$how${cache:+_cache}.txt"
done
grep -q "through the node leaders' GPUs" wide_nccl_cache.log || fail "quant.broadcast = nccl not taken"
grep -q "cache hit" wide_nccl_cache.log || fail "the nccl run did not load the cache"
for t in wide_nccl_cache.txt wide_nccl.txt; do
  [ "$(wc -l <"$t")" -eq 4 ] || fail "$t: not 4 losses"
  cmp -s wide_mpi_cache.txt "$t" || { paste wide_mpi_cache.txt "$t"; fail "quant.broadcast = nccl: other losses ($t)"; }
done

# shellcheck disable=SC2086
bash "$limit" 120 $many "$meshlm" train "$cfg" "${common[@]}" --quant.share=per_rank --quant.cache= \
  --output.dir=per_rank >per_rank.log 2>&1 || { cat per_rank.log; fail "per_rank run"; }
grep -q "private copies" per_rank.log || fail "per_rank did not keep private copies"
losses per_rank.log >per_rank.txt
cmp -s hit.txt per_rank.txt || { paste hit.txt per_rank.txt; fail "per_rank losses differ"; }

# shellcheck disable=SC2086
bash "$limit" 120 $one "$meshlm" train "$cfg" "${common[@]}" --parallel.tp=1 --parallel.pp=1 \
  --output.dir=one >one.log 2>&1 || { cat one.log; fail "one-rank run"; }
losses one.log >one.txt
echo "---- step, loss: 8 ranks | one rank"
paste hit.txt one.txt
paste hit.txt one.txt | awk '
  { d = $2 - $4; if (d < 0) d = -d
    if ($1 != $3 || d > 1.5e-4) { print "FAIL: step " $1 ": " $2 " vs " $4; bad = 1 } }
  END { exit bad }'
