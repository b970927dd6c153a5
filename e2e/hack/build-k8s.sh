#!/usr/bin/env bash
# Builds upstream Kubernetes binaries from the Go module proxy and caches them outside the
# repository. k8s.io/kubernetes cannot be `go install`ed because its go.mod points every
# staging module at v0.0.0 with local replace directives; a throwaway module that requires
# it and pins each staging module to the matching v0.X.Y release makes it buildable.
#
# Names: any k8s.io/kubernetes/cmd/<name> (kube-apiserver, kube-proxy, kubelet,
# kube-controller-manager, kube-scheduler, kubectl), plus `agnhost`
# (test/images/agnhost) and `e2e.test` (go test -c test/e2e).
# Binaries carry the version in k8s.io/component-base/version (as upstream's release
# builds do), so `kubectl version`, the e2e framework and the bench report see v1.37.0.
#
# usage: build-k8s.sh [binary ...]        (default: kube-apiserver)
# env:   K8S_VERSION (v1.37.0), NFTPROXY_CACHE (/var/cache/nftproxy)
# prints the path of each binary, one per line.
set -euo pipefail
ver=${K8S_VERSION:-v1.37.0}
cache=${NFTPROXY_CACHE:-/var/cache/nftproxy}
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(kube-apiserver)
staging="v0.${ver#v1.}"
# v2: binaries carry version ldflags (v1 had none and reported v0.0.0-master).
out="$cache/k8s-$ver-v2"
mkdir -p "$out"
# One build at a time: test packages run in parallel and may all ask for a binary.
exec 9>"$cache/.build-k8s.lock"
flock 9

need=()
for b in "${bins[@]}"; do [ -x "$out/$b" ] || need+=("$b"); done
if [ ${#need[@]} -gt 0 ]; then
  work="$cache/build-$ver"
  mkdir -p "$work"
  cd "$work"
  if [ ! -f go.mod ]; then
    go mod download -json "k8s.io/kubernetes@$ver" >/dev/null
    modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$ver.mod"
    {
      echo "module nftproxy.local/k8sbuild"
      echo
      grep -E '^go [0-9]' "$modfile"
      echo
      echo "require k8s.io/kubernetes $ver"
      echo
      echo "replace ("
      grep -oE '^\s+k8s.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk -v s="$staging" '{print "\t" $1 " => " $1 " " s}'
      echo ")"
    } > go.mod
    printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' > tools.go
    GOFLAGS=-mod=mod go mod tidy >&2
  fi
  minor=${ver#v1.}; minor=${minor%%.*}
  vpkg=k8s.io/component-base/version
  cpkg=k8s.io/client-go/pkg/version
  ld="-s -w"
  for p in $vpkg $cpkg; do
    ld+=" -X $p.gitVersion=$ver -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${need[@]}"; do
    echo "building $b $ver (minutes, cached in $out)" >&2
    case "$b" in
      agnhost)  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="$ld" -o "$out/$b.tmp" k8s.io/kubernetes/test/images/agnhost >&2 ;;
      e2e.test) CGO_ENABLED=0 GOFLAGS=-mod=mod go test -c -trimpath -ldflags="$ld" -o "$out/$b.tmp" k8s.io/kubernetes/test/e2e >&2 ;;
      *)        CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2 ;;
    esac
    mv "$out/$b.tmp" "$out/$b"
  done
fi
for b in "${bins[@]}"; do echo "$out/$b"; done
