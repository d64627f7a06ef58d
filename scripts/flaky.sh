#!/usr/bin/env bash
# Runs the e2e tests that have failed by chance before, N times each, under CPU load (one busy
# loop per core, as a loaded CI machine), and prints runs and failures per test file. Not in CI
# (a run of N=5 takes about an hour on two cores); its figures go in docs/testing.md.
#
#   scripts/flaky.sh [N] [TEST_FILE...]     # N defaults to 5; the files to the list below
#
# Needs what e2e/ci.sh needs, and runs its set-up first (upstream control plane, our binaries,
# Volcano's scheduler with the plugin). The output of each failed run is kept under
# $FLAKY_LOGS (default /tmp/fumarole-flaky).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

N="${1:-5}"
shift || true
if [[ $# -gt 0 ]]; then
  files=("$@")
else
  # The historically flaky ones (issue 37; each with its cause where known in docs/testing.md,
  # "Flaky tests").
  files=(api_faults scheduler_ext_ha colocation_node device_chain deployment scheduler_ext_volcano)
fi
logs="${FLAKY_LOGS:-/tmp/fumarole-flaky}"
mkdir -p "$logs"

line="$(e2e/build-upstream.sh | tail -n1)"
export "${line?}"
cargo build -q -p fumarole-agent -p fumarole-scheduler-ext -p fumarole-standin-nvml -p fumarole-standin-dcmi
volcano-plugin/build.sh >/dev/null
VOLCANO=v1.14.1 volcano-plugin/build.sh >/dev/null
for f in "${files[@]}"; do
  cargo test -q -p fumarole-e2e --test "$f" --no-run 2>/dev/null
done

busy=()
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  busy+=($!)
done
trap 'kill "${busy[@]}" 2>/dev/null || true' EXIT

printf '%-20s %5s %8s\n' "test file" runs failures
for f in "${files[@]}"; do
  failed=0
  for i in $(seq "$N"); do
    out="$logs/$f-$i.log"
    if cargo test -q -p fumarole-e2e --test "$f" >"$out" 2>&1; then
      rm -f "$out"
    else
      failed=$((failed + 1))
      echo "  $f run $i failed: $out" >&2
    fi
  done
  printf '%-20s %5d %8d\n' "$f" "$N" "$failed"
done
