#!/usr/bin/env bash
# Builds everything a kind cluster needs on a machine without a registry and without
# internet, from the Go module proxy and Debian's packages, and caches it under
# $NFTPROXY_CACHE/kind (kind-env.sh):
#   bin/kind, bin/crictl                     sigs.k8s.io/kind, sigs.k8s.io/cri-tools
#   the base image nftproxy.local/kind-base  debootstrap (trixie): systemd, Debian's
#                                            containerd, runc, CNI plugins, nftables 1.1.3,
#                                            kind's own files from the kind module
#   the node image $KIND_NODE_IMAGE          `kind build node-image --type file` from a
#                                            Kubernetes server tarball assembled here
# The server tarball carries the Kubernetes binaries of build-k8s.sh and image archives
# of kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy; kind reads
# only those four archives, so the other images kubeadm and kind need (etcd, pause,
# CoreDNS, kindnetd, local-path-provisioner and its helper) ride inside kube-proxy.tar.
#
# kindnetd is not on the module proxy (a nested module of kind's repository): set KIND_SRC
# to a git checkout of kubernetes-sigs/kind; kindnetd is built from its v0.31.0 tag (the
# later tags need a kube-network-policies the proxy does not serve).
#
# Needs a running docker (kind-docker.sh start). Cold: tens of minutes (the Kubernetes
# binaries dominate); warm: seconds. Prints the node image's name.
set -Eeuo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
. "$here/kind-env.sh"
trap 'kind_log "error: failed at line $LINENO: $BASH_COMMAND"' ERR

ETCD_VERSION=${ETCD_VERSION:-v3.7.0}         # kubeadm v1.37's DefaultEtcdVersion 3.7.0-0
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.6}  # kubeadm v1.37's CoreDNSVersion
KINDNETD_REF=${KINDNETD_REF:-v0.31.0}
LPP_VERSION=${LPP_VERSION:-v0.0.30}          # rancher/local-path-provisioner
CRICTL_VERSION=${CRICTL_VERSION:-$K8S_VERSION}
DEBIAN_SUITE=${DEBIAN_SUITE:-trixie}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
out=$KIND_CACHE/build
mkdir -p "$KIND_BIN" "$out"
exec 9>"$KIND_CACHE/.kind-images.lock"
flock 9
export CGO_ENABLED=0 GOFLAGS=-mod=mod

kind_src=$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r .Dir)

# --- tools -------------------------------------------------------------------------------
[ -x "$KIND_BIN/kind" ] && "$KIND_BIN/kind" version | grep -q "$KIND_VERSION" ||
  { kind_log "building kind $KIND_VERSION"; GOBIN=$KIND_BIN go install "sigs.k8s.io/kind@$KIND_VERSION"; }
