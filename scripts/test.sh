#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up a fresh machine, then formatting, lints, unit,
# fixture and corpus tests, and the e2e suite against real upstream components.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}
export CARGO_TERM_COLOR=never
# Incremental caches only grow when every CI run builds a fresh clone at a new path.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

cargo fmt --all -- --check
scripts/module-cycles.py
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --exclude fumarole-e2e --locked
e2e/ci.sh --locked
