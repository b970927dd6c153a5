#!/usr/bin/env bash
# Builds the container images a registry-less test cluster needs, as OCI image-layout
# tarballs for `ctr -n k8s.io images import` (package e2e/ociimage writes them), and caches
# them in ${NFTPROXY_CACHE:-/var/cache/nftproxy}/images-v1. Rebuilds only what is missing.
#
#   registry.k8s.io/pause:3.10.2                    e2e/ociimage/cmd/pause, static
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1  agnhost on Debian bookworm (minbase) with
#                                                   curl, wget, nc, dig, ip, ping, ps, socat
#   registry.k8s.io/coredns/coredns:<tag>           CoreDNS at the tag v1.37's kubeadm uses,
#                                                   built from the Go module proxy
#   registry.k8s.io/kube-proxy:v1.37.0              kube-proxy on Debian bookworm with nft,
#                                                   iptables, conntrack, kmod
#
# Prints `<ref> <tarball>` per image on stdout; progress goes to stderr. Parallel callers
# wait for one another (flock). Debian root filesystems are cached as rootfs-*.tar.gz in
# the same directory (delete one to rebuild it). Needs root, go, debootstrap (installed
# with apt-get if missing) and network access to a Debian mirror and the Go module proxy.
# env: NFTPROXY_CACHE, DEBIAN_MIRROR (default: the bookworm mirror in /etc/apt)
set -Eeuo pipefail
cache=${NFTPROXY_CACHE:-/var/cache/nftproxy}
out="$cache/images-v1"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
k8s=v1.37.0
pause_ref=registry.k8s.io/pause:3.10.2
agnhost_ref=registry.k8s.io/e2e-test-images/agnhost:2.66.1
kube_proxy_ref=registry.k8s.io/kube-proxy:$k8s

log() { echo "build-images: $*" >&2; }
die() { log "error: $*"; exit 1; }
trap 'log "error: failed at line $LINENO: $BASH_COMMAND"' ERR

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

