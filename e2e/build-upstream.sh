#!/usr/bin/env bash
# Builds the upstream control plane used by the e2e tests, from Go modules only:
#   etcd, kube-apiserver, kube-scheduler, kubelet-dm, kubelet-node, dra-standin   (e2e/upstream/k8s)
#   vc-scheduler, vc-controller-manager                (e2e/upstream/volcano)
#   helm-render                                        (e2e/upstream/helm-render)
#   nrt-scheduler, pod-fingerprint                     (e2e/upstream/nrt-scheduler)
# and copies Volcano's CRDs out of the module cache.
#
# Output goes to a cache keyed by the pinned versions and a hash of the k8s and volcano
# wrapper modules' sources:
#   ${FUMAROLE_UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fumarole/upstream}/<key>/{bin,crds/volcano}
# helm-render is built into the same bin/ in a separate step, stamped with a hash of its
# own module (helm-render.stamp), so editing it does not rebuild the control plane.
# nrt-scheduler (kube-scheduler with scheduler-plugins' NodeResourceTopologyMatch, on the k8s
# release that scheduler-plugins pins) and pod-fingerprint (podfingerprint's signature of a pod
# list) are built the same way, stamped with nrt-scheduler.stamp.
# Volcano releases other than the pinned one, one module each in e2e/upstream/volcano-v<m.n>/
# (vc-scheduler-fumarole is built against them by VOLCANO=<version> volcano-plugin/build.sh):
# their vc-controller-manager and CRDs go to volcano-<version>/{bin,crds} of the same cache,
# stamped with volcano-<version>.stamp (a hash of that module).
# A warm run (binaries and stamps present) builds nothing and takes well under a second.
#
# `--control-plane`: only the first group and Volcano's CRDs (what the demo runs), not
# helm-render, nrt-scheduler, pod-fingerprint or the other Volcano releases (tests only).
#
# The last line on stdout is always `FUMAROLE_UPSTREAM_DIR=<dir>`, so callers can
#   eval "$(e2e/build-upstream.sh | tail -n1)"; export FUMAROLE_UPSTREAM_DIR
# Everything else goes to stderr.
set -euo pipefail

control_plane_only=false
case "${1:-}" in
  "") ;;
  --control-plane) control_plane_only=true ;;
  *) echo "build-upstream: unknown argument '$1' (the only one is --control-plane)" >&2; exit 2 ;;
esac

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_MOD="$E2E_DIR/upstream/k8s"
VC_MOD="$E2E_DIR/upstream/volcano"
HR_MOD="$E2E_DIR/upstream/helm-render"
NRT_MOD="$E2E_DIR/upstream/nrt-scheduler"

need() { command -v "$1" >/dev/null 2>&1 || { echo "build-upstream: '$1' not found" >&2; exit 1; }; }
need go
need sha256sum

modver() { # modver <go.mod> <module path>
  awk -v m="$2" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$1"
}
K8S_VERSION="$(modver "$K8S_MOD/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(modver "$K8S_MOD/go.mod" go.etcd.io/etcd/server/v3)"
VC_VERSION="$(modver "$VC_MOD/go.mod" volcano.sh/volcano)"
for v in K8S_VERSION ETCD_VERSION VC_VERSION; do
  [[ -n "${!v}" ]] || { echo "build-upstream: could not read $v from go.mod" >&2; exit 1; }
done

SRC_HASH="$(cd "$E2E_DIR/upstream" && find ./k8s ./volcano -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"
GO_VERSION="$(go env GOVERSION)"
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_volcano-${VC_VERSION}_${GO_VERSION}_${SRC_HASH}"
CACHE_ROOT="${FUMAROLE_UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fumarole/upstream}"
OUT="$CACHE_ROOT/$KEY"
STAMP="$OUT/stamp"
BINS=(etcd kube-apiserver kube-scheduler kubelet-dm kubelet-node dra-standin vc-scheduler vc-controller-manager)

warm() {
  [[ -f "$STAMP" ]] || return 1
  local b
  for b in "${BINS[@]}"; do [[ -x "$OUT/bin/$b" ]] || return 1; done
  [[ -d "$OUT/crds/volcano" ]] || return 1
}

