#!/usr/bin/env bash
# ranks_disagree.sh "MPIEXEC [FLAGS]" MESHLM TINY_CFG
#
# Ranks that are not given the same run (an MPMD launch; node-local token
# files that differ) end with one error naming it, on time, and write
# nothing:
#   1. rank 1 with an override rank 0 lacks (--train.steps, which would have
#      hung the ranks in different collectives; --train.lr, which would have
#      trained dp replicas apart): "its command line ... is not rank 0's";
#   2. the same --data.path, relative, in two working directories holding
#      token files of different lengths: "is not the same file on every rank".
set -u
mpiexec=$1
meshlm=$2
cfg=$(realpath "$3")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
fail=0

# run NAME EXPECTED LAUNCH...: exit non-zero within 60 s, EXPECTED in the
# output, no output directory.
run() {
  local name=$1 want=$2
  shift 2
  # shellcheck disable=SC2086
  timeout 60 $mpiexec "$@" > "$name.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 124 ]; then
    echo "FAIL $name: the job hung (killed after 60 s)"; fail=1
  elif [ "$rc" -eq 0 ]; then
    echo "FAIL $name: exit status 0"; fail=1
  elif ! grep -q -- "$want" "$name.log"; then
    echo "FAIL $name: no line says '$want':"; cat "$name.log"; fail=1
  elif [ -e "$scratch/out_$name" ]; then
    echo "FAIL $name: out_$name was written"; fail=1
  else
    echo "ok   $name: $(grep -m1 ERROR "$name.log")"
  fi
}

printf 'a few words of text for the tokens\n%.0s' {1..200} > short.txt
"$meshlm" tokenize short.txt tokens.h5 > /dev/null 2>&1 || { echo "FAIL: tokenize"; exit 1; }
common=(train "$cfg" --data.path="$scratch/tokens.h5" --train.steps=2 --parallel.dp=2)
run steps "its command line" -n 1 "$meshlm" "${common[@]}" --output.dir="$scratch/out_steps" : \
  -n 1 "$meshlm" "${common[@]}" --output.dir="$scratch/out_steps" --train.steps=5
run lr "is not rank 0's" -n 1 "$meshlm" "${common[@]}" --output.dir="$scratch/out_lr" : \
  -n 1 "$meshlm" "${common[@]}" --output.dir="$scratch/out_lr" --train.lr=2e-3

mkdir -p a b
"$meshlm" tokenize short.txt a/tok.h5 > /dev/null 2>&1
cat short.txt short.txt > long.txt
"$meshlm" tokenize long.txt b/tok.h5 > /dev/null 2>&1
files=(train "$cfg" --data.path=tok.h5 --train.steps=2 --parallel.dp=2 --output.dir="$scratch/out_files")
run files "is not the same file on every rank" -n 1 -wdir "$scratch/a" "$meshlm" "${files[@]}" : \
  -n 1 -wdir "$scratch/b" "$meshlm" "${files[@]}"
exit $fail
