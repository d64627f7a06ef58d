#!/usr/bin/env bash
# Checks fumarole-agent against a real NVIDIA GPU: what `discover` reads through the real
# libnvidia-ml.so.1 must equal what nvidia-smi says (UUID, name, serial, PCI bus id, memory),
# and `run --standalone` must start NVML health watching on the real library. Not part of CI
# (no GPU there); run it on any machine with a GPU and the driver:
#   scripts/gpu-check.sh [AGENT_BINARY]      # default: the debug build under CARGO_TARGET_DIR
# Prints one line per GPU and field, and exits non-zero on the first mismatch.
set -euo pipefail
agent=${1:-${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}/debug/fumarole-agent}
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found (no NVIDIA driver here)" >&2; exit 2; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT

nvidia-smi --query-gpu=uuid,name,serial,pci.bus_id,memory.total --format=csv,noheader,nounits > "$out/smi.csv"
"$agent" discover --format json > "$out/discover.json"

python3 - "$out/smi.csv" "$out/discover.json" <<'PY'
import csv, json, sys
smi = [[c.strip() for c in row] for row in csv.reader(open(sys.argv[1]))]
devices = {d.get("uuid"): d for d in json.load(open(sys.argv[2]))["devices"] if d.get("vendor") == "nvidia"}
bad = 0
if len(devices) != len(smi):
    print(f"count: nvidia-smi {len(smi)}, fumarole {len(devices)}  MISMATCH"); bad += 1
for uuid, name, serial, bus, mib in smi:
    d = devices.get(uuid)
    if d is None:
        print(f"{uuid}: not discovered  MISMATCH"); bad += 1; continue
    # nvidia-smi writes the bus id with an 8-digit domain (00000000:00:06.0), fumarole 4 digits.
    checks = [("name", name, d.get("model")), ("serial", serial, d.get("serial")),
              ("pci", bus.lower()[-12:], (d.get("pciBusId") or "").lower()),
              ("memory MiB", mib, str((d.get("memoryBytes") or 0) // (1 << 20)))]
    for field, want, got in checks:
        ok = want == got
        bad += not ok
        print(f"{uuid} {field}: nvidia-smi {want!r}, fumarole {got!r}  {'ok' if ok else 'MISMATCH'}")
sys.exit(1 if bad else 0)
PY

mkdir -p "$out/dp"
FUMAROLE_LOG=info FUMAROLE_LOG_FORMAT=json timeout 10 "$agent" run --standalone --device-plugin-dir "$out/dp" \
  > "$out/run.log" 2>&1 || true
if grep -q '"NVML health watching"' "$out/run.log"; then
  grep '"NVML health watching"' "$out/run.log" | head -1
  echo "health: NVML health watching started on the real library  ok"
else
  cat "$out/run.log" >&2
  echo "health: NVML health watching did not start  MISMATCH"; exit 1
fi
