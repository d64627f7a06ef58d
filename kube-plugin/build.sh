#!/usr/bin/env bash
# Builds kube-scheduler-fumarole: upstream kube-scheduler (the version go.mod pins) with
# fumarole's framework plugin compiled in, linked against the decision core (crate
# fumarole-scheduler-abi, a static library). Extra arguments go to cargo (`--release`,
# `--locked`).
#
# Output: $CARGO_TARGET_DIR/<debug|release>/kube-scheduler-fumarole, beside fumarole's other
# binaries (the e2e tests find it there). The last line on stdout is its path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}
profile=debug
for a in "$@"; do [[ $a == --release ]] && profile=release; done
libdir="$(scheduler-abi/go/build-lib.sh "$@")"
bin="$CARGO_TARGET_DIR/$profile/kube-scheduler-fumarole"
cd kube-plugin
k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="$(cut -d. -f2 <<<"$k8s_version")"
# upstream's version ldflags (hack/lib/version.sh), so /version and the compatibility version
# are kube-scheduler's own.
ldv=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldv+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
done
CGO_ENABLED=1 CGO_LDFLAGS="-L$libdir" go build -buildvcs=false -trimpath -ldflags "$ldv" \
  -o "$bin.tmp" ./cmd/kube-scheduler
mv "$bin.tmp" "$bin"
echo "$bin"
