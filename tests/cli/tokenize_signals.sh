#!/usr/bin/env bash
# tokenize_signals.sh MESHLM
#
# `meshlm tokenize` writes its output through a temporary file beside it:
#   1. SIGTERM in the middle of the write leaves neither the temporary file
#      nor the output;
#   2. SIGKILL leaves the temporary file, and the next writer of that output
#      removes it with a line saying so (and the lock file Open MPI's MPI-IO
#      keeps beside it while HDF5 opens it, "<temporary>-<job>-<pid>.lock",
#      when the kill came then).
set -u
meshlm=$(realpath "$1")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail=0
yes "a line of text that the byte-level tokenizer turns into ids" | head -c 150000000 > big.txt

# Waits until tokenize (pid $1, its output in log $2) has its temporary file; ends
# the test when it never appears.
wait_for_temp() {
  local i
  for ((i = 0; i < 1200; ++i)); do
    compgen -G "out.h5.tmp.*" > /dev/null && return
    kill -0 "$1" 2> /dev/null || break
    sleep 0.05
  done
  echo "FAIL: no temporary file out.h5.tmp.* appeared while tokenize ran"
  cat "$2"
  exit 1
}

"$meshlm" tokenize big.txt out.h5 > term.log 2>&1 &
pid=$!
wait_for_temp "$pid" term.log
kill -TERM "$pid"
wait "$pid"
rc=$?
if [ "$rc" -eq 0 ]; then echo "FAIL term: tokenize exited 0 after SIGTERM"; fail=1; fi
if compgen -G "out.h5*" > /dev/null; then
  echo "FAIL term: left behind:"; ls -la out.h5*; fail=1
else
  echo "ok term (exit status $rc, nothing left)"
fi

"$meshlm" tokenize big.txt out.h5 > kill.log 2>&1 &
pid=$!
wait_for_temp "$pid" kill.log
kill -KILL "$pid"
wait "$pid" 2> /dev/null
mapfile -t left < <(compgen -G "out.h5.tmp.*")
if [ ${#left[@]} -eq 0 ]; then echo "FAIL kill: SIGKILL left no temporary file to clean"; fail=1; fi
# The files MPI-IO keeps beside the temporary one while HDF5 opens it, as a
# kill at that moment leaves them (once in CI: "<temporary>-1-<pid>.lock").
if [ ${#left[@]} -eq 1 ]; then
  for f in "${left[0]}-1-$pid.lock" "${left[0]}.locktest.0"; do printf 'x' > "$f"; left+=("$f"); done
fi
printf 'small input\n' > small.txt
"$meshlm" tokenize small.txt out.h5 > next.log 2>&1 || { echo "FAIL kill: the next tokenize failed"; cat next.log; fail=1; }
if compgen -G "out.h5.tmp.*" > /dev/null; then
  echo "FAIL kill: the next writer left the stale file:"; ls -la out.h5.tmp.*; fail=1
else
  named=1
  for f in "${left[@]}"; do
    if ! grep -qF "/$f, a temporary file left by a process of this host that no longer runs" next.log; then
      echo "FAIL kill: no line names the removed file $f:"; cat next.log; named=0; fail=1
    fi
  done
  [ $named -eq 1 ] && echo "ok kill (the next writer removed ${left[*]} and said so)"
fi
exit $fail
