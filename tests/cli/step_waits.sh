#!/usr/bin/env bash
# step_waits.sh "MPIEXEC 1 RANK" MESHLM CFG
#
# How often a training step waits for a device backend, counted through the
# backend interface: runtime.op_timings counts the calls of every op of
# ops::Kernels, and only download and sum_of_squares return with a result
# on the host (an upload returns once its source may be reused, every other
# op is queued). On the emulated device (runtime.backend = emulated: the
# CUDA backend's code paths), one rank, 3 steps of 4 micro-batches:
#   * download: once per step (the micro-batches' mean losses, kept on the
#     device by GPT::forward_queued and read together after the backward),
#     not once per micro-batch;
#   * sum_of_squares: once per step (the gradient norm);
#   * mean: once per micro-batch (each loss reduced on the device);
# and the logged losses equal those of the CPU backend's run.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
one=$1
meshlm=$2
cfg=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
steps=3
micro=4
run=(--data.path=tokens.h5 --train.steps=$steps --train.batch_size=$micro --train.micro_batch_size=1
     --train.log_every=1 --checkpoint.final=false --train.eval_every=0)
# shellcheck disable=SC2086
bash "$limit" 120 $one "$meshlm" train "$cfg" "${run[@]}" --output.dir=cpu >cpu.log 2>&1 ||
  { cat cpu.log; echo "FAIL: the CPU run"; exit 1; }
# shellcheck disable=SC2086
bash "$limit" 120 $one "$meshlm" train "$cfg" "${run[@]}" --output.dir=emulated --runtime.backend=emulated \
  --runtime.op_timings=true >emulated.log 2>&1 || { cat emulated.log; echo "FAIL: the emulated run"; exit 1; }
calls() { awk -v op="$1" '$1 == op && $2 ~ /^[0-9]+$/ { print $2; found = 1 } END { if (!found) print 0 }' emulated.log; }
bad=0
for want in "download $steps" "sum_of_squares $steps" "mean $((steps * micro))"; do
  set -- $want
  got=$(calls "$1")
  echo "$1: $got calls in $steps steps of $micro micro-batches (want $2)"
  [ "$got" = "$2" ] || bad=1
done
losses() { awk 'NF == 6 && $1 ~ /^[0-9]+$/ { print $1, $2 }' "$1"; }
losses cpu.log >cpu.txt
losses emulated.log >emulated.txt
if [ "$(wc -l <cpu.txt)" != "$steps" ] || ! cmp -s cpu.txt emulated.txt; then
  paste cpu.txt emulated.txt; echo "FAIL: the logged losses differ from the CPU backend's"; bad=1
fi
[ $bad = 0 ] || { sed -n '/^# Time per op/,/all ops/p' emulated.log; echo FAIL; exit 1; }
echo "ok: one wait for the losses and one for the gradient norm per step"
