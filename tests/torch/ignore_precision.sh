#!/usr/bin/env bash
# ignore_precision.sh ARGS...: runs $MESHLM_REFDUMP ARGS without
# "--precision X": a meshlm that ignores train.precision, which the bf16
# check must catch.
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = --precision ]; then shift 2; continue; fi
  args+=("$1")
  shift
done
exec "$MESHLM_REFDUMP" "${args[@]}"
