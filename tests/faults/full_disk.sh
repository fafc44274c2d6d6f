#!/usr/bin/env bash
# full_disk.sh "MPIEXEC -n 2 ..." MESHLM TINY_CFG PYTHON
#
# checkpoint.dir on a file system that fills up (a tmpfs of 2 MiB; the tiny
# model's checkpoint is 460 KiB, and a save asks for its size and 1 MiB to
# spare): the checkpoint of step 2 fits, step 4's does not. The run ends
# with one clear error naming the directory, its free space and what the
# checkpoint needs, within seconds (no hang); nothing of step 4 is on disk,
# `latest` still names step 2 and it verifies. With space again,
# checkpoint.resume = auto resumes from step 2 and gives the losses of an
# uninterrupted run bit for bit.
# A directory too small for even the first checkpoint leaves it empty.
# Needs mount(8) of a tmpfs (root with CAP_SYS_ADMIN): exit 77 (skipped),
# saying why, where that is refused.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")/../cli" && pwd)/limit.sh
mpiexec=$1; meshlm=$2; cfg=$3; python=$4
here=$(cd "$(dirname "$0")/../checkpoint" && pwd)
dir=$(mktemp -d /tmp/meshlm_full_XXXXXX)
disk="$dir/disk"
mkdir -p "$disk"
cleanup() { umount "$disk" 2> /dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"; }
trap cleanup EXIT
if ! err=$(mount -t tmpfs -o size=2048k tmpfs "$disk" 2>&1); then
  echo "SKIP: cannot mount a small tmpfs to fill: $err"; exit 77
fi
"$meshlm" tokenize /usr/share/common-licenses/GPL-3 "$dir/tokens.h5" > /dev/null || exit 1
common=(--data.path="$dir/tokens.h5" --train.steps=8 --train.log_every=1 --checkpoint.every=2
        --checkpoint.keep_last=0 --checkpoint.final=false)
fail=0

bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$dir/whole" > "$dir/whole.log" 2>&1 \
  || { cat "$dir/whole.log"; echo "FAIL: the uninterrupted run failed"; exit 1; }

out="$dir/full"
start=$SECONDS
bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$out" --checkpoint.dir="$disk/ck" \
  > "$out.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
  tail -5 "$out.log"; echo "FAIL: the run on a full disk exited $rc (0: no error; 124: hung)"; exit 1
fi
echo "the run on a full disk exited $rc after $((SECONDS - start)) s"
grep -qE "^ERROR: checkpoint.dir: '$disk/ck' has [0-9.]+ [KM]iB free on its file system; the checkpoint of step 4 needs about [0-9.]+ [KM]iB .*nothing written" "$out.log" \
  || { grep -i error "$out.log"; echo "FAIL: no clear error naming the directory and the space"; fail=1; }
[ "$(grep -c '^ERROR' "$out.log")" = 1 ] || { grep '^ERROR' "$out.log"; echo "FAIL: not one error line"; fail=1; }
ls -A "$disk/ck" | grep -qv -e '^latest$' -e '^step_00000002\.h5$' \
  && { ls -la "$disk/ck"; echo "FAIL: something else is left in the directory"; fail=1; }
"$python" "$here/verify_dir.py" "$disk/ck" --latest 2 --steps 2 || fail=1

# Space again: resume from step 2 and finish with the uninterrupted losses.
mount -o remount,size=16m "$disk" || { echo "FAIL: cannot grow the tmpfs"; exit 1; }
bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$out" --checkpoint.dir="$disk/ck" \
  --checkpoint.resume=auto > "$out.resume.log" 2>&1 \
  || { tail -5 "$out.resume.log"; echo "FAIL: the resumed run failed"; exit 1; }
grep -q "resuming from .*step_00000002.h5" "$out.resume.log" || { echo "FAIL: did not resume from step 2"; fail=1; }
"$python" "$here/verify_dir.py" "$disk/ck" --latest 8 --steps 2,4,6,8 || fail=1
"$python" - "$dir/whole/run.h5" "$out/run.h5" <<'PY' || fail=1
import sys, h5py, numpy as np
a, b = (h5py.File(p) for p in sys.argv[1:3])
assert list(b["metrics/step"][:]) == list(range(1, 9)), list(b["metrics/step"][:])
for c in ["loss", "lr", "grad_norm"]:
    assert np.array_equal(b["metrics/" + c][:], a["metrics/" + c][:]), c
print("resumed after the full disk: steps 1-8 equal the uninterrupted run's bit for bit")
PY

# Too small for the first checkpoint: an error at step 2, the directory empty.
umount "$disk" && mount -t tmpfs -o size=1m tmpfs "$disk" || { echo "FAIL: cannot remount"; exit 1; }
bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$dir/small" --checkpoint.dir="$disk/ck" \
  > "$dir/small.log" 2>&1
rc=$?
grep -qE "^ERROR: checkpoint.dir: .*the checkpoint of step 2 needs about" "$dir/small.log" && [ $rc -ne 0 ] && [ $rc -ne 124 ] \
  || { tail -5 "$dir/small.log"; echo "FAIL: a disk too small for the first checkpoint: exit $rc"; fail=1; }
[ -z "$(ls -A "$disk/ck" 2> /dev/null)" ] || { ls -la "$disk/ck"; echo "FAIL: files left on the small disk"; fail=1; }
[ $fail -eq 0 ] && echo "ok: full disk: a clear error, the checkpoints before intact, resumed exactly"
exit $fail
