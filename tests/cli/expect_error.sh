#!/usr/bin/env bash
# expect_error.sh REGEX "MPIEXEC LINE" MESHLM ARGS...
#
# Runs `MPIEXEC MESHLM ARGS` in a fresh scratch directory (ARGS may say
# @SCRATCH@ for it) and passes when the command
#   - exits non-zero,
#   - prints REGEX (extended regex) on stdout or stderr,
#   - leaves no output directory (out/) and no temporary file behind,
#   - and was not aborted: every rank found the error and exited by itself
#     (an error of some ranks only is printed as "ERROR on rank N:" and
#     aborts the job).
set -u
regex=$1
mpiexec_line=$2
meshlm=$3
shift 3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
args=()
for a in "$@"; do args+=("${a//@SCRATCH@/$scratch}"); done

cd "$scratch" || exit 1
# shellcheck disable=SC2086
$mpiexec_line "$meshlm" "${args[@]}" >"$scratch/.log" 2>&1
rc=$?
cat "$scratch/.log"
echo "---- exit status $rc"
fail=0
if [ "$rc" -eq 0 ]; then
  echo "FAIL: expected a non-zero exit status"; fail=1
fi
if ! grep -Eq -- "$regex" "$scratch/.log"; then
  echo "FAIL: output does not match: $regex"; fail=1
fi
if grep -Eq "ERROR on rank [0-9]+:|MPI_ABORT was invoked" "$scratch/.log"; then
  echo "FAIL: the job was aborted; every rank should reach this error"; fail=1
fi
if [ -e "$scratch/out" ]; then
  echo "FAIL: an output directory was written:"; find "$scratch/out"; fail=1
fi
left=$(find "$scratch" -name '*.tmp.*')
if [ -n "$left" ]; then
  echo "FAIL: temporary files left behind: $left"; fail=1
fi
exit $fail
