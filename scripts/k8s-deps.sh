#!/usr/bin/env bash
# A real single-node Kubernetes for the suite's deployment test (tests/deploy/test_k8s.py), from
# what package registries serve, no image registry needed (docs/deploy.md):
# - from Debian: etcd, containerd, runc and the CNI plugins (as root; otherwise it says which
#   are missing);
# - built from their Go modules, pinned: the control plane, the kubelet, kube-proxy and kubectl;
#   KEDA's operator and metrics adapter; CoreDNS.
# Kubernetes' module replaces its staging modules with ./staging, which `go install` refuses, so
# a small wrapper module requires it and points each staging module at its published version.
# Binaries go to DIR/bin (default .rollstream/k8s); the Makefile rebuilds when this file changes.
# Without Go it says so and exits 0: the Kubernetes tests then skip, naming what is missing.
set -euo pipefail

DIR="$(cd "$(dirname "$0")/.." && pwd)/${1:-.rollstream/k8s}"
K8S_VERSION=v1.37.2
KEDA_VERSION=v2.21.0  # as scripts/helm-deps.sh, whose CRDs the chart is validated against
COREDNS_VERSION=v1.14.7

note() { echo "k8s-deps: $*" >&2; }

missing=()
for tool in etcd containerd runc; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -x /usr/lib/cni/bridge ] || missing+=(cni)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            etcd-server containerd runc containernetworking-plugins conntrack iptables \
            || note "could not install ${missing[*]}: the Kubernetes tests skip"
    else
        note "missing ${missing[*]}: install etcd-server containerd runc containernetworking-plugins as root"
    fi
fi
if ! command -v go >/dev/null 2>&1; then
    note "go is missing: the Kubernetes tests skip (install Go 1.26 to build Kubernetes)"
    exit 0
fi
mkdir -p "$DIR/bin" "$DIR/src"

module_dir() {  # the module's directory in Go's module cache, downloaded if needed
    go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
}

# Kubernetes: the wrapper module, its staging modules at their published versions (v0.N.M for
# v1.N.M), and the version stamps `kubectl version` and the API server report.
k8s="$(module_dir "k8s.io/kubernetes@$K8S_VERSION")"
staging_version="v0.${K8S_VERSION#v1.}"
src="$DIR/src/kubernetes"
mkdir -p "$src"
{
    echo "module rollstream.local/kubernetes"
    echo
    echo "go $(sed -n 's/^go //p' "$k8s/go.mod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$staging_version"'#p' "$k8s/go.mod"
} >"$src/go.mod"
commands=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
{
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "${commands[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
} >"$src/tools.go"
(cd "$src" && go mod tidy >/dev/null)
minor="${K8S_VERSION#v1.}"
minor="${minor%%.*}"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
done
note "building Kubernetes $K8S_VERSION (${commands[*]})"
(cd "$src" && go build -trimpath -ldflags "-s -w$ldflags" -o "$DIR/bin/" \
    "${commands[@]/#/k8s.io/kubernetes/cmd/}")

# KEDA: its module has replace and exclude lines, so it is built inside a copy of itself.
keda_src="$DIR/src/keda-$KEDA_VERSION"
if [ ! -d "$keda_src" ]; then
    cp -r "$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")" "$keda_src.tmp"
    chmod -R u+w "$keda_src.tmp"
    mv "$keda_src.tmp" "$keda_src"
fi
note "building KEDA $KEDA_VERSION (operator, metrics adapter)"
(cd "$keda_src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$DIR/bin/keda-operator" ./cmd/operator \
    && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$DIR/bin/keda-adapter" ./cmd/adapter)
rm -rf "$DIR/keda-config"
cp -r "$keda_src/config" "$DIR/keda-config"
# KEDA's own manifests without its admission webhooks (config/minimal: CRDs, RBAC, the operator
# and the metrics adapter), on an image built on the node (tests/helpers/k8s_cluster.py):
# `kubectl apply --server-side -k .rollstream/k8s/keda`.
mkdir -p "$DIR/keda"
cat >"$DIR/keda/kustomization.yaml" <<KUSTOMIZE
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../keda-config/minimal]
images:
  - {name: ghcr.io/kedacore/keda, newName: rollstream/keda, newTag: local}
  - {name: ghcr.io/kedacore/keda-metrics-apiserver, newName: rollstream/keda, newTag: local}
patches:  # the image is on the node: never pulled
  - target: {kind: Deployment, namespace: keda}
    patch: '[{"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "IfNotPresent"}]'
KUSTOMIZE

note "building CoreDNS $COREDNS_VERSION"
CGO_ENABLED=0 GOBIN="$DIR/bin" go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
note "built: $(ls "$DIR/bin" | tr '\n' ' ')"
