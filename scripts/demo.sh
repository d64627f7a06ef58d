#!/usr/bin/env bash
# The main job on a built-in default: set up, build, and discover a bundled fixture node
# (default dgx-h100) or this machine (`scripts/demo.sh host`). Extra arguments go to
# `fumarole-agent discover`, e.g. `scripts/demo.sh atlas-800-910 --format matrix`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}
cargo build --release -q -p fumarole-agent
node=${1:-dgx-h100}
shift || true
if [[ $node == host ]]; then
  exec "$CARGO_TARGET_DIR/release/fumarole-agent" discover "$@"
fi
exec "$CARGO_TARGET_DIR/release/fumarole-agent" discover --fixture "$node" "$@"
