#!/usr/bin/env bash
# nonfinite.sh "MPIEXEC LINE" MESHLM TINY_CFG MAKE_SAFETENSORS_PY
#
# meshlm never trains on a number it has not checked is finite:
#   1. a base safetensors file with one NaN (full training) and one infinity
#      (LoRA on NF4) is refused, naming the tensor and the index;
#   2. a step whose gradient is NaN (debug.nan_step) ends the run under
#      train.on_nonfinite = stop, naming the step and the tensor, with no
#      advice about the learning rate;
#   3. under skip the step is dropped and the run finishes; train.max_skipped
#      skipped steps in a row end it.
set -u
mpiexec_line=$1
meshlm=$2
tiny=$3
make_st=$4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail=0
run() {  # run NAME EXPECT_RC REGEX ARGS...
  local name=$1 want=$2 regex=$3
  shift 3
  # shellcheck disable=SC2086
  $mpiexec_line "$meshlm" train "$tiny" --data.path="$scratch/tokens.h5" "$@" >"$scratch/$name.log" 2>&1
  local rc=$?
  if { [ "$want" = 0 ] && [ "$rc" -ne 0 ]; } || { [ "$want" != 0 ] && [ "$rc" -eq 0 ]; }; then
    echo "FAIL $name: exit status $rc"; cat "$scratch/$name.log"; fail=1; return
  fi
  if ! grep -Eq -- "$regex" "$scratch/$name.log"; then
    echo "FAIL $name: output does not match: $regex"; cat "$scratch/$name.log"; fail=1; return
  fi
  if grep -q "train.lr\|warmup" "$scratch/$name.log" && [ "$want" != 0 ]; then
    echo "FAIL $name: the message gives advice about the learning rate"; fail=1; return
  fi
  echo "ok $name"
}
"$meshlm" tokenize /usr/share/common-licenses/GPL-3 "$scratch/tokens.h5" >/dev/null || exit 1
/usr/bin/python3 "$make_st" --n_layer 2 --n_embd 32 --n_head 2 --vocab_size 256 --max_seq_len 32 \
  --out "$scratch/base.safetensors" >/dev/null || exit 1
# Poison one value of a tensor in place: NAME FLAT_INDEX VALUE OUT
poison() {
  /usr/bin/python3 - "$scratch/base.safetensors" "$1" "$2" "$3" "$4" <<'PY'
import json, struct, sys, shutil
src, name, index, value, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
shutil.copy(src, out)
with open(out, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    begin = header[name]["data_offsets"][0]
    f.seek(8 + n + begin + 4 * index)
    f.write(struct.pack("<f", value))
PY
}
# The file stores c_attn (in, out) = (32, 96): file index 40 is in = 0,
# out = 40, so meshlm's (out, in) tensor has it at row 40, column 0.
poison h.1.attn.c_attn.weight 40 nan "$scratch/nan.safetensors"
poison wpe.weight 70 inf "$scratch/inf.safetensors"
run base_nan_full 1 "quant.base: .*nan.safetensors.*tensor 'h.1.attn.c_attn.weight' holds NaN at index 1280 \(row 40, column 0\)" \
  --quant.base="$scratch/nan.safetensors" --output.dir="$scratch/out1"
run base_inf_lora 1 "tensor 'wpe.weight' holds an infinite value at index 70 \(row 2, column 6\)" \
  --finetune.mode=lora --quant.type=nf4 --quant.base="$scratch/inf.safetensors" --output.dir="$scratch/out2"
run nan_gradient_stops 1 "step 3: the loss is [0-9.]+ and the gradient norm is nan; the first tensor whose gradient is not finite is wte.weight \(train.on_nonfinite = stop\)" \
  --debug.nan_step=3 --output.dir="$scratch/out3"
run nan_gradient_skipped 0 "step 3: .*wte.weight: step skipped, nothing updated \(1 in a row, 1 in all\)" \
  --debug.nan_step=3 --train.on_nonfinite=skip --output.dir="$scratch/out4"
run too_many_skipped 1 "2 steps in a row skipped \(train.max_skipped = 2\)" \
  --debug.nan_step=3 --debug.nan_count=5 --train.on_nonfinite=skip --train.max_skipped=2 --output.dir="$scratch/out5"
for d in out1 out2; do
  if [ -e "$scratch/$d" ]; then echo "FAIL: $d written for a refused base"; fail=1; fi
done
exit $fail
