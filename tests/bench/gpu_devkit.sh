#!/usr/bin/env bash
# gpu_devkit.sh — run once on this machine, from the repository root, before
# a GPU machine's first call (../shared/device/README.md): the kit of
# ../shared/device/pack.sh (Debian's packages in .devkit/debs/, unpacked on
# the GPU machine by `source .devkit/setup.sh`), plus the packages meshlm
# builds against that the kit's list leaves out: PCRE2 and libsentencepiece
# (src/text's tokenizers). CMake finds them by their files on the kit's
# CMAKE_PREFIX_PATH (CMakeLists.txt). Then carry `.devkit` in the run and
# begin its command with `source .devkit/setup.sh` (tests/bench/gpu_check.sh).
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
kit=${MESHLM_DEVKIT_PACK:-$top/../shared/device/pack.sh}
[ -f "$kit" ] || { echo "gpu_devkit.sh: no kit script at $kit (set MESHLM_DEVKIT_PACK)" >&2; exit 1; }
bash "$kit"
extra=(libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
       libsentencepiece-dev libsentencepiece0)
missing=()
for p in "${extra[@]}"; do
  ls .devkit/debs/"${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  (cd .devkit/debs && apt-get download "${missing[@]}" >/dev/null)
fi
for p in "${extra[@]}"; do
  ls .devkit/debs/"${p}"_*.deb >/dev/null 2>&1 || { echo "gpu_devkit.sh: $p was not downloaded" >&2; exit 1; }
done
echo "gpu_devkit.sh: $(ls .devkit/debs/*.deb | wc -l) packages, $(du -sh .devkit | cut -f1) in .devkit/" \
     "(with ${extra[*]})"
