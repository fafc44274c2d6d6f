#!/usr/bin/env bash
# rank_error_mid_run.sh "MPIEXEC LINE" MESHLM TINY_CFG
#
# A raw token file (which carries no vocabulary) holding ids the model does
# not have: every id of the file is checked before anything trains or is
# written, so the job stops at start-up on every rank, naming the file and
# the id, leaves no output directory, and does not hang. (A failure in the
# middle of a run is tests/cli/injected_failure.sh.)
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")" && pwd)/limit.sh
mpiexec_line=$1
meshlm=$2
cfg=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1

# Raw tokens: "MESHTOK1", format_version 1, 2 bytes per token, 200 tokens,
# all equal to 300 (0x012c), which is >= model.vocab_size = 256.
{
  printf 'MESHTOK1\x01\x00\x00\x00\x02\x00\x00\x00\xc8\x00\x00\x00\x00\x00\x00\x00'
  for _ in $(seq 200); do printf '\x2c\x01'; done
} > tokens.bin

# shellcheck disable=SC2086
bash "$limit" 60 $mpiexec_line "$meshlm" train "$cfg" --data.path=tokens.bin --data.tokenize_from= \
  --output.dir=out >log 2>&1
rc=$?
cat log
echo "---- exit status $rc"
fail=0
[ "$rc" -eq 124 ] && { echo "FAIL: the job hung"; fail=1; }
[ "$rc" -eq 0 ] && { echo "FAIL: expected a non-zero exit status"; fail=1; }
grep -Eq "ERROR: data.path: token file 'tokens.bin': position 0 has id 300, >= vocab_size 256 \(model.vocab_size\)" log ||
  { echo "FAIL: no error naming the file and the id"; fail=1; }
[ -e out ] && { echo "FAIL: an output directory was written"; fail=1; }
exit $fail
