#!/usr/bin/env bash
# llama_resume.sh "MPIEXEC -n 2 ..." MESHLM LLAMA_TINY_CFG TINY_CFG PYTHON
#
# A Llama checkpoint (/meta arch = llama and its keys) resumes: in the same
# layout (dp 2) the losses of an uninterrupted run bit for bit, in another
# (pp 2) within 1e-5; a GPT-2 run or a Llama of another shape refuses it by
# name; `meshlm ckpt export` writes it as a Hugging Face Llama directory.
set -u
# Runs a job as `timeout` would, printing where its processes were on a hang.
limit=$(cd "$(dirname "$0")/../cli" && pwd)/limit.sh
mpiexec=$1; meshlm=$2; cfg=$3; tiny=$4; python=$5
dir=$(mktemp -d /tmp/meshlm_llama_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
common=(--data.path="$dir/tokens.h5" --train.steps=6 --train.log_every=1 --checkpoint.every=3
        --checkpoint.keep_last=0)
fail=0
run() {  # run NAME ARGS...: exit status of meshlm train
  local name=$1; shift
  bash "$limit" 120 $mpiexec "$meshlm" train "$cfg" "${common[@]}" --output.dir="$dir/$name" "$@" \
    > "$dir/$name.log" 2>&1
}
run whole --parallel.dp=2 || { cat "$dir/whole.log"; echo "FAIL: the uninterrupted run failed"; exit 1; }
ck="$dir/whole/checkpoints/step_00000003.h5"
"$python" - "$ck" <<'PY' || fail=1
import sys, h5py
m = h5py.File(sys.argv[1])["meta"].attrs
assert m["arch"] == b"llama" or m["arch"] == "llama", m["arch"]
assert int(m["n_kv_head"]) == 2 and int(m["intermediate_size"]) == 160, dict(m)
assert int(m["tie_word_embeddings"]) == 0
print("ok: /meta records arch = llama and its keys")
PY
for layout in "same --parallel.dp=2" "other --parallel.pp=2 --parallel.micro_batches=4"; do
  set -- $layout; name=$1; shift
  run "$name" "$@" --checkpoint.resume="$ck" || { cat "$dir/$name.log"; echo "FAIL [$name]: resume failed"; fail=1; continue; }
  "$python" - "$dir/whole/run.h5" "$dir/$name/run.h5" "$name" <<'PY' || fail=1
import sys, h5py, numpy as np
a, b = (h5py.File(p) for p in sys.argv[1:3])
la, lb = a["metrics/loss"][:], b["metrics/loss"][:]
sa, sb = list(a["metrics/step"][:]), list(b["metrics/step"][:])
assert sb[-3:] == [4, 5, 6], sb
want, got = la[[sa.index(s) for s in (4, 5, 6)]], lb[-3:]
if sys.argv[3] == "same":
    assert np.array_equal(got, want), (got, want)
else:
    assert np.allclose(got, want, rtol=1e-5, atol=0), (got, want)
print(f"ok [{sys.argv[3]}]: steps 4-6 resumed: {got}")
PY
done
# A GPT-2 run, and a Llama of another shape, refuse it by name.
bash "$limit" 60 $mpiexec "$meshlm" train "$tiny" --data.path="$dir/tokens.h5" --output.dir="$dir/gpt2" \
  --checkpoint.resume="$ck" > "$dir/gpt2.log" 2>&1
grep -q "model.arch = llama there, gpt2 in this run" "$dir/gpt2.log" && [ ! -e "$dir/gpt2/run.h5" ] \
  && echo "ok: a GPT-2 run refuses the Llama checkpoint" \
  || { cat "$dir/gpt2.log"; echo "FAIL: GPT-2 resumed a Llama checkpoint"; fail=1; }
run kv --model.n_kv_head=4 --checkpoint.resume="$ck"
grep -q "is of another model: model.n_kv_head = 2 there, 4 in this run" "$dir/kv.log" && echo "ok: another Llama refuses it" \
  || { cat "$dir/kv.log"; echo "FAIL: another Llama resumed it"; fail=1; }
bash "$limit" 60 $mpiexec "$meshlm" ckpt export "$ck" -o "$dir/hf" > "$dir/export.log" 2>&1
grep -q '"model_type": "llama"' "$dir/hf/config.json" && [ -s "$dir/hf/model.safetensors" ] \
  && echo "ok: export writes a Hugging Face Llama directory" \
  || { cat "$dir/export.log"; echo "FAIL: export of a Llama checkpoint"; fail=1; }
exit $fail
