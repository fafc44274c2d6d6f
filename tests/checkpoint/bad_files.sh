#!/usr/bin/env bash
# bad_files.sh "MPIEXEC -n 2 ..." MESHLM TINY_CFG PYTHON
#
# A damaged or foreign checkpoint given to checkpoint.resume is refused on
# every rank with one clear error naming the dataset or key, without a hang,
# and nothing in the output or checkpoint directory changes.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")/../cli" && pwd)/limit.sh
mpiexec=$1; meshlm=$2; cfg=$3; python=$4
dir=$(mktemp -d /tmp/meshlm_badckpt_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
base=(--data.path="$dir/tokens.h5" --train.steps=4 --checkpoint.final=true)
bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${base[@]}" --output.dir="$dir/good" > "$dir/good.log" 2>&1 \
  || { cat "$dir/good.log"; echo "FAIL: the first run failed"; exit 1; }
good="$dir/good/checkpoints/step_00000004.h5"

"$python" - "$good" "$dir" <<'PY'
import sys, shutil, h5py, numpy as np
good, d = sys.argv[1:3]
# A flipped bit inside one dataset's bytes.
shutil.copy(good, f"{d}/flipped.h5")
with h5py.File(f"{d}/flipped.h5", "r") as f:
    off = f["params/h.1.mlp.c_fc.weight"].id.get_offset()
with open(f"{d}/flipped.h5", "r+b") as f:
    f.seek(off + 100); b = f.read(1); f.seek(off + 100); f.write(bytes([b[0] ^ 0x10]))
# Cut in half.
data = open(good, "rb").read()
open(f"{d}/truncated.h5", "wb").write(data[: len(data) // 2])
# A format version from the future.
shutil.copy(good, f"{d}/future.h5")
with h5py.File(f"{d}/future.h5", "r+") as f:
    f["meta"].attrs["format_version"] = np.int64(2)
# A dataset without its checksum.
shutil.copy(good, f"{d}/nosum.h5")
with h5py.File(f"{d}/nosum.h5", "r+") as f:
    del f["optimizer/wpe.weight/v"].attrs["xxh3"]
# Tensors without a training state, as `meshlm ckpt import` writes them.
shutil.copy(good, f"{d}/norun.h5")
with h5py.File(f"{d}/norun.h5", "r+") as f:
    for k in ("loss_scale", "loss_scale_good_steps", "data_epoch", "data_position"):
        del f["meta"].attrs[k]
# A training state with one attribute gone.
shutil.copy(good, f"{d}/nocursor.h5")
with h5py.File(f"{d}/nocursor.h5", "r+") as f:
    del f["meta"].attrs["data_position"]
# An HDF5 file that is no checkpoint.
with h5py.File(f"{d}/foreign.h5", "w") as f:
    f["x"] = np.zeros(3)
PY

fail=0
# case NAME REGEX FILE [overrides...]
case_() {
  local name=$1 regex=$2 file=$3; shift 3
  local out="$dir/out_$name"
  mkdir -p "$out"
  local before; before=$(cd "$dir" && ls -l --time-style=full-iso good/checkpoints "$file" 2>/dev/null | md5sum)
  bash "$limit" 60 $mpiexec "$meshlm" train "$cfg" "${base[@]}" --output.dir="$out" \
    --checkpoint.resume="$file" "$@" > "$out.log" 2>&1
  local rc=$?
  local after; after=$(cd "$dir" && ls -l --time-style=full-iso good/checkpoints "$file" 2>/dev/null | md5sum)
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    echo "FAIL [$name]: exit status $rc (0: accepted; 124: hung)"; fail=1; return
  fi
  grep -qE -- "$regex" "$out.log" || { tail -5 "$out.log"; echo "FAIL [$name]: no error matching '$regex'"; fail=1; return; }
  [ "$(grep -c '^ERROR' "$out.log")" = 1 ] || { echo "FAIL [$name]: not exactly one ERROR line (rank 0's)"; fail=1; return; }
  # An error of some ranks only is printed "ERROR on rank N:" and aborts the job.
  grep -qE '^ERROR on rank [0-9]+:' "$out.log" && { echo "FAIL [$name]: the job was aborted; every rank should reach this error"; fail=1; return; }
  [ -z "$(ls -A "$out")" ] || { ls -la "$out"; echo "FAIL [$name]: the output directory was written"; fail=1; return; }
  [ "$before" = "$after" ] || { echo "FAIL [$name]: a checkpoint changed"; fail=1; return; }
  echo "ok [$name]: $(grep '^ERROR' "$out.log" | cut -c1-160)"
}
case_ flipped_bit "dataset /params/h.1.mlp.c_fc.weight: checksum mismatch" "$dir/flipped.h5"
case_ truncated "truncated.h5" "$dir/truncated.h5"
case_ future_version "format_version = 2; this meshlm reads version 1" "$dir/future.h5"
case_ no_checksum "optimizer/wpe.weight/v has no checksum" "$dir/nosum.h5"
case_ foreign "foreign.h5: no /meta group: not a meshlm checkpoint" "$dir/foreign.h5"
case_ missing "no checkpoint '$dir/absent.h5'" "$dir/absent.h5"
case_ no_run "norun.h5' holds tensors but no training state" "$dir/norun.h5"
case_ no_cursor "nocursor.h5: /meta has no attribute 'data_position'" "$dir/nocursor.h5"
case_ other_width "is of another model: model.n_embd = 32 there, 64 in this run" "$good" --model.n_embd=64
case_ other_depth "is of another model: model.n_layer = 2 there, 3 in this run" "$good" --model.n_layer=3
case_ lora_vs_full "was written by finetune.mode = full; this run has finetune.mode = lora" "$good" --finetune.mode=lora
case_ other_seq_len "counts windows of model.seq_len = 32; this run has 16" "$good" --model.seq_len=16
exit $fail
