#!/usr/bin/env bash
# cluster.sh: a one-node SLURM cluster for the tests, from Debian's packages
# (munge, slurmctld, slurmd, slurm-client; jobscripts/install-deps.sh --tests).
#
#   source tests/slurm/cluster.sh; cluster_up    # in a test script
#   bash tests/slurm/cluster.sh                  # alone: up, a smoke check, down
#
# cluster_up writes everything under one temporary directory, $CLUSTER_DIR:
# a munge key, a slurm.conf describing this host (its short hostname, nproc
# CPUs, 90% of its memory, one partition `test`), and the state, spool, log
# and pid directories. It starts munged, slurmctld and slurmd (as root, in
# the foreground of background jobs, -f the generated file, on two free TCP
# ports), waits (bounded) until sinfo shows the node idle, and exports
# SLURM_CONF, which every client command (sbatch, squeue, scontrol, srun)
# and every job (sbatch exports the submitter's environment) then uses.
# It installs an EXIT trap: cluster_down cancels the jobs, stops every
# daemon it started and every process left by a job step, and removes
# $CLUSTER_DIR (KEEP=1 keeps it), also when the test fails or is
# interrupted. A test that needs a trap of its own calls cluster_down from it.
#
# Without cgroups (containers): ProctrackType=proctrack/linuxproc (a job's
# processes are found through their parents) and TaskPlugin=task/none (no
# CPU binding; meshlm sizes its threads from runtime.threads). Short
# timeouts for fast tests: MessageTimeout, KillWait, and AuthInfo's
# cred_expire, which is also how long a requeued job waits before it may
# start again (SLURM's default: 120 s; here CLUSTER_CRED_EXPIRE, 5 s, the
# least SLURM accepts).
#
# CLUSTER_EXTRA_CONF: lines added to the end of slurm.conf (e.g.
# SlurmctldDebug=debug2 while looking into a failure).
#
# If a daemon cannot start (packages missing, a daemon exits or never
# answers), cluster_up prints which one and the end of its log, and exits 77
# (ctest: skipped).
set -u

CLUSTER_DIR=""
CLUSTER_CRED_EXPIRE=${CLUSTER_CRED_EXPIRE:-5}
_cluster_pids=()   # munged slurmctld slurmd, as started here

_cluster_skip() {  # _cluster_skip REASON [LOG]
  echo "SKIP: SLURM test cluster: $1"
  if [ -n "${2:-}" ] && [ -s "$2" ]; then
    echo "---- last lines of $2:"; tail -n 15 "$2"; echo "----"
  fi
  exit 77
}

# _cluster_procs DIR: the processes of the cluster in DIR: the daemons
# (MESHLM_SLURM_CLUSTER=DIR in their environment), slurmstepd (its process
# title overwrites its environment; it holds DIR/log/slurmd.log open) and
# what the jobs started (SLURM_JOB_ID and SLURM_CONF=DIR/slurm.conf in
# theirs). Never this shell.
_cluster_procs() {
  { grep -lzxF "MESHLM_SLURM_CLUSTER=$1" /proc/[0-9]*/environ
    grep -lzxF "SLURM_CONF=$1/slurm.conf" /proc/[0-9]*/environ | xargs -r grep -lz "^SLURM_JOB_ID="
    find /proc/[0-9]*/fd -maxdepth 1 -lname "$1/log/*"
  } 2> /dev/null | sed -n 's#^/proc/\([0-9]*\)/.*#\1#p' | grep -vx "$$" | sort -un
}

# Clusters of earlier tests killed without their teardown (ctest's timeout
# sends SIGKILL): older than 10 minutes, no slurmctld. Their processes are
# killed and their directories removed (not those kept with KEEP).
_cluster_reap_stale() {
  local d pid
  for d in /tmp/meshlm_slurm_*; do
    [ -d "$d" ] && [ ! -e "$d/kept" ] && [ -n "$(find "$d" -maxdepth 0 -mmin +10)" ] || continue
    pid=$(cat "$d/run/slurmctld.pid" 2> /dev/null)
    [ -n "$pid" ] && grep -qzxF "MESHLM_SLURM_CLUSTER=$d" /proc/"$pid"/environ 2> /dev/null && continue
    kill -KILL $(_cluster_procs "$d") 2> /dev/null
    rm -rf "$d"
    echo "# removed the stale test cluster $d"
  done
}

