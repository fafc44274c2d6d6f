#!/usr/bin/env bash
# local.sh [-n RANKS] FILE.cfg [--section.key=value ...]
#
# Runs `meshlm train` on this machine under mpiexec: RANKS processes
# (default 1), each with (cores / RANKS) OpenMP threads. For clusters use
# slurm.sbatch or pbs.pbs beside this script.
#
# Open MPI binds each rank to one core by default when there are few ranks,
# which would leave the rank's OpenMP threads on that one core: --bind-to
# none lets meshlm's own thread count (runtime.threads) decide. As root, Open
# MPI also needs --allow-run-as-root; more ranks than cores need
# --oversubscribe.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
meshlm=${MESHLM:-$here/../build/meshlm}
ranks=1
if [[ "${1:-}" == "-n" ]]; then
  ranks=$2
  shift 2
fi
if [[ $# -lt 1 ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
[[ -x "$meshlm" ]] || { echo "local.sh: $meshlm not found; build first (see README)" >&2; exit 1; }

flags=(-n "$ranks" --bind-to none)
if mpiexec --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then
  [[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
  flags+=(--oversubscribe)
fi
# With more ranks than cores, idle OpenMP threads sleep instead of
# spinning: spinning threads would steal the cores the working ones need
# (meshlm's own waits sleep there too: comm.wait = auto). With a core or
# more per rank, libgomp's default (spin a while, then sleep) is faster:
# one rank of 2 threads, 7% a step on the tiny models of plan_accuracy.py.
if (( ranks > $(nproc) )); then
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
fi
set -x
exec mpiexec "${flags[@]}" "$meshlm" train "$@"
