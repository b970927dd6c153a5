#!/usr/bin/env bash
# Builds upstream Kubernetes binaries (kube-apiserver, optionally kube-proxy) from the Go
# module proxy and caches them outside the repository. k8s.io/kubernetes cannot be
# `go install`ed because its go.mod points every staging module at v0.0.0 with local
# replace directives; a throwaway module that requires it and pins each staging module to
# the matching v0.X.Y release makes it buildable.
#
# usage: build-k8s.sh [binary ...]        (default: kube-apiserver)
# env:   K8S_VERSION (v1.37.0), NFTPROXY_CACHE (/var/cache/nftproxy)
# prints the path of each binary, one per line.
set -euo pipefail
ver=${K8S_VERSION:-v1.37.0}
cache=${NFTPROXY_CACHE:-/var/cache/nftproxy}
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(kube-apiserver)
staging="v0.${ver#v1.}"
out="$cache/k8s-$ver"
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
  for b in "${need[@]}"; do
    echo "building $b $ver (several minutes, cached in $out)" >&2
    CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2
    mv "$out/$b.tmp" "$out/$b"
  done
fi
for b in "${bins[@]}"; do echo "$out/$b"; done
