#!/usr/bin/env bash
# Checks fumarole-agent against a real NVIDIA GPU: what `discover` reads through the real
# libnvidia-ml.so.1 must equal what nvidia-smi says (UUID, name, serial, PCI bus id, memory),
# `run --standalone` must start NVML health watching on the real library, and its device plugin
# must answer the kubelet's calls for the real GPUs (every GPU listed Healthy; an allocation of one
# gives its UUID and device node). Not part of CI (no GPU there); run it on any machine with a GPU
# and the driver:
#   scripts/gpu-check.sh [AGENT_BINARY [ASK_PLUGIN_BINARY]]
# (defaults: the debug builds under CARGO_TARGET_DIR; ASK_PLUGIN is
# `cargo build -p fumarole-device-plugin --example ask_plugin`).
# Prints one line per GPU and field, and exits non-zero on the first mismatch.
set -euo pipefail
target=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}/debug
agent=${1:-$target/fumarole-agent}
ask=${2:-$target/examples/ask_plugin}
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
FUMAROLE_LOG=info FUMAROLE_LOG_FORMAT=json timeout 20 "$agent" run --standalone --device-plugin-dir "$out/dp" \
  > "$out/run.log" 2>&1 &
agent_pid=$!
for _ in $(seq 50); do [ -S "$out/dp/fumarole-nvidia.com_gpu.sock" ] && break; sleep 0.2; done
"$ask" "$out/dp/fumarole-nvidia.com_gpu.sock" 1 > "$out/ask.txt" 2>&1 || { cat "$out/ask.txt" >&2; echo "device plugin: the kubelet's calls failed  MISMATCH"; exit 1; }
cat "$out/ask.txt"
python3 - "$out/smi.csv" "$out/ask.txt" <<'PY'
import csv, re, sys
uuids = {row[0].strip() for row in csv.reader(open(sys.argv[1]))}
ask = open(sys.argv[2]).read()
listed = dict(re.findall(r"^  (\S+) (\S+) numa=", ask, re.M))
visible = re.search(r'"NVIDIA_VISIBLE_DEVICES": "([^"]*)"', ask)
nodes = re.findall(r"^device: (/dev/nvidia\d+) ->", ask, re.M)
checks = [("listed", sorted(uuids), sorted(listed)),
          ("healthy", sorted(uuids), sorted(u for u, h in listed.items() if h == "Healthy")),
          ("allocated uuids", 1, len(visible.group(1).split(",")) if visible else 0),
          ("allocated uuid known", True, bool(visible) and visible.group(1) in uuids),
          ("allocated device nodes", 1, len(nodes))]
bad = 0
for field, want, got in checks:
    ok = want == got
    bad += not ok
    print(f"device plugin {field}: want {want!r}, got {got!r}  {'ok' if ok else 'MISMATCH'}")
sys.exit(1 if bad else 0)
PY
wait "$agent_pid" || true
if grep -q '"NVML health watching"' "$out/run.log"; then
  grep '"NVML health watching"' "$out/run.log" | head -1
  echo "health: NVML health watching started on the real library  ok"
else
  cat "$out/run.log" >&2
  echo "health: NVML health watching did not start  MISMATCH"; exit 1
fi
