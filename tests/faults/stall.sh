#!/usr/bin/env bash
# stall.sh "MPIEXEC -n 4 ..." MESHLM TINY_CFG ["EXTRA FLAGS"]
#
# runtime.stall_timeout_s: one rank stopped with SIGSTOP (a silent stall:
# it holds its messages, its process is alive) ends the job within the bound
# with exit status 3, the other ranks naming the stopped rank and what they
# waited in; no rank is left behind. A whole job stopped for longer than the
# bound and continued (a batch system's suspend and resume) trains on to its
# end. Under Open MPI the rank of a process is its OMPI_COMM_WORLD_RANK.
# EXTRA FLAGS go to every run: "--runtime.backend=cuda" stops a rank of four
# sharing one GPU (host staging), "--runtime.backend=cuda --comm.device=nccl"
# one waited for in NCCL (four GPUs). Exit 77 (skipped) where meshlm says the
# machine has no GPU it can use, or too few for NCCL.
set -u
mpiexec=$1; meshlm=$2; cfg=$3
read -r -a extra <<< "${4:-}"
dir=$(mktemp -d /tmp/meshlm_stall_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
"$meshlm" tokenize /usr/share/common-licenses/GPL-3 "$dir/tokens.h5" > /dev/null || exit 1
if [ ${#extra[@]} -gt 0 ]; then
  $mpiexec "$meshlm" train "$cfg" --data.path="$dir/tokens.h5" --output.dir="$dir/probe" --train.steps=1 \
    --checkpoint.final=false --parallel.dp=4 "${extra[@]}" > "$dir/probe.log" 2>&1
  if grep -qE "can use no GPU|built without the CUDA backend|NCCL refuses two ranks on one GPU" "$dir/probe.log"; then
    grep -m1 -E "can use no GPU|built without|NCCL refuses" "$dir/probe.log"; echo "SKIP"; exit 77
  fi
fi
bound=5
fail=0

# The processes of a run (its output dir is on their command line).
ranks_of() { pgrep -f -- "--output.dir=$1( |$)" | while read -r p; do
  tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -q '^OMPI_COMM_WORLD_RANK=' && echo $p; done; }
rank_of() { tr '\0' '\n' < /proc/$1/environ 2> /dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
wait_step() {  # log step: until the log shows the step (30 s at most)
  for _ in $(seq 300); do grep -qE "^ +$2 " "$1" 2> /dev/null && return 0; sleep 0.1; done; return 1; }

for spec in "dp4:3" "dp2pp2:2" "dp2pp2:0"; do
  layout=${spec%:*}; victim=${spec#*:}
  case $layout in
    dp4) par=(--parallel.dp=4) ;;
    dp2pp2) par=(--parallel.dp=2 --parallel.pp=2) ;;
  esac
  out="$dir/$layout-$victim"
  $mpiexec "$meshlm" train "$cfg" --data.path="$dir/tokens.h5" --output.dir="$out" --train.steps=100000 \
    --train.log_every=1 --checkpoint.final=false --runtime.stall_timeout_s=$bound "${par[@]}" "${extra[@]}" > "$out.log" 2>&1 &
  launcher=$!
  wait_step "$out.log" 3 || { tail -5 "$out.log"; echo "FAIL [$spec]: no step 3"; fail=1; kill $launcher; continue; }
  pid=
  for p in $(ranks_of "$out"); do [ "$(rank_of $p)" = "$victim" ] && pid=$p; done
  [ -n "$pid" ] || { echo "FAIL [$spec]: no process of rank $victim"; fail=1; kill $launcher; continue; }
  start=$SECONDS
  kill -STOP "$pid"
  ( sleep 60; kill -9 $launcher ) > /dev/null 2>&1 & guard=$!  # no hang
  wait $launcher; rc=$?
  took=$((SECONDS - start))
  pkill -P $guard 2> /dev/null; kill $guard 2> /dev/null
  left=$(ranks_of "$out")
  [ -z "$left" ] || { kill -9 $left 2> /dev/null; echo "FAIL [$spec]: ranks left behind: $left"; fail=1; }
  if [ $rc -ne 3 ]; then
    tail -8 "$out.log"; echo "FAIL [$spec]: exit status $rc, not 3 (137: hung until killed)"; fail=1; continue
  fi
  [ $took -le $((bound + 20)) ] || { echo "FAIL [$spec]: ended after $took s (bound $bound s)"; fail=1; }
  grep -qE "^ERROR on rank [0-9]+: stalled: no progress for [0-9.]+ s \(runtime.stall_timeout_s = $bound\), waiting in [a-z_]+ (for rank|over ranks) .*rank $victim \(this node\) has not run for [0-9.]+ s: stopped or frozen" "$out.log" \
    || { grep ERROR "$out.log"; echo "FAIL [$spec]: no line naming rank $victim as stopped"; fail=1; continue; }
  echo "ok [$spec]: rank $victim stopped, the job ended in $took s with exit status 3: $(grep -m1 '^ERROR on rank' "$out.log" | cut -c1-160)"
done

# Every rank stopped for twice the bound, then continued: the run goes on.
out="$dir/suspended"
$mpiexec "$meshlm" train "$cfg" --data.path="$dir/tokens.h5" --output.dir="$out" --train.steps=40 \
  --train.log_every=1 --checkpoint.final=false --runtime.stall_timeout_s=$bound --parallel.dp=2 --parallel.pp=2 \
  "${extra[@]}" > "$out.log" 2>&1 &
launcher=$!
if wait_step "$out.log" 3; then
  all=$(ranks_of "$out")
  kill -STOP $all; sleep $((2 * bound)); kill -CONT $all
  ( sleep 90; kill -9 $launcher ) > /dev/null 2>&1 & guard=$!
  wait $launcher; rc=$?
  pkill -P $guard 2> /dev/null; kill $guard 2> /dev/null
  if [ $rc -ne 0 ] || ! grep -qE "^ +40 " "$out.log"; then
    tail -5 "$out.log"; echo "FAIL [suspended]: a job stopped and continued as a whole exited $rc"; fail=1
  else
    echo "ok [suspended]: every rank stopped $((2 * bound)) s and continued; the run reached step 40"
  fi
else
  echo "FAIL [suspended]: no step 3"; fail=1; kill $launcher
fi
exit $fail
