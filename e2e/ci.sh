#!/usr/bin/env bash
# The e2e step of CI, called from .ci/run: build the upstream control plane (cached
# by pinned versions; seconds when warm) and run the e2e tests against it.
#
# Needs Go >= 1.24 with GOPROXY reachable, protoc (Debian: protobuf-compiler),
# flock (util-linux), Node.js with npm, and Debian's chromium (installed here when missing). Extra cargo args are passed through, e.g. `e2e/ci.sh --locked`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v protoc >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
  else
    echo "e2e/ci.sh: protoc not found (Debian: apt-get install protobuf-compiler)" >&2
    exit 1
  fi
fi

# The /ui test drives Debian's Chromium with playwright-core (no browser download).
if ! command -v chromium >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "e2e/ci.sh: chromium not found (Debian: apt-get install chromium)" >&2
    exit 1
  fi
fi
npm ci --prefix e2e/ui --no-audit --no-fund --loglevel=error

start=$(date +%s)
line="$(e2e/build-upstream.sh | tail -n1)"
export "${line?}"
echo "e2e/ci.sh: upstream ready in $(( $(date +%s) - start ))s at $FUMAROLE_UPSTREAM_DIR" >&2

# The exporter and scheduler-extension tests run our binaries beside the test binaries (the
# fumarole-scheduler-ext package builds kubectl-fumarole too, for the kubectl_plugin test); the
# device-health tests load the stand-in vendor libraries from there too.
cargo build -p fumarole-agent -p fumarole-scheduler-ext -p fumarole-standin-nvml -p fumarole-standin-dcmi "$@"
# Volcano's scheduler with fumarole's plugin compiled in (cgo over the scheduler-abi static
# library), and the Go side's vet and unit tests; under a minute when warm.
volcano-plugin/test.sh "$@"
# kube-scheduler with fumarole's framework plugin compiled in, and its Go checks (also those of
# the cgo binding both plugins share).
kube-plugin/test.sh "$@"
# The same Volcano plugin built against Volcano v1.14.1 (the plugin_on_volcano_1_14_* tests run it;
# they would build it only when missing, so a stale one would go unnoticed).
VOLCANO=v1.14.1 volcano-plugin/build.sh "$@" >/dev/null
# A test that cannot run here (no cgroup v1 hierarchy, not root) returns early and libtest
# counts it passed; it records itself in this file, and CI, which has all it needs, fails on it.
skipped="$(mktemp)"
export FUMAROLE_E2E_SKIPPED="$skipped"
# The e2e files run in two lanes at once, each file after the other within its lane: most of
# their time is spent waiting (leases expiring, API server outages held, steady states watched),
# not computing. The second lane holds those waits and the node-side (cgroup) tests; the first
# the schedulers' tests, which keep the CPUs busy. Each lane draws its ports from its own half
# of the range (FUMAROLE_E2E_PORT_LANE). A file not listed in `waiting` runs in the first lane.
cargo test -p fumarole-e2e --no-run "$@"
waiting=(api_faults exporter dead_agent device_health soak colocation colocation_node device_chain)
busy=()
for file in e2e/tests/*.rs; do
  name="$(basename "$file" .rs)"
  [[ " ${waiting[*]} " == *" $name "* ]] || busy+=("$name")
done
lanes="$(mktemp -d)"
lane() { # lane K TARGET-ARGS...: one cargo test over the given targets, its output in $lanes/K
  local k="$1"
  shift
  FUMAROLE_E2E_PORT_LANE="$k/2" cargo test --no-fail-fast -p fumarole-e2e "${cargo_args[@]}" "$@" \
    >"$lanes/$k" 2>&1
}
cargo_args=("$@")
lane 1 --lib --bins $(printf -- '--test %s ' "${busy[@]}") &
first=$!
lane 2 $(printf -- '--test %s ' "${waiting[@]}") &
second=$!
failed=0
wait "$first" || failed=1
wait "$second" || failed=1
for k in 1 2; do
  echo "e2e/ci.sh: lane $k" >&2
  cat "$lanes/$k"
done
if [[ $failed -ne 0 ]]; then
  echo "e2e/ci.sh: an e2e lane failed (its output above)" >&2
  exit 1
fi
if [[ -s "$skipped" ]]; then
  echo "e2e/ci.sh: $(wc -l < "$skipped") e2e tests skipped, and CI requires every one:" >&2
  cat "$skipped" >&2
  exit 1
fi
echo "e2e/ci.sh: e2e tests skipped: 0" >&2
# The side-by-side scheduler bench at a smoke size, for correctness only, on fumarole's Volcano
# plugin: every pod bound, no unit or atomic part split, no GPU given twice, no error from the
# plugin in vc-scheduler's log (about 30 s; figures: docs/performance.md). The other arrangements
# stay out: Volcano with the extender can leave a gang waiting (docs/performance.md).
cargo test -p fumarole-e2e --bench scheduler_perf "$@" -- --nodes 72 --jobs 40 --check --only volcano-plugin,kube-plugin
