#!/usr/bin/env bash
# Builds vc-scheduler-fumarole (build.sh, extra arguments go to cargo) and checks the Go side:
# gofmt, go vet and the package's unit tests (linked against the same static library), also
# against each other Volcano version's module. The plugin's behaviour inside Volcano is tested
# by the e2e suite (e2e/tests/scheduler_ext_volcano.rs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bin="$(./build.sh "$@" | tail -n1)"
export CGO_ENABLED=1 CGO_LDFLAGS="-L$(dirname "$bin")/fumarole-abi-lib"
unformatted="$(gofmt -l .)"
[[ -z $unformatted ]] || { echo "volcano-plugin: gofmt would change: $unformatted" >&2; exit 1; }
go vet ./...
go test ./...
# The same packages against each other Volcano version's module (v<major>.<minor>/, see build.sh).
for m in v*/; do
  [[ -f $m/go.mod ]] || continue
  tags="volcano_$(basename "$m" | tr . _)"
  (cd "$m" && go vet -tags "$tags" . fumarole.dev/volcano-plugin/... &&
    go test -tags "$tags" fumarole.dev/volcano-plugin/...)
done
