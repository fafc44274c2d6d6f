#!/usr/bin/env bash
# sbatch_requeue.sh MESHLM SOURCE_DIR PYTHON
#
# Preemption and requeue of jobscripts/slurm.sbatch in the one-node test
# cluster (cluster.sh): inputs/tiny.cfg, 2000 steps on 1 node x 2 tasks.
# First an uninterrupted job (the reference). Then, once a job has logged a
# few steps, SIGUSR1:
#  - to the batch shell (scancel --signal=USR1 --batch, as --signal=B:USR1@N
#    sends it at the time limit), launched by srun and by mpiexec;
#  - to the job step's tasks (scancel --signal=USR1, as --signal=USR1@N).
# Each time meshlm writes a checkpoint (verified: tests/checkpoint/
# verify_dir.py) and exits 0, the script requeues the job, which starts
# again under the same job id (Restarts=1) after the requeue delay
# (cred_expire + 1 s: 6 s here) and resumes from `latest`; the job ends
# COMPLETED, 0:0, and out/<id>/run.h5 holds the reference's losses (and lr,
# grad_norm) bit for bit, float64, for all 2000 steps; a job submitted with
# --dependency=afterok on it runs only after that end.
# Last, scancel (SIGTERM): a checkpoint, and the job stays CANCELLED.
# Exit status 77 (skipped) where the cluster cannot start.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/cluster.sh"
cluster_test "$@"
steps=2000
submit=(sbatch --parsable -N1 --ntasks-per-node=2 -n2 -c1 --chdir="$work" "$src/jobscripts/slurm.sbatch"
        "$src/inputs/tiny.cfg" --data.path="$work/tokens.h5" --train.steps="$steps" --train.log_every=1)
fail=0

ref=$("${submit[@]}") || { echo "FAIL: sbatch"; exit 1; }
wait_job "$ref" "$JOB_ENDED" 60 || exit 1
if [ "$(job_field "$ref" JobState) $(job_field "$ref" ExitCode)" != "COMPLETED 0:0" ]; then
  tail -20 "$work/meshlm-$ref.out"; echo "FAIL [reference]: job $ref did not end COMPLETED 0:0"; exit 1
fi
echo "ok [reference]: job $ref, $steps steps, COMPLETED 0:0"

# started ID: waits (bounded) until the job's output file shows step 20.
started() {
  local f="$work/meshlm-$1.out"
  for _ in $(seq 300); do grep -qE '^ +20 ' "$f" 2> /dev/null && return 0; sleep 0.1; done
  echo "FAIL [$how]: job $1 logged no step within 30 s (state $(job_field "$1" JobState))"
  tail -20 "$f" 2> /dev/null
  return 1
}

