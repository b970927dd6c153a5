#!/usr/bin/env bash
# Installs what the tests and the demo need on a Debian machine (run as root): nft,
# iproute2, etcd, conntrack and iptables (kube-proxy in e2e/bench) from Debian,
# staticcheck from the Go module proxy. The kube-apiserver is built (and cached) by
# build-k8s.sh when the e2e suite first needs it.
set -euo pipefail
need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
command -v etcd >/dev/null || need+=(etcd-server)
command -v conntrack >/dev/null || need+=(conntrack)
command -v iptables >/dev/null || need+=(iptables)
command -v unshare >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# etcd-server's package may start a system etcd; our tests start their own, in their own
# network namespace, so it is not needed.
bin="$(cd "$(dirname "$0")/../.." && pwd)/bin"
mkdir -p "$bin"
if [ ! -x "$bin/staticcheck" ]; then
  GOBIN="$bin" go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
