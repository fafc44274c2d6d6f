#!/usr/bin/env bash
# run_fuzzers.sh BUILD_DIR [SECONDS] [TARGET...]
#
# Runs each libFuzzer target of BUILD_DIR (configured with -DMESHLM_FUZZ=ON)
# for SECONDS (default 60), starting from its seed corpus
# (tests/fuzz/corpus/<target>/) and the inputs of past findings
# (tests/fuzz/regressions/<target>/), with tests/fuzz/<target>.dict as
# libFuzzer's dictionary where there is one. New coverage goes to a work corpus in
# BUILD_DIR/fuzz-work/<target>/, never into the repository. A crash, a
# sanitizer report, a leak, a hang (> 10 s on one input) or an input using
# more than 2 GB fails the run: the script goes on with the other targets,
# then exits 1 and names the inputs (BUILD_DIR/fuzz-work/<target>/crash-*,
# ...), which belong in tests/fuzz/regressions/<target>/ once fixed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: $0 BUILD_DIR [SECONDS] [TARGET...]}"
seconds="${2:-60}"
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(parameter_file safetensors tokens quant_cache)

# The largest input each target may grow to: a bit more than its largest seed.
declare -A max_len=([parameter_file]=4096 [safetensors]=4096 [tokens]=8192 [quant_cache]=16384)

# HDF5 1.10 loses memory when it fails to read a damaged file: suppressed
# (tests/lsan.supp), as in the sanitizer build of the tests.
export LSAN_OPTIONS="suppressions=$here/../lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# HDF5 sizes some of its buffers from the file: a damaged length makes it
# ask malloc for petabytes, get NULL and report an error, as it would
# without ASan (allocator_may_return_null=1; meshlm's own `new` still reports
# such a size). -malloc_limit_mb lets such a request through to that NULL;
# -rss_limit_mb still catches memory really used. Every HDF5 file open
# allocates and frees about a megabyte: a smaller quarantine, given back to
# the system, keeps the HDF5 targets' RSS flat (else it climbs past 1 GB a
# minute).
export ASAN_OPTIONS="allocator_may_return_null=1:quarantine_size_mb=64:allocator_release_to_os_interval_ms=500${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

failed=()
for t in "${targets[@]}"; do
  exe="$build/tests/fuzz/fuzz_$t"
  if [[ ! -x "$exe" ]]; then
    echo "run_fuzzers: $exe is missing (build with -DMESHLM_FUZZ=ON)" >&2
    failed+=("$t")
    continue
  fi
  work="$build/fuzz-work/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  dirs=("$work/corpus" "$here/corpus/$t")
  [[ -d "$here/regressions/$t" ]] && dirs+=("$here/regressions/$t")
  opts=()
  [[ -f "$here/$t.dict" ]] && opts+=(-dict="$here/$t.dict")
  echo "=== fuzz_$t: ${seconds}s"
  # -print_final_stats: one summary line per target in the log.
  if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1048576 \
      -max_len="${max_len[$t]:-4096}" -artifact_prefix="$work/" -print_final_stats=1 \
      "${opts[@]}" "${dirs[@]}" >"$work/log" 2>&1; then
    failed+=("$t")
    tail -n 60 "$work/log"
    echo "run_fuzzers: fuzz_$t FAILED; inputs: $(ls "$work" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed "s|^|$work/|" | tr '\n' ' ')"
  else
    grep -E '^(#[0-9]+.*DONE|Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$work/log" | tr '\n' ' '
    echo
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run_fuzzers: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}"
  exit 1
fi
echo "run_fuzzers: ${#targets[@]} targets ran ${seconds}s each without a finding"