mkdir -p "$CACHE_ROOT"
# One builder at a time (tests may call this script concurrently).
exec 9>"$CACHE_ROOT/.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

if warm; then
  echo "build-upstream: warm cache $OUT" >&2
else
  start=$(date +%s)
  echo "build-upstream: building into $OUT (cold builds take a long while)" >&2
  rm -rf "$OUT.tmp"
  mkdir -p "$OUT.tmp/bin" "$OUT.tmp/crds/volcano"
  export CGO_ENABLED=0

  # Same ldflags as upstream's hack/lib/version.sh, so /version is right.
  k8s_minor="${K8S_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
  ldv=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldv+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    ldv+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done

  (
    cd "$K8S_MOD"
    go mod download
    echo "build-upstream: etcd $ETCD_VERSION, kubelet-dm, kubelet-node, dra-standin" >&2
    go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$OUT.tmp/bin/" ./cmd/etcd ./cmd/kubelet-dm ./cmd/kubelet-node ./cmd/dra-standin
    echo "build-upstream: kube-apiserver, kube-scheduler $K8S_VERSION" >&2
    go build -buildvcs=false -trimpath -ldflags "-s -w $ldv" -o "$OUT.tmp/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
  )
  (
    cd "$VC_MOD"
    go mod download
    vc_dir="$(go list -m -f '{{.Dir}}' volcano.sh/volcano)"
    vpkg=volcano.sh/volcano/pkg/version
    vld="-s -w -X $vpkg.GitSHA=$VC_VERSION -X $vpkg.Built=1970-01-01T00:00:00Z -X $vpkg.Version=$VC_VERSION"
    echo "build-upstream: vc-scheduler, vc-controller-manager $VC_VERSION" >&2
    go build -buildvcs=false -trimpath -ldflags "$vld" -o "$OUT.tmp/bin/vc-scheduler" volcano.sh/volcano/cmd/scheduler
    go build -buildvcs=false -trimpath -ldflags "$vld" -o "$OUT.tmp/bin/vc-controller-manager" volcano.sh/volcano/cmd/controller-manager
    cp "$vc_dir"/installer/helm/chart/volcano/crd/bases/*.yaml "$OUT.tmp/crds/volcano/"
    chmod -R u+w "$OUT.tmp/crds"
  )
  rm -rf "$OUT"
  mv "$OUT.tmp" "$OUT"
  {
    echo "key=$KEY"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(( $(date +%s) - start ))"
  } >"$STAMP"
  echo "build-upstream: built in $(( $(date +%s) - start ))s" >&2
fi

if $control_plane_only; then
  for b in "${BINS[@]}"; do echo "  $OUT/bin/$b" >&2; done
  echo "FUMAROLE_UPSTREAM_DIR=$OUT"
  exit 0
fi

# helm-render: its own stamp, so its edits never invalidate the control plane's key.
HR_HASH="$(cd "$HR_MOD" && find . -maxdepth 1 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"
HR_STAMP="$OUT/helm-render.stamp"
if [[ -x "$OUT/bin/helm-render" && "$(cat "$HR_STAMP" 2>/dev/null)" == "$HR_HASH" ]]; then
  echo "build-upstream: helm-render warm ($HR_HASH)" >&2
else
  start=$(date +%s)
  hr_ver="$(modver "$HR_MOD/go.mod" helm.sh/helm/v3)"
  echo "build-upstream: helm-render (helm.sh/helm/v3 $hr_ver, $HR_HASH)" >&2
  rm -f "$OUT/bin/helm-render.tmp"
  (
    cd "$HR_MOD"
    CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$OUT/bin/helm-render.tmp" .
  )
  mv -f "$OUT/bin/helm-render.tmp" "$OUT/bin/helm-render"
  echo "$HR_HASH" >"$HR_STAMP"
  echo "build-upstream: helm-render built in $(( $(date +%s) - start ))s" >&2
fi

# nrt-scheduler and pod-fingerprint: their own stamp, like helm-render.
NRT_HASH="$(cd "$NRT_MOD" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"
NRT_STAMP="$OUT/nrt-scheduler.stamp"
if [[ -x "$OUT/bin/nrt-scheduler" && -x "$OUT/bin/pod-fingerprint" && "$(cat "$NRT_STAMP" 2>/dev/null)" == "$NRT_HASH" ]]; then
  echo "build-upstream: nrt-scheduler warm ($NRT_HASH)" >&2
else
  start=$(date +%s)
  sp_ver="$(modver "$NRT_MOD/go.mod" sigs.k8s.io/scheduler-plugins)"
  nrt_k8s="$(modver "$NRT_MOD/go.mod" k8s.io/kubernetes)"
  nrt_minor="${nrt_k8s#v1.}"; nrt_minor="${nrt_minor%%.*}"
  nld=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    nld+=" -X $pkg.gitVersion=$nrt_k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$nrt_minor"
    nld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "build-upstream: nrt-scheduler (scheduler-plugins $sp_ver, k8s $nrt_k8s, $NRT_HASH)" >&2
  rm -f "$OUT/bin/nrt-scheduler.tmp" "$OUT/bin/pod-fingerprint.tmp"
  (
    cd "$NRT_MOD"
    go mod download
    CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "-s -w $nld" -o "$OUT/bin/nrt-scheduler.tmp" .
    CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$OUT/bin/pod-fingerprint.tmp" ./pod-fingerprint
  )
  mv -f "$OUT/bin/nrt-scheduler.tmp" "$OUT/bin/nrt-scheduler"
  mv -f "$OUT/bin/pod-fingerprint.tmp" "$OUT/bin/pod-fingerprint"
  echo "$NRT_HASH" >"$NRT_STAMP"
  echo "build-upstream: nrt-scheduler built in $(( $(date +%s) - start ))s" >&2
fi

# Other Volcano releases: their own stamps, like helm-render.
for rel_mod in "$E2E_DIR"/upstream/volcano-v*/; do
  [[ -f "$rel_mod/go.mod" ]] || continue
  rel_ver="$(modver "$rel_mod/go.mod" volcano.sh/volcano)"
  [[ -n $rel_ver ]] || { echo "build-upstream: no volcano.sh/volcano version in $rel_mod/go.mod" >&2; exit 1; }
  rel_out="$OUT/volcano-$rel_ver"
  rel_hash="$(cd "$rel_mod" && find . -maxdepth 1 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"
  rel_stamp="$OUT/volcano-$rel_ver.stamp"
  if [[ -x "$rel_out/bin/vc-controller-manager" && -d "$rel_out/crds" && "$(cat "$rel_stamp" 2>/dev/null)" == "$rel_hash" ]]; then
    echo "build-upstream: volcano $rel_ver warm ($rel_hash)" >&2
    continue
  fi
  start=$(date +%s)
  echo "build-upstream: vc-controller-manager $rel_ver and its CRDs ($rel_hash)" >&2
  rm -rf "$rel_out.tmp"
  mkdir -p "$rel_out.tmp/bin" "$rel_out.tmp/crds"
  (
    cd "$rel_mod"
    go mod download
    rel_dir="$(go list -m -f '{{.Dir}}' volcano.sh/volcano)"
    vpkg=volcano.sh/volcano/pkg/version
    CGO_ENABLED=0 go build -buildvcs=false -trimpath \
      -ldflags "-s -w -X $vpkg.GitSHA=$rel_ver -X $vpkg.Built=1970-01-01T00:00:00Z -X $vpkg.Version=$rel_ver" \
      -o "$rel_out.tmp/bin/vc-controller-manager" volcano.sh/volcano/cmd/controller-manager
    cp "$rel_dir"/installer/helm/chart/volcano/crd/bases/*.yaml "$rel_out.tmp/crds/"
    chmod -R u+w "$rel_out.tmp/crds"
  )
  rm -rf "$rel_out"
  mv "$rel_out.tmp" "$rel_out"
  echo "$rel_hash" >"$rel_stamp"
  echo "build-upstream: volcano $rel_ver built in $(( $(date +%s) - start ))s" >&2
done

for b in "${BINS[@]}" helm-render nrt-scheduler pod-fingerprint; do echo "  $OUT/bin/$b" >&2; done
echo "FUMAROLE_UPSTREAM_DIR=$OUT"
