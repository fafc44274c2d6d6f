#!/usr/bin/env bash
# kill_and_resume.sh "MPIEXEC -n 2 ..." MESHLM TINY_CFG PYTHON
#
# A run killed (SIGKILL of one rank) at every point of writing a checkpoint
# leaves the previous checkpoint loadable and `latest` naming a complete
# file; resuming with checkpoint.resume = auto then gives the losses of an
# uninterrupted run bit for bit (run.h5, float64: steps 1-4 carried over
# from the killed run's log, 5-8 trained again), and the next save removes
# the dead run's temporary file. The same under checkpoint.async, whose
# background writer dies at the point named while training goes on.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")/../cli" && pwd)/limit.sh
mpiexec=$1; meshlm=$2; cfg=$3; python=$4
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/meshlm_kill_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
common=(--data.path="$dir/tokens.h5" --train.steps=8 --train.log_every=1 --checkpoint.every=2
        --checkpoint.keep_last=0 --data.shuffle=true --parallel.zero_stage=1)

bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$dir/whole" \
  > "$dir/whole.log" 2>&1 || { cat "$dir/whole.log"; echo "FAIL: the uninterrupted run failed"; exit 1; }

fail=0
for spec in create tensors checksums rename latest async:tensors async:latest; do
  point=${spec#async:}
  async=false; [ "$spec" != "$point" ] && async=true
  out="$dir/${spec/:/_}"
  # Rank 0 renames and moves `latest`; any rank may die before.
  victim=1; case $point in rename|latest) victim=0 ;; esac
  bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$out" \
    --checkpoint.async=$async --debug.kill_in_checkpoint=$point --debug.kill_step=6 --debug.kill_rank=$victim > "$out.log" 2>&1
  rc=$?
  # mpiexec may return before the other ranks are gone (SIGTERM, then SIGKILL).
  for _ in $(seq 50); do pgrep -f -- "--output.dir=$out" > /dev/null || break; sleep 0.2; done
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    echo "FAIL [$spec]: the killed run exited $rc (0: not killed; 124: hung)"; fail=1; continue
  fi
  # The checkpoint of step 6 is complete only when killed after its rename.
  expect_steps=2,4; [ $point = latest ] && expect_steps=2,4,6
  # (a temporary file may be left by the dead run: allowed until the next save)
  ls "$out/checkpoints" | grep -q '\.tmp\.' && had_tmp=1 || had_tmp=0
  find "$out/checkpoints" -name '*.tmp.*' -delete -print > "$dir/tmp_${spec/:/_}.txt"
  if ! "$python" "$here/verify_dir.py" "$out/checkpoints" --latest 4 --steps $expect_steps; then
    echo "FAIL [$spec]: what the killed run left is not consistent"; fail=1; continue
  fi
  # Put the dead run's temporary file back (if any): the next save removes
  # it once its writer is gone (a killed process may linger as a zombie a
  # moment: it still counts as running).
  if [ -s "$dir/tmp_${spec/:/_}.txt" ]; then
    while read -r f; do
      echo junk > "$f"
      pid=$(basename "$f" | awk -F. '{print $(NF-1)}')
      for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
    done < "$dir/tmp_${spec/:/_}.txt"
  fi
  bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$out" \
    --checkpoint.async=$async --checkpoint.resume=auto > "$out.resume.log" 2>&1 \
    || { cat "$out.resume.log"; echo "FAIL [$spec]: the resumed run failed"; fail=1; continue; }
  grep -q "resuming from .*step_00000004.h5" "$out.resume.log" \
    || { echo "FAIL [$spec]: did not resume from step 4"; fail=1; continue; }
  "$python" "$here/verify_dir.py" "$out/checkpoints" --latest 8 --steps 2,4,6,8 || { fail=1; continue; }
  "$python" - "$dir/whole/run.h5" "$out/run.h5" <<'PY' || fail=1
import sys, h5py, numpy as np
a, b = (h5py.File(p) for p in sys.argv[1:3])
steps_a, loss_a = a["metrics/step"][:], a["metrics/loss"][:]
steps_b, loss_b = b["metrics/step"][:], b["metrics/loss"][:]
# Steps 1-4 carried over from the killed run's log, 5-8 trained again.
assert list(steps_b) == list(range(1, 9)), f"resumed run.h5 holds steps {list(steps_b)}"
assert list(b["resumed_at_steps"][:]) == [4], list(b["resumed_at_steps"][:])
want = loss_a[np.searchsorted(steps_a, steps_b)]
assert np.array_equal(loss_b, want), f"losses differ: {loss_b} vs {want}"
for c in ["lr", "grad_norm"]:
    assert np.array_equal(b["metrics/" + c][:], a["metrics/" + c][np.searchsorted(steps_a, steps_b)]), c
print(f"{sys.argv[2]}: steps 1-8 (1-4 carried over) equal the uninterrupted run's bit for bit")
PY
  echo "ok [$spec] (temporary file left by the kill: $had_tmp)"
done
exit $fail
