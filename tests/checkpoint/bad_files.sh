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

# Copies whose checksums still hold but whose content no run can have
# written: /meta attributes out of range or at odds with each other, a
# negative second moment, a tensor the model does not have.
import xxhash
def edited(name, **attrs):
    shutil.copy(good, f"{d}/{name}.h5")
    f = h5py.File(f"{d}/{name}.h5", "r+")
    for k, v in attrs.items():
        if v is None: del f["meta"].attrs[k]
        else: f["meta"].attrs[k] = v
    return f
def rehash(f, path):
    h = np.uint64(xxhash.xxh3_64_intdigest(f[path][()].astype("<f4").tobytes()))
    f[path].attrs["xxh3"] = h; f["meta/checksums"].attrs[path] = h
edited("scale_tiny", loss_scale=np.float64(1e-30)).close()
edited("scale_huge", loss_scale=np.float64(1e300)).close()
edited("good_huge", loss_scale_good_steps=np.int64(99999999999)).close()
edited("good_neg", loss_scale_good_steps=np.int64(-5)).close()
edited("adamw0", adamw_step=np.int64(0)).close()
edited("epoch_huge", data_epoch=np.uint64(2**63)).close()
edited("noseed", seed=None).close()
edited("tokens_neg", tokens_seen=np.int64(-1)).close()
edited("skipped_neg", skipped_steps=np.int64(-1)).close()
with edited("root_layers") as f:
    f.attrs["n_layer"] = np.int64(5)
with edited("negative_v") as f:
    p = "optimizer/h.0.ln_1.weight/v"
    a = f[p][()]; a[3] = -1.0; f[p][...] = a; rehash(f, p)
with edited("extra") as f:
    p = "params/h.2.ln_1.weight"
    f[p] = np.ones(f["params/h.0.ln_1.weight"].shape, np.float32); rehash(f, p)
# `latest` with a CRLF line end (resumes), and with a NUL byte.
import os
for name, text in (("crlf", b"step_00000004.h5\r\n"), ("nul", b"step_\x0000000004.h5\n")):
    os.makedirs(f"{d}/{name}")
    shutil.copy(good, f"{d}/{name}/step_00000004.h5")
    open(f"{d}/{name}/latest", "wb").write(text)
PY
mkfifo "$dir/fifo.h5"

fail=0
# case NAME REGEX FILE [overrides...]: FILE given to checkpoint.resume
case_() {
  local name=$1 regex=$2 file=$3; shift 3
  run_ "$name" "$regex" "$file" train "$cfg" "${base[@]}" --checkpoint.resume="$file" "$@"
}
# run_ NAME REGEX FILE MESHLM_ARGS...: a command that must refuse FILE
run_() {
  local name=$1 regex=$2 file=$3; shift 3
  local out="$dir/out_$name"
  mkdir -p "$out"
  local before; before=$(cd "$dir" && ls -l --time-style=full-iso good/checkpoints "$file" 2>/dev/null | md5sum)
  bash "$limit" 60 $mpiexec "$meshlm" "$@" --output.dir="$out" > "$out.log" 2>&1
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
# A FIFO is refused by name, never opened (an open would wait for a writer).
case_ fifo "fifo.h5' is a FIFO, not a checkpoint file" "$dir/fifo.h5"
# Values no run writes: refused by name, as a damaged file is.
case_ loss_scale_tiny "scale_tiny.h5': /meta loss_scale = 1e-30 lies outside" "$dir/scale_tiny.h5"
case_ loss_scale_huge "scale_huge.h5': /meta loss_scale = 1e\+300 lies outside" "$dir/scale_huge.h5"
case_ good_steps_huge "good_huge.h5: /meta loss_scale_good_steps = 99999999999 does not lie in" "$dir/good_huge.h5"
case_ good_steps_negative "good_neg.h5: /meta loss_scale_good_steps = -5 does not lie in" "$dir/good_neg.h5"
case_ adamw_step "adamw0.h5: /meta adamw_step = 0, but step 4 less skipped_steps 0" "$dir/adamw0.h5"
case_ data_epoch "epoch_huge.h5: /meta data_epoch = 9223372036854775808" "$dir/epoch_huge.h5"
case_ no_seed "noseed.h5: /meta has no attribute 'seed'" "$dir/noseed.h5"
case_ tokens_negative "tokens_neg.h5: /meta tokens_seen = -1 is negative" "$dir/tokens_neg.h5"
case_ skipped_negative "skipped_neg.h5: /meta skipped_steps = -1 does not lie in" "$dir/skipped_neg.h5"
case_ root_n_layer "root_layers.h5: the root attribute n_layer = 5 differs from /meta n_layer = 2" "$dir/root_layers.h5"
case_ negative_v "negative_v.h5': dataset /optimizer/h.0.ln_1.weight/v holds -1 at element 3" "$dir/negative_v.h5"
case_ extra_dataset "extra.h5': dataset /params/h.2.ln_1.weight is not one of this model's" "$dir/extra.h5"
# `latest` holding a NUL: refused before training, its content printed
# whole (\x00), not cut short.
case_ latest_nul "nul/latest' is not meshlm's \(it holds 'step_\\\\x0000000004.h5'" \
  auto --checkpoint.dir="$dir/nul"
# A checkpoint as quant.base (full and LoRA) or finetune.adapters_from is
# checked as a resume checks it: its checksums, and a FIFO refused by name.
run_ base_flipped "flipped.h5': dataset '/params/h.1.mlp.c_fc.weight' fails its checksum" "$dir/flipped.h5" \
  train "$cfg" "${base[@]}" --quant.base="$dir/flipped.h5"
run_ base_flipped_lora "flipped.h5': dataset '/params/h.1.mlp.c_fc.weight' fails its checksum" "$dir/flipped.h5" \
  train "$cfg" "${base[@]}" --quant.base="$dir/flipped.h5" --finetune.mode=lora
run_ adapters_fifo "fifo.h5' is a FIFO" "$dir/fifo.h5" \
  train "$cfg" "${base[@]}" --finetune.mode=lora --finetune.adapters_from="$dir/fifo.h5"
# The ckpt tools refuse a FIFO by name too (they wrote nothing to check).
for tool in verify inspect; do
  bash "$limit" 30 $mpiexec "$meshlm" ckpt $tool "$dir/fifo.h5" > "$dir/tool_$tool.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "fifo.h5: is a FIFO" "$dir/tool_$tool.log"; then
    cat "$dir/tool_$tool.log"; echo "FAIL [ckpt_${tool}_fifo]: exit status $rc (124: hung)"; fail=1
  else
    echo "ok [ckpt_${tool}_fifo]: $(grep '^ERROR' "$dir/tool_$tool.log" | cut -c1-160)"
  fi
done
# `latest` with a CRLF line end names the checkpoint all the same.
bash "$limit" 60 $mpiexec "$meshlm" train "$cfg" "${base[@]}" --output.dir="$dir/out_crlf" \
  --checkpoint.resume=auto --checkpoint.dir="$dir/crlf" > "$dir/out_crlf.log" 2>&1 \
  && grep -q "resuming from $dir/crlf/step_00000004.h5" "$dir/out_crlf.log" \
  && echo "ok [latest_crlf]" || { tail -5 "$dir/out_crlf.log"; echo "FAIL [latest_crlf]: not resumed"; fail=1; }
exit $fail
