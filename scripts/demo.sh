#!/usr/bin/env bash
# fumarole's main job on a built-in default, on a fresh machine:
#
#   scripts/demo.sh [--ui-port N] [--once]
#       sets up, builds, starts a local cluster (the e2e control plane: etcd, kube-apiserver,
#       kube-scheduler, Volcano), seven bundled fixture nodes in two super-nodes, each with a
#       harness kubelet and a real fumarole-agent, and the scheduler extension; submits a few
#       workloads, prints where each pod landed, with which devices and why, and the /ui URL;
#       runs until Ctrl-C and stops everything it started. Needs root and Go.
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
scripts/setup.sh
echo "==> building the control plane from Go modules (first run on a fresh machine: about 10 min)"
upstream=$(e2e/build-upstream.sh | tail -n1)
export "${upstream?}"
echo "==> building fumarole (first run on a fresh machine: several minutes)"
cargo build -p fumarole-agent -p fumarole-scheduler-ext -p fumarole-e2e --bins
exec "$CARGO_TARGET_DIR/debug/fumarole-demo" "$@"
