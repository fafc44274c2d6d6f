#!/usr/bin/env bash
# nccl_one_rank.sh MPIEXEC1 MESHLM TINY_CFG QLORA_CFG [BACKEND]
#
# comm.device = nccl through whole runs at one rank per communicator (every
# group of the mesh an NCCL communicator of one: every code path of the
# engine's NCCL side runs on one GPU): tiny.cfg (full training) and
# qlora-tiny.cfg (LoRA on an NF4 base, also quant.broadcast = nccl) on one
# rank log the losses of the same runs under comm.device = host, bit for
# bit (a reduction over one rank moves no number), and the comm line names
# every group nccl. BACKEND: cuda (default; exit 77, skipped, where meshlm
# says this machine has no GPU it can use) or emulated (NCCL's order
# emulated by MPI, comm/ordered_comm.h), which checks this script without
# a GPU.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")/../cli" && pwd)/limit.sh
mpiexec1=$1
meshlm=$2
tiny=$3
qlora=$4
backend=${5:-cuda}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
losses() { awk 'NF == 6 && $1 ~ /^[0-9]+$/ { print $1, $2, $4 }' "$1"; }
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=$(dirname "$tiny")/../README.md
common=(--data.path=tokens.h5 --data.tokenize_from="$text" --train.steps=10 --train.log_every=1
        --runtime.backend="$backend")
for cfg in "$tiny" "$qlora"; do
  name=$(basename "$cfg" .cfg)
  for dev in host nccl; do
    extra=(--comm.device=$dev)
    [ "$dev" = nccl ] && [ "$cfg" = "$qlora" ] && extra+=(--quant.broadcast=nccl)
    log="${name}_$dev.log"
    # shellcheck disable=SC2086
    bash "$limit" 120 $mpiexec1 "$meshlm" train "$cfg" "${common[@]}" "${extra[@]}" \
      --parallel.tp=1 --parallel.pp=1 --parallel.dp=1 --output.dir="${name}_$dev" >"$log" 2>&1 || {
      if grep -q "can use no GPU" "$log"; then
        grep -m1 "can use no GPU" "$log"; echo "SKIP: no GPU"; exit 77
      fi
      cat "$log"; fail "$name, comm.device = $dev"
    }
    losses "$log" >"${name}_$dev.txt"
  done
  grep "# comm:" "${name}_nccl.log" | grep -q "dp nccl, tp nccl, pp nccl, .*world nccl;" ||
    { grep "# comm:" "${name}_nccl.log"; fail "$name: not every group took NCCL"; }
  [ "$(wc -l <"${name}_nccl.txt")" -eq 10 ] || fail "$name: not 10 steps logged"
  cmp -s "${name}_host.txt" "${name}_nccl.txt" ||
    { paste "${name}_host.txt" "${name}_nccl.txt"; fail "$name: nccl and host differ"; }
  echo "$name: 10 steps under comm.device = nccl, the losses and norms of host"
done
grep -q "through the node leaders' GPUs" qlora-tiny_nccl.log || fail "quant.broadcast = nccl not taken"
echo "PASS"
