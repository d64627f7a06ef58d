#!/usr/bin/env bash
# fumarole's main job on a built-in default, on a fresh machine:
#
#   scripts/demo.sh [--with plugins|extender] [--ui-port N] [--once]
#       sets up, builds what it runs, starts a local cluster (the e2e control plane: etcd,
#       kube-apiserver, Volcano's controllers), seven bundled fixture nodes in two super-nodes,
#       each with a harness kubelet and a real fumarole-agent, and both schedulers deciding with
#       fumarole: by default its two plugins (kube-scheduler-fumarole, vc-scheduler-fumarole),
#       with `--with extender` upstream's kube-scheduler and Volcano calling the scheduler
#       extension (and its /ui page); submits a few workloads, prints where each pod landed,
#       with which devices and why; runs until Ctrl-C and stops everything it started. Needs
#       root and Go.
#   scripts/demo.sh discover [FIXTURE|host] [ARGS...]
#       one node's topology: a bundled fixture (default dgx-h100) or this machine; ARGS go to
#       `fumarole-agent discover`, e.g. `scripts/demo.sh discover atlas-800-910 --format matrix`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}

if [[ ${1:-} == discover ]]; then
  shift
  scripts/setup.sh cargo
  cargo build --release -q -p fumarole-agent
  node=${1:-dgx-h100}
  shift || true
  if [[ $node == host ]]; then
    exec "$CARGO_TARGET_DIR/release/fumarole-agent" discover "$@"
  fi
  exec "$CARGO_TARGET_DIR/release/fumarole-agent" discover --fixture "$node" "$@"
fi

if ! command -v go >/dev/null 2>&1; then
  echo "demo: Go is not on PATH. The local cluster (etcd, kube-apiserver, kube-scheduler," >&2
  echo "  Volcano and the harness kubelet) is built from Go modules and needs Go >= 1.24 with" >&2
  echo "  a reachable GOPROXY. Without Go, 'scripts/demo.sh discover' shows one node's topology." >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "demo: the cluster's nodes run the kubelet's device manager in their own mount namespace," >&2
  echo "  which needs root. Run it as root, or 'scripts/demo.sh discover' without a cluster." >&2
  exit 1
fi
with=plugins
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --with=*) with="${!i#--with=}" ;;
    --with) j=$((i + 1)); with="${!j:-}" ;;
  esac
done
case "$with" in
  plugins | extender) ;;
  *) echo "demo: --with takes plugins or extender, not '$with'" >&2; exit 2 ;;
esac
scripts/setup.sh
echo "==> building the control plane from Go modules (first run on a fresh machine: about 14 min)"
upstream=$(e2e/build-upstream.sh --control-plane | tail -n1)
export "${upstream?}"
echo "==> building fumarole (first run on a fresh machine: several minutes)"
# The agent, the demo and kubectl-fumarole always; then what decides.
cargo build -p fumarole-agent -p fumarole-e2e -p fumarole-scheduler-ext \
  --bin fumarole-agent --bin fumarole-demo --bin kubectl-fumarole
if [[ $with == plugins ]]; then
  echo "==> building kube-scheduler-fumarole and vc-scheduler-fumarole (the decision core linked into each; first run: about 10 min)"
  kube-plugin/build.sh
  volcano-plugin/build.sh
else
  cargo build -p fumarole-scheduler-ext --bin fumarole-scheduler-ext
fi
exec "$CARGO_TARGET_DIR/debug/fumarole-demo" "$@"
