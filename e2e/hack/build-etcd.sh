#!/usr/bin/env bash
# Builds upstream etcd from the Go module proxy and caches it outside the repository.
# The default version is the one kubeadm v1.37.0 deploys (constants.DefaultEtcdVersion,
# image etcd:3.7.0-0). etcd's own modules cannot be `go install`ed (their go.mod files
# point at each other with local replace directives), so a throwaway module requires
# go.etcd.io/etcd/server/v3 and its api/pkg/client siblings at the same version and
# builds a main that calls etcdmain.Main, which is all upstream's main.go does.
# The binary carries the release's version (go.etcd.io/etcd/api/v3/version), so
# `etcd --version`, the apiserver's storage version checks and the bench report see it.
#
# usage: build-etcd.sh
# env:   ETCD_VERSION (v3.7.0), NFTPROXY_CACHE (/var/cache/nftproxy)
# prints the path of the etcd binary.
set -euo pipefail
ver=${ETCD_VERSION:-v3.7.0}
cache=${NFTPROXY_CACHE:-/var/cache/nftproxy}
out="$cache/etcd-$ver"
mkdir -p "$out"
# One build at a time: test packages run in parallel and may all ask for the binary.
exec 9>"$cache/.build-etcd.lock"
flock 9

if [ ! -x "$out/etcd" ]; then
  work="$cache/build-etcd-$ver"
  mkdir -p "$work"
  cd "$work"
  if [ ! -f go.mod ]; then
    # The Go version etcd's server module asks for.
    go mod download -json "go.etcd.io/etcd/server/v3@$ver" >/dev/null
    modfile="$(go env GOMODCACHE)/cache/download/go.etcd.io/etcd/server/v3/@v/$ver.mod"
    {
      echo "module nftproxy.local/etcdbuild"
      echo
      grep -E '^go [0-9]' "$modfile"
      echo
      echo "require ("
      for m in server/v3 api/v3 client/pkg/v3 client/v3 pkg/v3; do
        echo "	go.etcd.io/etcd/$m $ver"
      done
      echo ")"
    } > go.mod
    printf '%s\n' 'package main' '' 'import (' '	"os"' '' \
      '	"go.etcd.io/etcd/server/v3/etcdmain"' ')' '' \
      'func main() { etcdmain.Main(os.Args) }' > main.go
    GOFLAGS=-mod=mod go mod tidy >&2
  fi
  echo "building etcd $ver (a minute or two, cached in $out)" >&2
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
    -ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ver" -o "$out/etcd.tmp" . >&2
  "$out/etcd.tmp" --version | grep -q "^etcd Version: ${ver#v}$" ||
    { echo "build-etcd.sh: $out/etcd.tmp does not report version ${ver#v}" >&2; exit 1; }
  mv "$out/etcd.tmp" "$out/etcd"
fi
echo "$out/etcd"
