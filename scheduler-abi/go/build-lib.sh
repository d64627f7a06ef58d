#!/usr/bin/env bash
# Builds the decision core's static library (crate fumarole-scheduler-abi) for the Go plugins
# that link it (volcano-plugin, kube-plugin) and prints the folder to put in CGO_LDFLAGS (-L).
# Extra arguments go to cargo (`--release`, `--locked`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}
profile=debug
for a in "$@"; do [[ $a == --release ]] && profile=release; done
out="$CARGO_TARGET_DIR/$profile"

cargo build -p fumarole-scheduler-abi "$@" >&2
lib="$out/libfumarole_scheduler_abi.a"
# The debug archive is mostly debug info (hundreds of MB); the linker needs none of it.
libdir="$out/fumarole-abi-lib"
mkdir -p "$libdir"
# One build at a time may replace the stripped copy (the two plugins build side by side).
exec 9>"$libdir/.lock"
flock 9
if [[ ! -f "$libdir/libfumarole_scheduler_abi.a" || "$lib" -nt "$libdir/libfumarole_scheduler_abi.a" ]]; then
  objcopy --strip-debug "$lib" "$libdir/libfumarole_scheduler_abi.a.tmp"
  mv "$libdir/libfumarole_scheduler_abi.a.tmp" "$libdir/libfumarole_scheduler_abi.a"
fi
echo "$libdir"
