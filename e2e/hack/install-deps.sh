#!/usr/bin/env bash
# Installs what the tests and the demo need on a Debian machine (run as root): nft,
# iproute2, conntrack and iptables (kube-proxy in e2e/bench), containerd, runc,
# CNI plugins and debootstrap (the real kubelet cluster) from Debian,
# staticcheck, helm and promtool from the Go module proxy. The kube-apiserver and etcd are
# built (and cached) by build-k8s.sh and build-etcd.sh when the e2e suite first needs them.
set -euo pipefail
need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
command -v conntrack >/dev/null || need+=(conntrack)
command -v iptables >/dev/null || need+=(iptables)
command -v unshare >/dev/null || need+=(util-linux)
# The real kubelet cluster (e2e/realcluster) and the image builder (e2e/ociimage,
# e2e/hack/build-images.sh): containerd and runc per node, CNI plugins, a Debian rootfs.
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v debootstrap >/dev/null || need+=(debootstrap)
# Only with KERNELS_DEPS=1: qemu and a static busybox for `make kernels` (which installs
# them itself when missing; `make test` does not need them).
if [ "${KERNELS_DEPS:-}" = 1 ]; then
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || need+=(busybox-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
bin="$(cd "$(dirname "$0")/../.." && pwd)/bin"
mkdir -p "$bin"
if [ ! -x "$bin/staticcheck" ]; then
  GOBIN="$bin" go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
# helm and promtool, built from the Go module proxy (the chart's tests, make chart-test).
"$(dirname "$0")/install-tools.sh"
