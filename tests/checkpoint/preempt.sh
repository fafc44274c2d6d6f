#!/usr/bin/env bash
# preempt.sh "MPIEXEC -n 2 ..." MESHLM TINY_CFG PYTHON
#
# A stop signal (SIGUSR1 to mpiexec, which forwards it, or SIGTERM to every
# rank as srun --signal does) ends training after the current step: every
# rank exits 0, the last line names the checkpoint, `latest` points at it;
# checkpoint.resume = auto picks it up and trains to the end. With no
# checkpoint there, resume = auto says so and starts fresh.
set -u
mpiexec=$1; meshlm=$2; cfg=$3; python=$4
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/meshlm_preempt_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
fail=0
for how in usr1-to-mpiexec term-to-ranks; do
  out="$dir/$how"
  args=(--data.path="$dir/tokens.h5" --output.dir="$out" --train.steps=3000 --train.log_every=1
        --checkpoint.resume=auto)
  $mpiexec "$meshlm" train "$cfg" "${args[@]}" > "$out.log" 2>&1 &
  launcher=$!
  for _ in $(seq 300); do grep -qE '^ +3 ' "$out.log" 2> /dev/null && break; sleep 0.1; done
  grep -q "no checkpoint in .*starting fresh" "$out.log" \
    || { echo "FAIL [$how]: resume = auto did not say it starts fresh"; fail=1; }
  if [ $how = usr1-to-mpiexec ]; then
    kill -USR1 $launcher
  else
    pkill -TERM -P $launcher  # the ranks, not the launcher (as srun --signal)
  fi
  ( sleep 120; kill -9 $launcher ) > /dev/null 2>&1 & guard=$!  # no hang
  wait $launcher; rc=$?
  pkill -P $guard 2> /dev/null; kill $guard 2> /dev/null
  if [ $rc -ne 0 ]; then
    tail -20 "$out.log"; echo "FAIL [$how]: exit status $rc, not 0"; fail=1; continue
  fi
  line=$(grep -E "(SIGUSR1|SIGTERM) received: stopped after step [0-9]+ of 3000; checkpoint .* written" "$out.log")
  [ -n "$line" ] || { tail -5 "$out.log"; echo "FAIL [$how]: no line naming the checkpoint"; fail=1; continue; }
  step=$(echo "$line" | sed -E 's/.*stopped after step ([0-9]+) .*/\1/')
  "$python" "$here/verify_dir.py" "$out/checkpoints" --latest "$step" || { fail=1; continue; }
  # Resumed: the next step is step + 1, and the run reaches its end (a
  # shorter run of the same schedule: train.steps is not the schedule's
  # length here, so stop the resumed run with a signal too, after two steps).
  $mpiexec "$meshlm" train "$cfg" "${args[@]}" > "$out.resume.log" 2>&1 &
  launcher=$!
  next=$((step + 2))
  for _ in $(seq 300); do grep -qE "^ +$next " "$out.resume.log" 2> /dev/null && break; sleep 0.1; done
  kill -USR1 $launcher; wait $launcher; rc=$?
  grep -q "resuming from .*step_$(printf %08d $step).h5" "$out.resume.log" \
    || { echo "FAIL [$how]: did not resume from step $step"; fail=1; continue; }
  first=$(grep -E '^ +[0-9]+ +[0-9.]+ ' "$out.resume.log" | head -1 | awk '{print $1}')
  [ "$first" = $((step + 1)) ] || { echo "FAIL [$how]: resumed at step $first, not $((step + 1))"; fail=1; continue; }
  [ $rc -eq 0 ] || { echo "FAIL [$how]: the resumed run exited $rc"; fail=1; continue; }
  echo "ok [$how]: stopped after step $step, resumed at step $first"
done
exit $fail