[ -x "$KIND_BIN/crictl" ] ||
  { kind_log "building crictl $CRICTL_VERSION"; GOBIN=$KIND_BIN go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"; }

# --- the base image ----------------------------------------------------------------------
rootfs=$KIND_CACHE/base/rootfs-$DEBIAN_SUITE
if [ ! -d "$rootfs" ]; then
  kind_log "debootstrap $DEBIAN_SUITE (minutes)"
  mkdir -p "$KIND_CACHE/base"; rm -rf "$rootfs.tmp"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins \
    "$DEBIAN_SUITE" "$rootfs.tmp" "$DEBIAN_MIRROR" >&2
  mv "$rootfs.tmp" "$rootfs"
fi
# The image's tag names everything it is made of, so that a change rebuilds it.
base_sum=$( (sed -n '/^# --- the base image/,/^# --- the Go-built/p' "$0"; cat "$KIND_BIN/crictl"; ls -l --time-style=+%s "$rootfs/var/lib/dpkg/status"; echo "$kind_src") | sha256sum | cut -c1-12)
base_image=nftproxy.local/kind-base:$DEBIAN_SUITE-$base_sum
if ! docker image inspect "$base_image" >/dev/null 2>&1; then
  kind_log "assembling $base_image"
  w=$KIND_CACHE/base/work; rm -rf "$w"; cp -a "$rootfs" "$w"
  f=$kind_src/images/base/files
  install -d -m 0755 "$w/kind" "$w/kind/bin" "$w/etc/containerd" "$w/etc/systemd/system/kubelet.service.d" "$w/opt/cni/bin" "$w/etc/kubernetes/manifests"
  install -m 0755 "$f"/usr/local/bin/* "$w/usr/local/bin/"
  install -m 0644 "$f"/kind/README.txt "$w/kind/"
  install -m 0755 "$f"/kind/bin/* "$w/kind/bin/"
  install -m 0644 "$f"/etc/crictl.yaml "$w/etc/"
  install -m 0644 "$f"/etc/containerd/config.toml "$w/etc/containerd/"
  install -m 0644 "$f"/etc/default/* "$w/etc/default/"
  install -m 0644 "$f"/etc/sysctl.d/* "$w/etc/sysctl.d/"
  install -m 0644 "$f"/etc/systemd/system/*.service "$f"/etc/systemd/system/*.slice "$w/etc/systemd/system/"
  install -m 0644 "$f"/etc/systemd/system/kubelet.service.d/* "$w/etc/systemd/system/kubelet.service.d/"
  # Debian's containerd, runc and CNI plugins where kind's files look for them.
  sed -i 's#^ExecStart=/usr/local/bin/containerd#ExecStart=/usr/bin/containerd#' "$w/etc/systemd/system/containerd.service"
  # A negative OOM score needs CAP_SYS_RESOURCE, which the nodes do not get here.
  sed -i '/^OOMScoreAdjust=/d' "$w/etc/systemd/system/containerd.service"
  for p in host-local loopback ptp portmap bridge; do ln -sf "/usr/lib/cni/$p" "$w/opt/cni/bin/$p"; done
  # the fuse-overlayfs snapshotter is for rootless kind; this image does not have it
  rm -f "$w/etc/systemd/system/containerd-fuse-overlayfs.service"
  install -m 0755 "$KIND_BIN/crictl" "$w/usr/local/bin/crictl"
  # ctr 1.7 has no `images import --label`, which `kind build node-image` passes: the
  # wrapper imports without it, then labels every image as kind would (pinned: the
  # kubelet's image garbage collection leaves it).
  mv "$w/usr/bin/ctr" "$w/usr/bin/ctr.real"
  cat >"$w/usr/bin/ctr" <<'CTR'
#!/bin/sh
# ctr, accepting `images import --label=K=V` (containerd 1.7's ctr lacks it).
label=
import=
for a in "$@"; do case "$a" in import) import=1 ;; --label=*) label=${a#--label=} ;; esac; done
[ -n "$import" ] && [ -n "$label" ] || exec /usr/bin/ctr.real "$@"
ns=k8s.io
for a in "$@"; do case "$a" in --namespace=*|-n=*) ns=${a#*=} ;; esac; done
args=
for a in "$@"; do case "$a" in --label=*) ;; *) args="$args '$(printf %s "$a" | sed "s/'/'\\\\''/g")'" ;; esac; done
eval "/usr/bin/ctr.real $args" || exit
for i in $(/usr/bin/ctr.real -n "$ns" images ls -q); do /usr/bin/ctr.real -n "$ns" images label "$i" "$label" >/dev/null; done
CTR
  chmod 755 "$w/usr/bin/ctr"
  chroot "$w" /usr/bin/ctr.real oci spec |
    jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
    jq 'del(.process.rlimits)' >"$w/etc/containerd/cri-base.json"
  # the RUN steps of kind's images/base/Dockerfile
  find "$w/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
  rm -f "$w"/lib/systemd/system/multi-user.target.wants/* "$w"/etc/systemd/system/*.wants/* \
    "$w"/lib/systemd/system/local-fs.target.wants/* "$w"/lib/systemd/system/sockets.target.wants/*udev* \
    "$w"/lib/systemd/system/sockets.target.wants/*initctl* "$w"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"$w/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$w/sbin/init"
  systemctl --root="$w" enable kubelet.service containerd.service undo-mount-hacks.service >&2
  systemctl --root="$w" mask systemd-binfmt.service >&2
  rm -rf "$w"/var/lib/apt/lists/* "$w"/var/cache/apt/* "$w"/usr/share/doc/* "$w"/usr/share/man/*
  tar -C "$w" --numeric-owner -c . | docker import - "$base_image-rootfs" >&2
  rm -rf "$w"
  # docker import cannot set STOPSIGNAL; the legacy builder, with no context, can.
  printf '%s\n' "FROM $base_image-rootfs" 'ENV container=docker' 'STOPSIGNAL SIGRTMIN+3' \
    'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' |
    DOCKER_BUILDKIT=0 docker build -q -t "$base_image" - >&2
  docker rmi "$base_image-rootfs" >/dev/null
  for old in $(docker images --format '{{.Repository}}:{{.Tag}}' nftproxy.local/kind-base); do
    [ "$old" = "$base_image" ] || docker rmi "$old" >/dev/null || true
  done
fi

# --- the Go-built binaries of the images ---------------------------------------------------
# gobuild OUT DIR PKG [ldflags]: go build PKG in the throwaway module DIR (go.mod written
# by the caller), static and stripped.
gobuild() {
  local o=$1 d=$2 p=$3 ld=${4:-}
  (cd "$d" && go mod tidy >&2 && go build -trimpath -ldflags="-s -w $ld" -o "$o.tmp" "$p") && mv "$o.tmp" "$o"
}

# etcd: e2e/hack/build-etcd.sh when the tree has it, else the same from the module proxy
# (etcd's modules replace each other with ../ paths: a module that requires the server and
# pins its siblings to the same release builds it).
etcd_bin=$out/etcd-$ETCD_VERSION
if [ ! -x "$etcd_bin" ]; then
  if [ -x "$here/build-etcd.sh" ]; then
    cp "$(ETCD_VERSION=$ETCD_VERSION "$here/build-etcd.sh" | tail -n 1)" "$etcd_bin"
  else
    kind_log "building etcd $ETCD_VERSION"
    d=$out/src-etcd-$ETCD_VERSION; mkdir -p "$d"
    cat >"$d/go.mod" <<MOD
module nftproxy.local/etcdbuild

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
MOD
    printf 'package main\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' >"$d/tools.go"
    gobuild "$etcd_bin" "$d" go.etcd.io/etcd/server/v3
  fi
fi

coredns_bin=$out/coredns-$COREDNS_VERSION
if [ ! -x "$coredns_bin" ]; then
  kind_log "building coredns $COREDNS_VERSION"
  d=$out/src-coredns-$COREDNS_VERSION; mkdir -p "$d"
  printf 'module nftproxy.local/corednsbuild\n\ngo 1.26\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" >"$d/go.mod"
  printf 'package main\n\nimport _ "github.com/coredns/coredns/coremain"\n' >"$d/tools.go"
  gobuild "$coredns_bin" "$d" github.com/coredns/coredns
fi

lpp_bin=$out/local-path-provisioner-$LPP_VERSION
if [ ! -x "$lpp_bin" ]; then
  kind_log "building local-path-provisioner $LPP_VERSION"
  d=$out/src-lpp-$LPP_VERSION; rm -rf "$d"; mkdir -p "$d"
  GOBIN=$d go install -trimpath -ldflags="-s -w" "github.com/rancher/local-path-provisioner@$LPP_VERSION"
  mv "$d/local-path-provisioner" "$lpp_bin"
fi

kindnetd_bin=$out/kindnetd-$KINDNETD_REF
if [ ! -x "$kindnetd_bin" ]; then
  [ -n "${KIND_SRC:-}" ] || { kind_log "KIND_SRC: a git checkout of kubernetes-sigs/kind is needed to build kindnetd (not on the module proxy)"; exit 1; }
  kind_log "building kindnetd from $KIND_SRC at $KINDNETD_REF"
  d=$out/src-kindnetd-$KINDNETD_REF; rm -rf "$d"; mkdir -p "$d"
  git -C "$KIND_SRC" archive "$KINDNETD_REF" images/kindnetd | tar -C "$d" -x
  (cd "$d/images/kindnetd" && go build -trimpath -ldflags="-s -w" -o "$kindnetd_bin.tmp" ./cmd/kindnetd) && mv "$kindnetd_bin.tmp" "$kindnetd_bin"
fi

pause_bin=$out/pause
[ -x "$pause_bin" ] || (cd "$repo" && go build -trimpath -ldflags="-s -w" -o "$pause_bin" ./e2e/kind/pause)

# --- component images --------------------------------------------------------------------
# binimage NAME BIN=NAME... : an image of static binaries in /usr/local/bin (plus passwd,
# group, tmp), from nothing; the first one is the entrypoint.
binimage() {
  local name=$1; shift
  docker image inspect "$name" >/dev/null 2>&1 && return 0
  local d; d=$(mktemp -d "$KIND_CACHE/img.XXXXXX")
  install -d "$d/usr/local/bin" "$d/etc" "$d/tmp" "$d/var/run"
  chmod 1777 "$d/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$d/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$d/etc/group"
  local b
  for b in "$@"; do install -m 0755 "${b%%=*}" "$d/usr/local/bin/${b##*=}"; done
  local entry=${1##*=}
  tar -C "$d" --numeric-owner -c . | docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change "ENTRYPOINT [\"/usr/local/bin/$entry\"]" - "$name" >&2
  rm -rf "$d"
}
# stageimage NAME ENTRY FILE... : an image of files of the base root file system with the
# shared libraries they load (ldd there); SRC=DEST copies a file from outside it,
# @LINK=TARGET makes a symbolic link. ENTRY: the entrypoint ("" for none).
stageimage() {
  local name=$1 entry=$2; shift 2
  docker image inspect "$name" >/dev/null 2>&1 && return 0
  local d f l; d=$(mktemp -d "$KIND_CACHE/img.XXXXXX")
  install -d "$d/usr/bin" "$d/usr/sbin" "$d/usr/lib" "$d/usr/lib64" "$d/etc" "$d/tmp" "$d/run"
  chmod 1777 "$d/tmp"
  ln -s usr/bin "$d/bin"; ln -s usr/sbin "$d/sbin"; ln -s usr/lib "$d/lib"; ln -s usr/lib64 "$d/lib64"
  printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$d/etc/passwd"; printf 'root:x:0:\n' >"$d/etc/group"
  for f in "$@"; do
    case "$f" in
      @*) f=${f#@}; ln -sf "${f##*=}" "$d${f%%=*}" ;;
      *=*) install -D -m 0755 "${f%%=*}" "$d${f##*=}" ;;
      *) for l in "$f" $(chroot "$rootfs" ldd "$f" 2>/dev/null | grep -oE '/[^ ]+'); do
           [ -e "$d$l" ] || install -D "$rootfs$l" "$d$l"
         done ;;
    esac
  done
  local change=()
  [ -z "$entry" ] || change=(--change "ENTRYPOINT [\"$entry\"]")
  tar -C "$d" --numeric-owner -c . | docker import --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' "${change[@]}" - "$name" >&2
  rm -rf "$d"
}
reg=registry.k8s.io
binimage "$reg/etcd:${ETCD_VERSION#v}-0" "$etcd_bin=etcd"
binimage "$reg/coredns/coredns:$COREDNS_VERSION" "$coredns_bin=coredns"
# kind's manifests name their own tags; the images are what this script built.
kindnetd_image=$(sed -n 's/^const kindnetdImage = "\(.*\)"$/\1/p' "$kind_src/pkg/build/nodeimage/const_cni.go")
lpp_image=$(sed -n 's/^const storageProvisionerImage = "\(.*\)"$/\1/p' "$kind_src/pkg/build/nodeimage/const_storage.go")
helper_image=$(sed -n 's/^const storageHelperImage = "\(.*\)"$/\1/p' "$kind_src/pkg/build/nodeimage/const_storage.go")
pause_image=$(sed -n 's/^ *sandbox_image = "\(.*\)"$/\1/p' "$kind_src/images/base/files/etc/containerd/config.toml")
binimage "$lpp_image" "$lpp_bin=local-path-provisioner"
binimage "$pause_image" "$pause_bin=pause"
# kindnetd (kind v0.31.0's) runs iptables for its masquerade rules, as its distroless-iptables
# base has them: here the nft back end, the node's. The helper runs sh, mkdir and rm.
xt=$(cd "$rootfs" && ls usr/lib/x86_64-linux-gnu/xtables/*.so)
stageimage "$kindnetd_image" /usr/local/bin/kindnetd "$kindnetd_bin=/usr/local/bin/kindnetd" \
  /usr/sbin/xtables-nft-multi $(for x in $xt; do echo "/$x"; done) \
  @/usr/sbin/iptables=xtables-nft-multi @/usr/sbin/iptables-save=xtables-nft-multi \
  @/usr/sbin/iptables-restore=xtables-nft-multi @/usr/sbin/ip6tables=xtables-nft-multi \
  @/usr/sbin/ip6tables-save=xtables-nft-multi @/usr/sbin/ip6tables-restore=xtables-nft-multi
stageimage "$helper_image" "" /usr/bin/bash /usr/bin/mkdir /usr/bin/rm @/usr/bin/sh=bash

# --- the Kubernetes binaries -------------------------------------------------------------
k8s_bins=(kubeadm kubelet kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
k8s_dir=$(dirname "$("$here/build-k8s.sh" "${k8s_bins[@]}" | tail -n 1)")
for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
  binimage "$reg/$b:$K8S_VERSION" "$k8s_dir/$b=$b"
done

# --- the server tarball and the node image -----------------------------------------------
# Docker keeps every image it has built here; `kind build node-image` runs only when the
# node image is missing (delete it, `docker rmi $KIND_NODE_IMAGE`, to rebuild).
if ! docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1; then
  kind_log "building $KIND_NODE_IMAGE"
  t=$(mktemp -d "$KIND_CACHE/server.XXXXXX")
  sb=$t/kubernetes/server/bin
  mkdir -p "$sb"
  echo "$K8S_VERSION" >"$t/kubernetes/version"
  for b in kubeadm kubelet kubectl; do cp "$k8s_dir/$b" "$sb/"; done
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    docker save -o "$sb/$b.tar" "$reg/$b:$K8S_VERSION"
  done
  # kind takes an archive's tags from whichever of manifest.json (its first image only)
  # and repositories (all of them) comes first: repositories goes first.
  x=$t/kube-proxy; mkdir "$x"
  docker save "$reg/kube-proxy:$K8S_VERSION" \
    "$reg/etcd:${ETCD_VERSION#v}-0" "$reg/coredns/coredns:$COREDNS_VERSION" \
    "$kindnetd_image" "$lpp_image" "$helper_image" "$pause_image" | tar -C "$x" -x
  # docker writes Docker Hub names short (kindest/kindnetd); kind compares them with the
  # full ones of its manifests (docker.io/kindest/kindnetd).
  jq 'with_entries(if (.key | split("/")[0] | test("[.:]")) then . else .key = "docker.io/" + .key end)' \
    "$x/repositories" >"$x/repositories.full"
  mv "$x/repositories.full" "$x/repositories"
  (cd "$x" && tar -cf "$sb/kube-proxy.tar" repositories $(ls -A | grep -vx repositories))
  rm -rf "$x"
  tar -C "$t" -czf "$t/kubernetes-server-linux-amd64.tar.gz" kubernetes
  kind build node-image --type file "$t/kubernetes-server-linux-amd64.tar.gz" \
    --base-image "$base_image" --image "$KIND_NODE_IMAGE" >&2
  rm -rf "$t"
fi
echo "$KIND_NODE_IMAGE"
