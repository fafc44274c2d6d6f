#!/usr/bin/env bash
# concurrent_cache_writers.sh CACHE_WRITER [MIB] [ROUNDS]
#
# Two processes write the same quantization cache at once (different bytes,
# ROUNDS times each, about MIB MiB a file) while a third reads it in a loop.
# Each write goes to its own temporary file and is renamed over the cache,
# so every read must find no file yet or one writer's whole cache, never a
# torn or mixed one; at the end the cache, and no temporary file, is left.
set -u
tool=$1
mib=${2:-24}
rounds=${3:-20}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
mkdir cache

timeout 200 "$tool" check cache/q.h5 "$mib" 1,2 stop >check.log 2>&1 &
reader=$!
sleep 1  # the reader is reading (and finding nothing) before the writers start
timeout 120 "$tool" write cache/q.h5 "$mib" 1 "$rounds" >w1.log 2>&1 &
w1=$!
timeout 120 "$tool" write cache/q.h5 "$mib" 2 "$rounds" >w2.log 2>&1 &
w2=$!
wait $w1
rc1=$?
wait $w2
rc2=$?
touch stop
wait $reader
rcr=$?
cat w1.log w2.log check.log

fail=0
[ "$rc1" -eq 0 ] || { echo "FAIL: writer 1 exited with status $rc1"; fail=1; }
[ "$rc2" -eq 0 ] || { echo "FAIL: writer 2 exited with status $rc2"; fail=1; }
[ "$rcr" -eq 0 ] || { echo "FAIL: the reader found a bad cache (status $rcr)"; fail=1; }
left=$(find cache -mindepth 1 -printf "%f ")
[ "$left" = "q.h5 " ] || { echo "FAIL: the cache directory holds: $left"; fail=1; }
exit $fail
