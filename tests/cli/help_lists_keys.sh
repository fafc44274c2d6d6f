#!/usr/bin/env bash
# help_lists_keys.sh MESHLM INPUTS_DIR PARAMETERS_MD
# `meshlm train --help` documents every key used by the shipped parameter
# files, with a default; docs/parameters.md (the parameter reference) lists every key
# that --help lists.
set -u
meshlm=$1
inputs=$2
reference=$3
help=$("$meshlm" train --help) || { echo "FAIL: meshlm train --help exited non-zero"; exit 1; }
echo "$help"
fail=0
for cfg in "$inputs"/*.cfg; do
  section=""
  while IFS= read -r line; do
    line=${line%%#*}
    if [[ $line =~ ^\[([a-z_]+)\] ]]; then section=${BASH_REMATCH[1]}; continue; fi
    if [[ $line =~ ^[[:space:]]*([a-z_0-9]+)[[:space:]]*= ]]; then
      key="$section.${BASH_REMATCH[1]}"
      if ! grep -Eq -- "--$key arg \(=" <<<"$help"; then
        echo "FAIL: $cfg uses $key, which --help does not list with a default"; fail=1
      fi
    fi
  done <"$cfg"
done
while IFS= read -r entry; do
  if ! grep -Fq -- "$entry" "$reference"; then
    echo "FAIL: $reference lacks '$entry' (regenerate it from meshlm train --help)"; fail=1
  fi
done < <(grep -Eo -- '--[a-z_]+\.[a-z_0-9]+ arg \(=[^)]*\)' <<<"$help")
exit $fail
