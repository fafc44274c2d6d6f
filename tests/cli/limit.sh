#!/usr/bin/env bash
# limit.sh SECONDS COMMAND [ARGS...]
#
# Runs COMMAND as `timeout SECONDS` would, exit status 124 when time runs
# out; but first it prints, to standard error, what every process of the
# command's tree was doing: each thread's state and kernel wait channel,
# and its backtrace where gdb is installed. A test that hangs
# once in a thousand runs then leaves where it hung in its log.
set -u
limit=$1
shift
"$@" &
pid=$!
tree() {  # tree PID: PID and its descendants, parents first
  local p
  echo "$1"
  for p in $(pgrep -P "$1"); do tree "$p"; done
}
deadline=$((SECONDS + limit))
while kill -0 "$pid" 2>/dev/null; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    procs=$(tree "$pid")
    {
      echo "==== limit.sh: still running after $limit s: $*"
      # One line per thread: its state and kernel wait channel.
      # shellcheck disable=SC2086
      ps -L -o pid,ppid,lwp,stat,etime,time,wchan:32,comm,args -p "$(echo $procs | tr ' ' ,)"
      if command -v gdb >/dev/null; then
        for p in $procs; do
          timeout 30 gdb -p "$p" -batch -nx -ex "thread apply all bt" 2>&1 | grep -E "^(Thread|#)" | head -150
        done
      fi
      echo "==== limit.sh: end of the state of the hung processes"
    } >&2
    for p in $procs; do kill -TERM "$p" 2>/dev/null; done
    sleep 2
    for p in $procs; do kill -KILL "$p" 2>/dev/null; done
    wait "$pid" 2>/dev/null
    exit 124
  fi
  sleep 0.2
done
wait "$pid"
