#!/usr/bin/env bash
# same_losses.sh "MPIEXEC 1 RANK" "MPIEXEC N RANKS" MESHLM CFG OVERRIDES...
#
# Trains CFG on one rank and on N ranks with OVERRIDES (a parallel layout)
# and compares the logged losses. They are printed with 4 decimals, so they
# may differ by one unit of the last place where the two runs fall on either
# side of a rounding boundary (the 8-rank test in tests/mpi compares the
# values themselves within 1e-5 relative). With EXPECT_IN_LOG set, the
# N-rank run's log must hold that text (the overrides took effect).
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
one=$1
many=$2
meshlm=$3
cfg=$4
shift 4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
losses() { awk 'NF == 6 && $1 ~ /^[0-9]+$/ { print $1, $2 }' "$1"; }
# shellcheck disable=SC2086
bash "$limit" 60 $one "$meshlm" train "$cfg" --data.path=tokens.h5 --output.dir=one >one.log 2>&1 ||
  { cat one.log; echo "FAIL: one rank"; exit 1; }
# shellcheck disable=SC2086
bash "$limit" 90 $many "$meshlm" train "$cfg" --data.path=tokens.h5 --output.dir=many "$@" >many.log 2>&1 ||
  { cat many.log; echo "FAIL: $many $*"; exit 1; }
cat many.log
if [ -n "${EXPECT_IN_LOG:-}" ] && ! grep -qF -- "$EXPECT_IN_LOG" many.log; then
  echo "FAIL: the log of the layout does not say: $EXPECT_IN_LOG"; exit 1
fi
losses one.log >one.txt
losses many.log >many.txt
echo "---- step, loss on one rank | on the layout"
paste one.txt many.txt
[ -s one.txt ] || { echo "FAIL: no losses logged"; exit 1; }
paste one.txt many.txt | awk '
  { if ($1 != $3) { print "FAIL: steps differ"; bad = 1 }
    d = $2 - $4; if (d < 0) d = -d
    if (d > 1.5e-4) { print "FAIL: step " $1 ": " $2 " vs " $4; bad = 1 } }
  END { exit bad }'
