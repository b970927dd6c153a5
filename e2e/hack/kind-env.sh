# Sourced by the kind-*.sh scripts: where the kind e2e keeps things. Nothing here touches
# the machine's own network namespace: docker runs in the network namespace $KIND_NETNS,
# and everything that talks to it (docker, kind, kubectl) runs there too (kind_exec).
KIND_VERSION=${KIND_VERSION:-v0.33.0}
K8S_VERSION=${K8S_VERSION:-v1.37.0}
NFTPROXY_CACHE=${NFTPROXY_CACHE:-/var/cache/nftproxy}
KIND_CACHE=$NFTPROXY_CACHE/kind                # built tools, images, docker's data root
KIND_NETNS=${KIND_NETNS:-nftproxy-kind}
KIND_RUN=/run/$KIND_NETNS                      # socket, pid file, exec root, state
KIND_BIN=$KIND_CACHE/bin                       # kind, crictl, the runc wrapper
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:$K8S_VERSION}
export DOCKER_HOST=unix://$KIND_RUN/docker.sock
export PATH=$KIND_BIN:$NFTPROXY_CACHE/k8s-$K8S_VERSION-v2:$PATH

kind_log() { echo "kind: $*" >&2; }
# kind_exec runs a command in the kind network namespace, where docker's bridges and the
# nodes' host-mapped ports are (nsenter, not ip netns exec, whose fresh /sys hides the
# cgroup mounts dockerd needs).
kind_exec() { nsenter --net="/run/netns/$KIND_NETNS" "$@"; }
