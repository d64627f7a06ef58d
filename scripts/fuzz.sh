#!/usr/bin/env bash
# Runs each fuzz target (fuzz/, cargo fuzz + libFuzzer) for a fixed time and reports
# executions and crashes per target.
#
#   scripts/fuzz.sh [-t SECONDS] [TARGET...]     (default: 60 s each, every target)
#
# Installs the nightly toolchain and cargo-fuzz when missing. New corpus entries go to
# $FUMAROLE_CACHE/fuzz/corpus/<target> (the committed seeds in fuzz/corpus/ are only read);
# crashing inputs go to $FUMAROLE_CACHE/fuzz/artifacts/<target>/. A crash is fixed and its
# input copied to fuzz/regressions/<target>/, which `cargo test -p fumarole-fuzz` replays.
# FUZZ_SANITIZER picks cargo fuzz's sanitizer (default none: the code is safe Rust, and the
# builds run with overflow checks and debug assertions, which turn bugs into panics).
# Exits 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
while getopts "t:" opt; do
  case "$opt" in
    t) seconds="$OPTARG" ;;
    *) echo "usage: $0 [-t SECONDS] [TARGET...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

cache="${FUMAROLE_CACHE:-$HOME/.cache/fumarole}"
sanitizer="${FUZZ_SANITIZER:-none}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

fuzz=(cargo +nightly fuzz)
flags=(--fuzz-dir fuzz --features libfuzzer --debug-assertions -s "$sanitizer"
  --target-dir "$cache/fuzz/target")
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <("${fuzz[@]}" list --fuzz-dir fuzz)
fi

echo "building ${#targets[@]} targets (sanitizer: $sanitizer)"
for t in "${targets[@]}"; do
  "${fuzz[@]}" build "${flags[@]}" "$t"
done

report="$cache/fuzz/report.txt"
mkdir -p "$cache/fuzz"
printf '%-24s %12s %8s %8s  %s\n' target executions exec/s crashes "corpus (entries)" >"$report"
crashed=0
for t in "${targets[@]}"; do
  corpus="$cache/fuzz/corpus/$t"
  artifacts="$cache/fuzz/artifacts/$t"
  log="$cache/fuzz/$t.log"
  mkdir -p "$corpus"
  rm -rf "$artifacts" && mkdir -p "$artifacts"
  echo "fuzzing $t for ${seconds}s"
  "${fuzz[@]}" run "${flags[@]}" "$t" "$corpus" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1 || true
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(find "$artifacts" -type f | wc -l)
  entries=$(find "$corpus" -type f | wc -l)
  rate=$(( ${execs:-0} / seconds ))
  printf '%-24s %12s %8s %8s  %s\n' "$t" "${execs:-?}" "$rate" "$crashes" "$entries" >>"$report"
  if [ "$crashes" -gt 0 ]; then
    crashed=1
    echo "  CRASH in $t: $(find "$artifacts" -type f | head -3 | tr '\n' ' ') (log: $log)"
  fi
done

echo
echo "fuzzing ${seconds}s per target, $(date -u +%Y-%m-%dT%H:%M:%SZ), sanitizer $sanitizer:"
cat "$report"
exit "$crashed"