# Prints every line and exits when all images are there (the cached case).
print_if_done() {
  [ -s "$out/coredns.tag" ] || return 0
  local coredns_ref
  coredns_ref="registry.k8s.io/coredns/coredns:$(cat "$out/coredns.tag")"
  for f in pause agnhost coredns kube-proxy; do [ -s "$out/$f.tar" ] || return 0; done
  echo "$pause_ref $out/pause.tar"
  echo "$agnhost_ref $out/agnhost.tar"
  echo "$coredns_ref $out/coredns.tar"
  echo "$kube_proxy_ref $out/kube-proxy.tar"
  exit 0
}
print_if_done

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, and file owners in the root filesystems)"
command -v go >/dev/null || die "needs go"
start=$SECONDS
work=$(mktemp -d "$out/.work-XXXXXX")
# Unmount anything debootstrap may have left mounted (proc, sys, a bind-mounted /dev)
# before deleting, and never cross into another filesystem while deleting.
umount_under() {
  local m
  findmnt -rn -o TARGET | { grep -F "$1/" || true; } | sort -r | while read -r m; do
    umount "$m" || umount -l "$m"
  done
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  if [ -d "$work" ]; then
    umount_under "$work" || true
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT

log "building mkimage"
(cd "$repo" && go build -o "$work/mkimage" ./e2e/ociimage/cmd/mkimage) >&2
mkimage() { "$work/mkimage" "$@"; }

# --- pause ---------------------------------------------------------------------------
if [ ! -s "$out/pause.tar" ]; then
  log "pause: building"
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$work/pause" ./e2e/ociimage/cmd/pause) >&2
  # As upstream's image: /pause, user 65535:65535.
  mkimage -o "$out/pause.tar" -ref "$pause_ref" -file "/pause=$work/pause" \
    -entrypoint /pause -user 65535:65535
fi

# --- Debian root filesystems ------------------------------------------------------------
mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local m
  # deb822 (*.sources, or .list files holding deb822 as on this machine): the URIs of the
  # paragraph whose Suites name bookworm.
  m=$({ cat /etc/apt/sources.list.d/* /etc/apt/sources.list 2>/dev/null || true; } |
    awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ && u ~ /debian\/?$/ {print u; exit} /^$/ {u=""}')
  if [ -z "$m" ]; then
    m=$({ cat /etc/apt/sources.list.d/* /etc/apt/sources.list 2>/dev/null || true; } |
      awk '$1 == "deb" && $0 ~ / bookworm / {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}')
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

# rootfs NAME PACKAGES: a minimal bookworm with PACKAGES, cached as rootfs-NAME.tar.gz.
rootfs() {
  local name=$1 pkgs=$2 dir="$work/rootfs-$1" tgz="$out/rootfs-$1.tar.gz"
  [ -s "$tgz" ] && return 0
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2 ||
      { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2; }
  fi
  local m
  m=$(mirror)
  log "rootfs-$name: debootstrap bookworm minbase + $pkgs from $m (about 1.5 min)"
  if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$dir" "$m" >"$work/debootstrap-$name.log" 2>&1; then
    tail -20 "$work/debootstrap-$name.log" >&2
    die "debootstrap failed for rootfs-$name (log above)"
  fi
  umount_under "$dir"
  # Small: no package caches or lists, docs, man pages, locales, iconv modules (8 MB) or
  # leap-second time zones; no device nodes (the runtime mounts /dev), nothing of this
  # host (resolv.conf, hostname: the kubelet mounts its own).
  rm -rf --one-file-system "${dir:?}"/var/cache/apt/* "${dir:?}"/var/lib/apt/lists/* \
    "${dir:?}"/usr/share/doc/* "${dir:?}"/usr/share/man/* "${dir:?}"/usr/share/info/* \
    "${dir:?}"/usr/share/locale/* "${dir:?}"/var/cache/debconf/*-old "${dir:?}"/var/lib/dpkg/*-old \
    "${dir:?}"/usr/lib/x86_64-linux-gnu/gconv "${dir:?}"/usr/share/zoneinfo/right \
    "${dir:?}"/var/log/* "${dir:?}"/tmp/* "${dir:?}"/dev/*
  : >"$dir/etc/resolv.conf"
  echo localhost >"$dir/etc/hostname"
  if [ "$name" = agnhost ]; then
    # As upstream's agnhost image: user-defined-in-image (uid 1000) in group-defined-in-image
    # (gid 50000), used by an e2e test of SupplementalGroups.
    echo "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh" >>"$dir/etc/passwd"
    echo "user-defined-in-image:!:20000:0:99999:7:::" >>"$dir/etc/shadow"
    echo "user-defined-in-image:x:1000:" >>"$dir/etc/group"
    echo "group-defined-in-image:x:50000:user-defined-in-image" >>"$dir/etc/group"
    echo "user-defined-in-image:!::" >>"$dir/etc/gshadow"
    echo "group-defined-in-image:!::user-defined-in-image" >>"$dir/etc/gshadow"
    install -d -o 1000 -g 1000 -m 0755 "$dir/home/user-defined-in-image"
  fi
  tar --numeric-owner --one-file-system --xattrs --xattrs-include='security.capability' \
    --sort=name -C "$dir" -czf "$tgz.tmp" .
  mv "$tgz.tmp" "$tgz"
  rm -rf --one-file-system "$dir"
  log "rootfs-$name: $(du -h "$tgz" | cut -f1) compressed"
}

# --- agnhost -----------------------------------------------------------------------------
if [ ! -s "$out/agnhost.tar" ]; then
  rootfs agnhost curl,wget,netcat-openbsd,dnsutils,iproute2,iputils-ping,procps,socat
  log "agnhost: build-k8s.sh agnhost (waits for other Kubernetes builds)"
  agnhost=$("$repo/e2e/hack/build-k8s.sh" agnhost)
  [ -x "$agnhost" ] || die "build-k8s.sh agnhost gave no binary"
  src=$(cd /tmp && go mod download -json "k8s.io/kubernetes@$k8s" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  porter="$src/test/images/agnhost/porter"
  [ -f "$porter/localhost.crt" ] || die "no $porter/localhost.crt in the module cache"
  # Paths as upstream's image: /agnhost, /agnhost-2 -> agnhost, /uploads, porter's
  # certificate and key in /; ENTRYPOINT ["/agnhost"], CMD ["pause"].
  mkimage -o "$out/agnhost.tar" -ref "$agnhost_ref" -tar "$out/rootfs-agnhost.tar.gz" \
    -file "/agnhost=$agnhost" -link /agnhost-2=agnhost -mkdir /uploads:0755 \
    -file "/localhost.crt=$porter/localhost.crt" -file "/localhost.key=$porter/localhost.key" \
    -entrypoint /agnhost -cmd pause
fi

# --- kube-proxy ----------------------------------------------------------------------
if [ ! -s "$out/kube-proxy.tar" ]; then
  rootfs kube-proxy nftables,iptables,conntrack,kmod
  log "kube-proxy: build-k8s.sh kube-proxy"
  kp=$("$repo/e2e/hack/build-k8s.sh" kube-proxy)
  [ -x "$kp" ] || die "build-k8s.sh kube-proxy gave no binary"
  mkimage -o "$out/kube-proxy.tar" -ref "$kube_proxy_ref" -tar "$out/rootfs-kube-proxy.tar.gz" \
    -file "/usr/local/bin/kube-proxy=$kp" -entrypoint /usr/local/bin/kube-proxy
fi

# --- coredns -------------------------------------------------------------------------
if [ ! -s "$out/coredns.tar" ] || [ ! -s "$out/coredns.tag" ]; then
  src=$(cd /tmp && go mod download -json "k8s.io/kubernetes@$k8s" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  tag=$(sed -n 's/^\s*CoreDNSVersion\s*=\s*"\(v[0-9][0-9.]*\)".*/\1/p' "$src/cmd/kubeadm/app/constants/constants.go")
  [ -n "$tag" ] || die "no CoreDNSVersion in kubeadm's constants of k8s.io/kubernetes@$k8s"
  bdir="$cache/build-coredns-$tag"
  if [ ! -x "$bdir/coredns" ]; then
    log "coredns $tag: building from the Go module proxy (about 3 min, module in $bdir)"
    mkdir -p "$bdir"
    (
      cd "$bdir"
      if [ ! -f go.mod ]; then
        printf 'module nftproxy.local/corednsbuild\n\ngo 1.25\n' >go.mod
        printf 'package main\n\nimport _ "github.com/coredns/coredns/core/dnsserver"\n' >tools.go
        GOFLAGS=-mod=mod go get "github.com/coredns/coredns@$tag"
      fi
      CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o coredns.tmp github.com/coredns/coredns
      mv coredns.tmp coredns
    ) >&2
  fi
  # Upstream's image: /coredns as entrypoint, run as nonroot with a file capability to
  # bind port 53. Here user 0:0 instead: kubeadm's Deployment drops all capabilities but
  # NET_BIND_SERVICE, which root keeps and a non-root user only has with file capabilities.
  mkimage -o "$out/coredns.tar" -ref "registry.k8s.io/coredns/coredns:$tag" \
    -file "/coredns=$bdir/coredns" -mkdir /etc/coredns:0755 -entrypoint /coredns -user 0:0
  echo "$tag" >"$out/coredns.tag"
fi

log "built in $((SECONDS - start)) s"
print_if_done
die "an image is missing after the build"
