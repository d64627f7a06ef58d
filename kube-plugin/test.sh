#!/usr/bin/env bash
# Builds kube-scheduler-fumarole (build.sh, extra arguments go to cargo) and checks the Go side:
# gofmt, go vet and the unit tests of the plugin and of the shared cgo binding
# (scheduler-abi/go), linked against the same static library. The plugin's behaviour inside
# kube-scheduler is tested by the e2e suite (e2e/tests/kube_plugin.rs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bin="$(./build.sh "$@" | tail -n1)"
export CGO_ENABLED=1 CGO_LDFLAGS="-L$(dirname "$bin")/fumarole-abi-lib"
for dir in . ../scheduler-abi/go; do
  unformatted="$(cd "$dir" && gofmt -l .)"
  [[ -z $unformatted ]] || { echo "kube-plugin: gofmt would change in $dir: $unformatted" >&2; exit 1; }
  (cd "$dir" && go vet ./... && go test ./...)
done
