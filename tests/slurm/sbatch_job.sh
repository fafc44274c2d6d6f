#!/usr/bin/env bash
# sbatch_job.sh MESHLM SOURCE_DIR PYTHON
#
# jobscripts/slurm.sbatch as a plain job in the one-node test cluster
# (cluster.sh), inputs/tiny.cfg on 1 node x 2 tasks x 1 CPU:
#  - launched by srun --mpi=pmix (MESHLM_LAUNCH=auto picks it) and by
#    mpiexec inside the allocation (MESHLM_LAUNCH=mpiexec): each job ends
#    COMPLETED with exit code 0:0, its output file meshlm-<id>.out holds the
#    header, every step and the run log's path, out/<id>/run.h5 every step;
#    both launchers give the same losses bit for bit;
#  - the header's sweep: a job array over MESHLM_SWEEP (train.lr) and a job
#    that depends on it (afterok) and starts only after both tasks.
# Exit status 77 (skipped) where the cluster cannot start.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/cluster.sh"
cluster_test "$@"
submit=(sbatch --parsable -N1 --ntasks-per-node=2 -n2 -c1 --chdir="$work")
train=("$src/inputs/tiny.cfg" --data.path="$work/tokens.h5" --train.steps=40 --train.log_every=1)
fail=0
step_line='^ +[0-9]+ +[0-9]+\.[0-9]+ +[0-9.]+e[-+][0-9]+ '  # step loss lr ...

# check_job ID LAUNCHER: COMPLETED, 0:0, the output file and run.h5.
check_job() {
  local id=$1 launcher=$2 f="$work/meshlm-$1.out" state code
  wait_job "$id" "$JOB_ENDED" 60 || return 1
  state=$(job_field "$id" JobState); code=$(job_field "$id" ExitCode)
  if [ "$state" != COMPLETED ] || [ "$code" != 0:0 ]; then
    tail -20 "$f"; echo "FAIL [$launcher]: job $id ended $state, exit code $code (not COMPLETED, 0:0)"; return 1
  fi
  grep -q "^# meshlm job $id: .*1 nodes x 2 ranks, 1 threads/rank, $launcher$" "$f" \
    || { head -5 "$f"; echo "FAIL [$launcher]: no header line naming 2 ranks and $launcher in $f"; return 1; }
  [ "$(grep -cE "$step_line" "$f")" = 40 ] \
    || { echo "FAIL [$launcher]: $f does not hold 40 step lines"; return 1; }
  grep -q "^# run log: out/$id/run.h5" "$f" || { tail -3 "$f"; echo "FAIL [$launcher]: no run log line"; return 1; }
  echo "ok [$launcher]: job $id COMPLETED 0:0; $f holds the header, 40 steps and the run log"
}

id_srun=$("${submit[@]}" "$src/jobscripts/slurm.sbatch" "${train[@]}") || { echo "FAIL: sbatch"; exit 1; }
check_job "$id_srun" srun || fail=1
id_mpiexec=$(MESHLM_LAUNCH=mpiexec "${submit[@]}" "$src/jobscripts/slurm.sbatch" "${train[@]}") \
  || { echo "FAIL: sbatch"; exit 1; }
check_job "$id_mpiexec" mpiexec || fail=1
if [ $fail = 0 ]; then
  "$python" "$here/compare_runs.py" "$work/out/$id_srun/run.h5" "$work/out/$id_mpiexec/run.h5" 40 || fail=1
fi

# The sweep of the script's header: two learning rates, then a job after both.
jid=$(MESHLM_SWEEP="train.lr=1e-3 2e-3" "${submit[@]}" --array=0-1 "$src/jobscripts/slurm.sbatch" "${train[@]}") \
  || { echo "FAIL: sbatch --array"; exit 1; }
after=$(sbatch --parsable -N1 -n1 --chdir="$work" --output="$work/after.out" --dependency=afterok:"$jid" \
        --wrap "ls out/${jid}_0/run.h5 out/${jid}_1/run.h5") || { echo "FAIL: sbatch --dependency"; exit 1; }
reason=$(job_field "$after" Reason)
sweep_fail() { echo "FAIL [sweep]: $1"; fail=1; scancel "$after" 2> /dev/null; exit $fail; }
for t in 0 1; do
  wait_job "${jid}_$t" "$JOB_ENDED" 60 || sweep_fail "array task ${jid}_$t did not end"
  [ "$(job_field "${jid}_$t" JobState)" = COMPLETED ] \
    || { tail -5 "$work/meshlm-$(job_field "${jid}_$t" JobId).out"; sweep_fail "array task ${jid}_$t did not complete"; }
done
[ "$reason" = Dependency ] || sweep_fail "the afterok job was '$reason' at submission, not Dependency"
wait_job "$after" "$JOB_ENDED" 30 || sweep_fail "the afterok job did not end"
[ "$(job_field "$after" JobState)" = COMPLETED ] || { cat "$work/after.out"; sweep_fail "the afterok job did not complete"; }
"$python" - "$work/out/${jid}_0/run.h5" 1e-3 "$work/out/${jid}_1/run.h5" 2e-3 << 'PY' || sweep_fail "learning rates"
import sys, h5py
for path, lr in zip(sys.argv[1::2], sys.argv[2::2]):
    with h5py.File(path, "r") as f:
        peak = float(f["metrics/lr"][:].max())
    if peak != float(lr):
        sys.exit(f"{path}: peak learning rate {peak}, not {lr}")
PY
echo "ok [sweep]: array tasks ${jid}_0 (lr 1e-3) and ${jid}_1 (lr 2e-3), then job $after (afterok)"
exit $fail
