#!/usr/bin/env bash
# abort_backstop.sh "MPIEXEC LINE (2 ranks)" MESHLM CFG HUNG_ABORT_LIB
#
# A rank fails (debug.fail_rank) and calls MPI_Abort, which here never
# returns and never ends the process (HUNG_ABORT_LIB, preloaded into the
# ranks, stands in for a launcher that does not answer). The rank must end
# itself after comm/errors.h's kAbortGraceSeconds (10 s), saying so, and the
# job must end non-zero, the other rank with it: no hang.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
mpiexec_line=$1
meshlm=$2
cfg=$3
lib=$4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
start=$SECONDS
# shellcheck disable=SC2086
bash "$limit" 60 $mpiexec_line -x LD_PRELOAD="$lib" "$meshlm" train "$cfg" --parallel.dp=2 \
  --debug.fail_rank=1 --debug.fail_step=2 --data.path=tokens.h5 --output.dir=out >log 2>&1
rc=$?
took=$((SECONDS - start))
cat log
echo "---- exit status $rc after $took s"
fail=0
[ "$rc" -eq 124 ] && { echo "FAIL: the job hung"; fail=1; }
[ "$rc" -eq 0 ] && { echo "FAIL: expected a non-zero exit status"; fail=1; }
grep -Eq "ERROR on rank 1: .*failure injected by debug.fail_rank = 1 at step 2" log ||
  { echo "FAIL: no error naming rank 1"; fail=1; }
grep -q "rank 1: MPI_Abort has not ended this process in 10 s; it exits (status 1)" log ||
  { echo "FAIL: rank 1 did not end itself after MPI_Abort hung"; fail=1; }
exit $fail