cluster_down() {
  [ -n "$CLUSTER_DIR" ] || return 0
  local i p left alive
  if [ ${#_cluster_pids[@]} -ge 3 ] && kill -0 "${_cluster_pids[1]}" 2> /dev/null; then
    # Jobs first, while slurmd is there to end their steps (KillWait 2 s).
    timeout 10 scancel --full --quiet --user=root 2> /dev/null
    for _ in $(seq 50); do
      [ -z "$(timeout 5 squeue -h -o %i 2> /dev/null)" ] && break
      sleep 0.2
    done
  fi
  # The daemons, then anything of the cluster still there (SIGTERM, then
  # SIGKILL after 5 s).
  for ((i = ${#_cluster_pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${_cluster_pids[i]}" 2> /dev/null
  done
  for _ in $(seq 50); do
    alive=0
    for p in "${_cluster_pids[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  left="${_cluster_pids[*]} $(_cluster_procs "$CLUSTER_DIR")"
  for p in $left; do kill -KILL "$p" 2> /dev/null; done
  for p in "${_cluster_pids[@]}"; do wait "$p" 2> /dev/null; done
  # Until they are gone from the process table (init reaps slurmstepd).
  for _ in $(seq 50); do
    alive=0
    for p in $left; do [ -e /proc/$p ] && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  left=$(_cluster_procs "$CLUSTER_DIR")
  [ -z "$left" ] || { echo "WARNING: SLURM test cluster: processes left:"; ps -o pid,args -p $left; }
  if [ -n "${KEEP:-}" ]; then
    touch "$CLUSTER_DIR/kept"
    echo "# SLURM test cluster kept in $CLUSTER_DIR (KEEP set)"
  else
    rm -rf "$CLUSTER_DIR"
  fi
  CLUSTER_DIR=""
  _cluster_pids=()
}

# Two free TCP ports (bound and released; SLURM binds them a moment later).
_cluster_ports() {
  python3 - << 'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
}

# _cluster_wait_daemon NAME PID LOG CHECK...: until CHECK succeeds (bounded:
# 30 s); a daemon that exits or never answers skips the test.
_cluster_wait_daemon() {
  local name=$1 pid=$2 log=$3; shift 3
  for _ in $(seq 150); do
    kill -0 "$pid" 2> /dev/null || { wait "$pid"; _cluster_skip "$name exited (status $?) while starting" "$log"; }
    "$@" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  _cluster_skip "$name did not answer within 30 s" "$log"
}

cluster_up() {
  local d host cpus mem ports
  for d in munged munge slurmctld slurmd sbatch squeue scontrol sinfo srun python3; do
    command -v $d > /dev/null || PATH=$PATH:/usr/sbin:/sbin command -v $d > /dev/null \
      || _cluster_skip "$d not found (jobscripts/install-deps.sh --tests installs munge, slurmctld, slurmd, slurm-client)"
  done
  export PATH=$PATH:/usr/sbin:/sbin
  [ "$(id -u)" -eq 0 ] || _cluster_skip "needs root (SlurmUser=root, slurmd runs jobs as their user)"
  # Nothing of an outer SLURM job (a test run inside an allocation).
  unset $(compgen -e | grep '^SLURM_')
  _cluster_reap_stale

  CLUSTER_DIR=$(mktemp -d /tmp/meshlm_slurm_XXXXXX)
  chmod 755 "$CLUSTER_DIR"
  trap 'cluster_down' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "$CLUSTER_DIR"/{munge,state,spool,log,run,tmp}
  chmod 700 "$CLUSTER_DIR/munge"

  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  ports=$(_cluster_ports) || _cluster_skip "no free TCP ports found"

  # munge: its own key, socket, pid, seed and log files.
  mungekey --create --keyfile="$CLUSTER_DIR/munge/munge.key" > /dev/null 2>&1 \
    || { dd if=/dev/urandom of="$CLUSTER_DIR/munge/munge.key" bs=1024 count=1 status=none \
         && chmod 400 "$CLUSTER_DIR/munge/munge.key"; } \
    || _cluster_skip "cannot create a munge key"
  MESHLM_SLURM_CLUSTER=$CLUSTER_DIR munged --foreground --force \
    --socket="$CLUSTER_DIR/munge/munge.socket" --key-file="$CLUSTER_DIR/munge/munge.key" \
    --pid-file="$CLUSTER_DIR/munge/munged.pid" --seed-file="$CLUSTER_DIR/munge/munged.seed" \
    --log-file="$CLUSTER_DIR/log/munged.log" > "$CLUSTER_DIR/log/munged.out" 2>&1 &
  _cluster_pids+=($!)
  _cluster_wait_daemon munged $! "$CLUSTER_DIR/log/munged.log" \
    bash -c "munge -n -S '$CLUSTER_DIR/munge/munge.socket' | unmunge -S '$CLUSTER_DIR/munge/munge.socket'"

  cat > "$CLUSTER_DIR/slurm.conf" << EOF
# One-node SLURM cluster for meshlm's tests (tests/slurm/cluster.sh).
ClusterName=meshlmtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${ports% *}
SlurmdPort=${ports#* }
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$CLUSTER_DIR/munge/munge.socket,cred_expire=$CLUSTER_CRED_EXPIRE
StateSaveLocation=$CLUSTER_DIR/state
SlurmdSpoolDir=$CLUSTER_DIR/spool
TmpFS=$CLUSTER_DIR/tmp
SlurmctldPidFile=$CLUSTER_DIR/run/slurmctld.pid
SlurmdPidFile=$CLUSTER_DIR/run/slurmd.pid
SlurmctldLogFile=$CLUSTER_DIR/log/slurmctld.log
SlurmdLogFile=$CLUSTER_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes tracked through their parents, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd: no sacct; finished jobs stay in scontrol show job for
# MinJobAge seconds, and each end is a line of the job completion log.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$CLUSTER_DIR/log/jobcomp.txt
MinJobAge=600
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# Batch jobs start at once (default: up to 3 s later), and the main loop
# looks at pending jobs every second (default: 60 s), so a requeued job
# starts as soon as its begin time (cred_expire + 1 s) has passed.
SchedulerParameters=batch_sched_delay=0,sched_interval=1
MpiDefault=none
ReturnToService=2
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
Waittime=0
SlurmdParameters=config_overrides
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
${CLUSTER_EXTRA_CONF:-}
EOF
  export SLURM_CONF=$CLUSTER_DIR/slurm.conf

  MESHLM_SLURM_CLUSTER=$CLUSTER_DIR slurmctld -D -i -f "$SLURM_CONF" \
    > "$CLUSTER_DIR/log/slurmctld.out" 2>&1 &
  _cluster_pids+=($!)
  _cluster_wait_daemon slurmctld $! "$CLUSTER_DIR/log/slurmctld.log" timeout 5 scontrol ping
  MESHLM_SLURM_CLUSTER=$CLUSTER_DIR slurmd -D -f "$SLURM_CONF" -N "$host" \
    > "$CLUSTER_DIR/log/slurmd.out" 2>&1 &
  _cluster_pids+=($!)
  _cluster_wait_daemon slurmd $! "$CLUSTER_DIR/log/slurmd.log" \
    bash -c "timeout 5 sinfo -h -n '$host' -o %T | grep -qx idle"
  echo "# SLURM test cluster up in $CLUSTER_DIR: node $host, $cpus CPUs, partition test, $(sinfo -V)"
}

# job_field JOBID NAME: one field of `scontrol show job` (JobState, ExitCode,
# Restarts, BeginTime, ...). No slurmdbd here, so no sacct: a finished job
# stays visible to scontrol for MinJobAge (600 s).
job_field() {
  timeout 10 scontrol -o show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# wait_job JOBID STATES SECONDS: waits until the job's state matches STATES
# (an extended regex, e.g. 'COMPLETED|FAILED'), at most SECONDS; returns 1
# (printing the job) when it does not.
wait_job() {
  local id=$1 want=$2 end=$((SECONDS + $3)) state
  while :; do
    state=$(job_field "$id" JobState)
    [[ $state =~ ^($want)$ ]] && return 0
    if (( SECONDS >= end )); then
      echo "# job $id still $state after $3 s (waited for $want):"
      timeout 10 scontrol show job "$id"
      return 1
    fi
    sleep 0.2
  done
}

# Every state a job ends in (for wait_job).
JOB_ENDED='COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY'

# cluster_work MESHLM: makes the jobs' directory, $CLUSTER_DIR/work, with
# tokens.h5 (the GPL-3 text, tokenized byte-level), and prints its path;
# exits 1 when tokenize fails (call it as work=$(cluster_work ...) || exit 1).
cluster_work() {
  local work=$CLUSTER_DIR/work
  mkdir -p "$work"
  "$1" tokenize /usr/share/common-licenses/GPL-3 "$work/tokens.h5" > /dev/null \
    || { echo "FAIL: meshlm tokenize" >&2; exit 1; }
  echo "$work"
}

# cluster_test MESHLM SOURCE_DIR PYTHON: the start of a job test. Sets
# meshlm and src (absolute) and python, brings the cluster up, makes $work
# (cluster_work) and exports MESHLM for jobscripts/slurm.sbatch.
cluster_test() {
  meshlm=$(realpath "$1"); src=$(realpath "$2"); python=$3
  cluster_up
  work=$(cluster_work "$meshlm") || exit 1
  export MESHLM=$meshlm
}

# Alone: up, one two-task step, down.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  cluster_up
  out=$(timeout 60 srun -N1 -n2 -c1 bash -c 'echo "task $SLURM_PROCID of $SLURM_NTASKS"' 2>&1)
  if [ "$(sort <<< "$out")" != "$(printf 'task 0 of 2\ntask 1 of 2')" ]; then
    echo "$out"; echo "FAIL: srun -n2 in the test cluster"; exit 1
  fi
  echo "ok: srun -n2 ran both tasks; srun's MPI plugins:$(srun --mpi=list 2>&1 | sed 1d | tr -s '\t\n' '  ')"
fi
