#!/usr/bin/env bash
# injected_failure.sh "MPIEXEC LINE (4 ranks)" MESHLM CFG [OVERRIDES...]
#
# debug.fail_rank makes one rank throw in the forward of debug.fail_step, in
# the middle of a tp=2 x pp=2 run whose other ranks are inside collectives
# and pipeline receives. The job must end (no hang), non-zero, and the
# message must name the failing rank.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
mpiexec_line=$1
meshlm=$2
cfg=$3
shift 3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail=0
for bad in 1 2; do
  # shellcheck disable=SC2086
  bash "$limit" 60 $mpiexec_line "$meshlm" train "$cfg" --parallel.tp=2 --parallel.pp=2 \
    --debug.fail_rank=$bad --debug.fail_step=3 --data.path=tokens.h5 --output.dir=out --output.overwrite=true "$@" >log 2>&1
  rc=$?
  cat log
  echo "---- rank $bad failing: exit status $rc"
  [ "$rc" -eq 124 ] && { echo "FAIL: the job hung"; fail=1; }
  [ "$rc" -eq 0 ] && { echo "FAIL: expected a non-zero exit status"; fail=1; }
  grep -Eq "ERROR on rank $bad: .*failure injected by debug.fail_rank = $bad at step 3" log ||
    { echo "FAIL: no error naming rank $bad"; fail=1; }
  # Steps before the failure ran (the failure is mid-run, not at start-up).
  grep -Eq "^ +1 +[0-9.]+ " log || { echo "FAIL: step 1 was not logged"; fail=1; }
done
exit $fail
