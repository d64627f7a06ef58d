#!/usr/bin/env bash
# Times `fumarole-agent discover` against hwloc's `lstopo --of xml` on the same filesystem
# root, for each bundled fixture and a few hwloc corpus machines, with hyperfine.
# Usage: scripts/bench-vs-lstopo.sh [results.md]   (needs: hwloc, hyperfine; release build)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}
cargo build --release -q -p fumarole-agent
agent=$CARGO_TARGET_DIR/release/fumarole-agent
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

roots=()
for name in dgx-h100 atlas-800t-a2 pcie-4gpu; do
  "$agent" fixture "$name" --out "$work/$name" >/dev/null
  roots+=("$name=$work/$name")
done
corpus=${FUMAROLE_HWLOC_CORPUS:-../shared/fixtures/hwloc-linux}
for name in 32em64t-2n8c+1mic fakecpuid1f-64intel64-2p4d2n2c2t; do
  mkdir -p "$work/corpus-$name"
  tar xjf "$corpus/$name.tar.bz2" -C "$work/corpus-$name"
  roots+=("$name=$(echo "$work/corpus-$name"/*)")
done

echo "| root | fumarole-agent discover --format json | lstopo --of xml | ratio |" >"$out.tmp"
echo "|---|---|---|---|" >>"$out.tmp"
for entry in "${roots[@]}"; do
  name=${entry%%=*} root=${entry#*=}
  json=$work/$name.json
  HWLOC_COMPONENTS=linux,stop HWLOC_FSROOT=$root hyperfine -N -w 3 -r 30 --export-json "$json" \
    "$agent discover --format json --root $root" \
    "lstopo-no-graphics --of xml -" >/dev/null 2>&1
  python3 - "$json" "$name" >>"$out.tmp" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
ours, theirs = r[0]["mean"] * 1e3, r[1]["mean"] * 1e3
print(f"| {sys.argv[2]} | {ours:.1f} ms | {theirs:.1f} ms | {ours / theirs:.2f} |")
PY
done
cat "$out.tmp" >"$out"; rm -f "$out.tmp"
