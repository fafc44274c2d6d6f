#!/usr/bin/env bash
# plan_time.sh — how long `meshlm plan` takes on the shipped models, from
# 8 to 512 ranks (docs/PERFORMANCE.md, "Time to plan"). Run from the
# repository root:
#   tests/bench/plan_time.sh build/meshlm [OTHER_MESHLM]
# Prints one line per case: its seconds (wall) with each binary. With a
# second binary it also compares the two plans, all but their timing lines,
# and fails when they differ (a change meant to make planning faster must
# not change a plan).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: tests/bench/plan_time.sh MESHLM [OTHER_MESHLM]" >&2; exit 2; }
bins=("$@")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "plan_time.sh: $b is not an executable" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cases=(
  "inputs/llama3-8b.cfg --ranks 8 --ranks-per-node 8"
  "inputs/llama3-8b.cfg --ranks 8 --ranks-per-node 8 --backend cuda --mem-per-rank 80GiB"
  "inputs/llama3-8b.cfg --ranks 64 --ranks-per-node 8 --backend cuda --mem-per-rank 80GiB"
  "inputs/llama3-8b.cfg --ranks 512 --ranks-per-node 8 --backend cuda --mem-per-rank 80GiB"
  "inputs/llama3.2-1b.cfg --ranks 8 --ranks-per-node 4 --finetune.mode=lora --quant.type=nf4"
  "inputs/llama3.2-1b.cfg --ranks 8 --ranks-per-node 4 --finetune.mode=lora --quant.type=int8 --mem-per-rank 3GiB"
  "inputs/gpt2-124m.cfg --ranks 8 --ranks-per-node 8"
  "inputs/gpt2-124m.cfg --ranks 16 --ranks-per-node 4 --finetune.mode=lora --mem-per-rank 1GiB"
  "inputs/qlora-tiny.cfg --ranks 8 --ranks-per-node 4"
  "inputs/demo.cfg --ranks 4 --ranks-per-node 2"
)
status=0
printf '%-8s' "case"
for j in "${!bins[@]}"; do printf '%12s' "s, bin $((j + 1))"; done
printf '  %s\n' "meshlm plan ..."
for i in "${!cases[@]}"; do
  printf '%-8s' "$((i + 1))"
  for j in "${!bins[@]}"; do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # the case's words are its arguments
    "${bins[$j]}" plan ${cases[$i]} > "$out/$i.$j" 2>&1
    rc=$?
    end=$(date +%s.%N)
    # 1: nothing fits (the 8B model on this machine's memory); 2 and more: an error.
    [ $rc -le 1 ] || { echo "plan_time.sh: case $((i + 1)) failed (exit $rc) with ${bins[$j]}" >&2; status=1; }
    echo "exit $rc" >> "$out/$i.$j"
    printf '%12.2f' "$(echo "$end - $start" | bc)"
  done
  printf '  %s\n' "${cases[$i]}"
  if [ ${#bins[@]} -eq 2 ] &&
     ! diff -q <(grep -v 'planned in\|layout search' "$out/$i.0") \
                <(grep -v 'planned in\|layout search' "$out/$i.1") > /dev/null; then
    echo "plan_time.sh: case $((i + 1)): the two plans differ" >&2
    status=1
  fi
done
exit $status
