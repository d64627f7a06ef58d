#!/usr/bin/env bash
# Builds vc-scheduler-fumarole: Volcano's scheduler (the version go.mod pins) with fumarole's
# plugin compiled in, linked against the decision core (crate fumarole-scheduler-abi, a static
# library). Extra arguments go to cargo (`--release`, `--locked`).
#
# Output: $CARGO_TARGET_DIR/<debug|release>/vc-scheduler-fumarole, beside fumarole's other
# binaries (the e2e tests find it there). The last line on stdout is its path.
#
# VOLCANO=<version> (e.g. v1.14.1) builds the same sources against another Volcano instead, with
# the module in v<major>.<minor>/ (its go.mod must pin exactly that version), into
# vc-scheduler-fumarole-<version> beside the default. VOLCANO set to go.mod's own version
# builds the default.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fumarole/target}
profile=debug
for a in "$@"; do [[ $a == --release ]] && profile=release; done
out="$CARGO_TARGET_DIR/$profile"

libdir="$(scheduler-abi/go/build-lib.sh "$@")"

bin="$out/vc-scheduler-fumarole"
cd volcano-plugin
vc_version="$(awk '$1 == "require" && $2 == "volcano.sh/volcano" { print $3 }' go.mod)"
main=./cmd/vc-scheduler
# Code only one Volcano version compiles (its PreBinder, say) sits behind the build tag
# volcano_v<major>_<minor> of the module that builds it.
tags=""
if [[ -n ${VOLCANO:-} && $VOLCANO != "$vc_version" ]]; then
  moddir="${VOLCANO%.*}"
  if [[ ! $VOLCANO =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ || ! -f $moddir/go.mod ]]; then
    echo "build.sh: VOLCANO=$VOLCANO: no module for it (volcano-plugin/$moddir/go.mod); have: $vc_version $(ls -d v*/ 2>/dev/null | tr -d /)" >&2
    exit 1
  fi
  cd "$moddir"
  vc_version="$(go list -m -f '{{.Version}}' volcano.sh/volcano)"
  if [[ $vc_version != "$VOLCANO" ]]; then
    echo "build.sh: VOLCANO=$VOLCANO but volcano-plugin/$moddir/go.mod pins $vc_version" >&2
    exit 1
  fi
  main=.
  bin="$bin-$VOLCANO"
  tags="volcano_${moddir//./_}"
fi
vpkg=volcano.sh/volcano/pkg/version
CGO_ENABLED=1 CGO_LDFLAGS="-L$libdir" go build -buildvcs=false -trimpath -tags "$tags" \
  -ldflags "-X $vpkg.GitSHA=$vc_version -X $vpkg.Version=$vc_version-fumarole" \
  -o "$bin.tmp" "$main"
mv "$bin.tmp" "$bin"
echo "$bin"