for how in usr1-batch:srun usr1-batch:mpiexec usr1-steps:srun; do
  launch=${how#*:}
  id=$(MESHLM_LAUNCH=$launch "${submit[@]}") || { echo "FAIL: sbatch"; exit 1; }
  f=$work/meshlm-$id.out
  # afterok waits through the requeue: the last step is logged when it runs.
  after=$(sbatch --parsable -N1 -n1 --chdir="$work" --output="$work/after-$id.out" \
          --dependency=afterok:"$id" --wrap "grep -qE '^ +$steps ' $f") || { echo "FAIL: sbatch --dependency"; exit 1; }
  started "$id" || { fail=1; continue; }
  if [ "${how%:*}" = usr1-batch ]; then
    scancel --signal=USR1 --batch "$id"
  else
    scancel --signal=USR1 "$id"
  fi || { echo "FAIL [$how]: scancel --signal=USR1 $id"; fail=1; continue; }
  # Requeued (Restarts=1), started again, ended.
  for _ in $(seq 150); do [ "$(job_field "$id" Restarts)" = 1 ] && break; sleep 0.2; done
  if [ "$(job_field "$id" Restarts)" != 1 ]; then
    tail -20 "$f"; echo "FAIL [$how]: job $id was not requeued within 30 s"; fail=1; continue
  fi
  wait_job "$id" "$JOB_ENDED" 60 || { tail -20 "$f"; echo "FAIL [$how]: the requeued job $id did not end"; fail=1; continue; }
  state="$(job_field "$id" JobState) $(job_field "$id" ExitCode) restarts $(job_field "$id" Restarts)"
  [ "$state" = "COMPLETED 0:0 restarts 1" ] \
    || { tail -30 "$f"; echo "FAIL [$how]: job $id ended $state, not COMPLETED 0:0 restarts 1"; fail=1; continue; }
  line=$(grep -E "^# SIGUSR1 received: stopped after step [0-9]+ of $steps; checkpoint .* written" "$f")
  [ -n "$line" ] || { cat "$f"; echo "FAIL [$how]: no line naming the checkpoint"; fail=1; continue; }
  stop=$(sed -E 's/.*stopped after step ([0-9]+) .*/\1/' <<< "$line")
  [ "$stop" -lt $steps ] || { echo "FAIL [$how]: the signal came after the last step"; fail=1; continue; }
  grep -q "^# meshlm job $id: stopped by a signal with a checkpoint; requeued" "$f" \
    || { echo "FAIL [$how]: the script did not say it requeued the job"; fail=1; continue; }
  grep -q "^# meshlm job $id: .*, start 1: " "$f" || { echo "FAIL [$how]: no second start in $f"; fail=1; continue; }
  grep -q "resuming from .*step_$(printf %08d "$stop").h5" "$f" \
    || { grep checkpoint "$f"; echo "FAIL [$how]: the requeued job did not resume from step $stop"; fail=1; continue; }
  grep -qE "^ +$steps " "$f" || { echo "FAIL [$how]: no line of step $steps"; fail=1; continue; }
  "$python" "$src/tests/checkpoint/verify_dir.py" "$work/out/$id/checkpoints" --latest "$stop" --steps "$stop" \
    || { echo "FAIL [$how]: checkpoints of job $id"; fail=1; continue; }
  "$python" "$here/compare_runs.py" "$work/out/$ref/run.h5" "$work/out/$id/run.h5" $steps --resumed-at "$stop" \
    || { fail=1; continue; }
  wait_job "$after" "$JOB_ENDED" 30 && [ "$(job_field "$after" JobState)" = COMPLETED ] \
    || { echo "FAIL [$how]: the afterok job $after ran before the requeued job $id had ended"; fail=1; continue; }
  t0=$(date -d "$(sed -nE "s/^# meshlm job $id: stopped .*requeued \((.*)\)$/\1/p" "$f")" +%s)
  t1=$(date -d "$(sed -nE "s/^# meshlm job $id: (.*), start 1: .*/\1/p" "$f")" +%s)
  echo "ok [$how]: job $id stopped after step $stop, requeued, started again $((t1 - t0)) s later, resumed, COMPLETED; then job $after (afterok)"
done

# scancel: SIGTERM to the batch shell and the ranks; a checkpoint, no requeue.
how=scancel
id=$("${submit[@]}") || { echo "FAIL: sbatch"; exit 1; }
f=$work/meshlm-$id.out
if started "$id"; then
  scancel "$id"
  wait_job "$id" "$JOB_ENDED" 30 || fail=1
  sleep $((CLUSTER_CRED_EXPIRE + 2))  # past the begin time a requeue would have set
  state="$(job_field "$id" JobState) restarts $(job_field "$id" Restarts)"
  line=$(grep -E "^# SIG(TERM|USR1) received: stopped after step [0-9]+ of $steps; checkpoint .* written" "$f")
  if [ "$state" != "CANCELLED restarts 0" ]; then
    tail -20 "$f"; echo "FAIL [scancel]: job $id is $state, not CANCELLED restarts 0"; fail=1
  elif [ -z "$line" ]; then
    tail -20 "$f"; echo "FAIL [scancel]: no line naming a checkpoint"; fail=1
  else
    stop=$(sed -E 's/.*stopped after step ([0-9]+) .*/\1/' <<< "$line")
    if "$python" "$src/tests/checkpoint/verify_dir.py" "$work/out/$id/checkpoints" --latest "$stop"; then
      echo "ok [scancel]: job $id checkpointed step $stop and stayed CANCELLED"
    else
      echo "FAIL [scancel]: checkpoints of job $id"; fail=1
    fi
  fi
else
  fail=1
fi
exit $fail
