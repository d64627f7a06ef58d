#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test fumarole. Idempotent, and a
# no-op (well under a second) when everything is there. Rust (rustup, with clippy and
# rustfmt) and Go come with the machine; apt packages are installed here.
set -euo pipefail

# libudev-dev: hwloc's pkg-config file asks the linker for -ludev (the unversioned libudev.so).
packages=(libhwloc-dev libudev-dev hwloc pkg-config protobuf-compiler util-linux curl)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The tools to check are the arguments (`cargo` alone builds the agent; the e2e control plane
# needs `go` too); both by default.
tools=("$@")
((${#tools[@]})) || tools=(cargo go)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "setup: $tool not found on PATH" >&2; exit 1; }
done
