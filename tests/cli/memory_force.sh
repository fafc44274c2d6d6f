#!/usr/bin/env bash
# memory_force.sh "MPIEXEC LINE" MESHLM TINY_CFG
#
# memory.force = true: a run predicted above memory.limit_per_rank and
# memory.limit_per_node starts anyway, with a warning naming the rank, the
# node and the limits, trains and writes its run log.
set -u
mpiexec_line=$1
meshlm=$2
cfg=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
# shellcheck disable=SC2086
$mpiexec_line "$meshlm" train "$cfg" --parallel.pp=2 --train.steps=2 --memory.limit_per_rank=1MiB \
  --memory.limit_per_node=2MiB --memory.force=true >log 2>&1
rc=$?
cat log
echo "---- exit status $rc"
fail=0
[ "$rc" -eq 0 ] || { echo "FAIL: expected exit status 0"; fail=1; }
for want in "WARNING: rank 0 \(dp 0 tp 0 pp 0, node 0\) is predicted to need .*more than memory.limit_per_rank = 1MiB .*\(2 ranks in all are over\); starting anyway \(memory.force = true\)" \
            "WARNING: the 2 rank\(s\) of node 0 are predicted to need .* together, more than memory.limit_per_node = 2MiB .*starting anyway \(memory.force = true\)" \
            "^ +2 +[0-9.]+ "; do
  grep -Eq -- "$want" log || { echo "FAIL: no line matches: $want"; fail=1; }
done
[ -s out/tiny/run.h5 ] || { echo "FAIL: no run log out/tiny/run.h5"; fail=1; }
exit $fail
