#!/usr/bin/env bash
# Starts or stops a dockerd of the kind e2e's own, inside a network namespace of its own
# and a private mount namespace, with its own data root, exec root, socket and pid file:
# docker0, the kind network's bridge and docker's iptables rules exist only in that
# namespace, and nothing is left in the machine's own one.
#
#   kind-docker.sh start     (idempotent; prints the DOCKER_HOST to use)
#   kind-docker.sh stop      (stops dockerd by its pid, deletes the namespace)
#
# dockerd runs with --oom-score-adjust=0 (its default, -500, needs CAP_SYS_RESOURCE) and
# with a runc wrapper as default runtime that drops CAP_SYS_RESOURCE from every
# container's capabilities: `docker run --privileged` (kind's nodes) asks for every
# capability the kernel knows, and runc fails where the bounding set lacks one. On a
# machine with the full bounding set the wrapper changes nothing.
set -Eeuo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kind-env.sh"
cmd=${1:?usage: kind-docker.sh start|stop}

write_runc_wrapper() {
  mkdir -p "$KIND_BIN"
  local runc
  runc=$(command -v runc) || { kind_log "no runc (apt-get install runc)"; exit 1; }
  cat >"$KIND_BIN/runc-nocap.tmp" <<WRAP
#!/bin/sh
# runc, without CAP_SYS_RESOURCE in what a container asks for (written by kind-docker.sh).
drop() { # drop FILE JQPATH: remove the capability from every list under JQPATH
  [ -f "\$1" ] || return 0
  jq "\$2 |= (if . == null then . else with_entries(.value |= map(select(. != \"CAP_SYS_RESOURCE\"))) end)" "\$1" >"\$1.nocap" && mv "\$1.nocap" "\$1"
}
bundle=. process= sub=
prev=
for a in "\$@"; do
  case "\$prev" in --bundle|-b) bundle=\$a ;; --process|-p) process=\$a ;; esac
  case "\$a" in --bundle=*) bundle=\${a#--bundle=} ;; --process=*) process=\${a#--process=} ;; esac
  case "\$a" in create|run|exec) [ -z "\$sub" ] && sub=\$a ;; esac
  prev=\$a
done
case "\$sub" in
  create|run) drop "\$bundle/config.json" .process.capabilities ;;
  exec) [ -n "\$process" ] && drop "\$process" .capabilities ;;
esac
exec $runc "\$@"
WRAP
  chmod 755 "$KIND_BIN/runc-nocap.tmp"
  mv "$KIND_BIN/runc-nocap.tmp" "$KIND_BIN/runc-nocap"
}

running() { [ -f "$KIND_RUN/docker.pid" ] && kill -0 "$(cat "$KIND_RUN/docker.pid")" 2>/dev/null; }

case "$cmd" in
start)
  command -v dockerd >/dev/null || { kind_log "no dockerd: apt-get install docker.io"; exit 1; }
  if running && docker version >/dev/null 2>&1; then echo "$DOCKER_HOST"; exit 0; fi
  write_runc_wrapper
  mkdir -p "$KIND_RUN" "$KIND_CACHE/docker"
  [ -e "/run/netns/$KIND_NETNS" ] || ip netns add "$KIND_NETNS"
  kind_exec ip link set lo up
  # setsid + nohup: dockerd outlives this script; its pid file is how stop finds it.
  setsid nohup unshare -m --propagation private \
    nsenter --net="/run/netns/$KIND_NETNS" dockerd \
      --data-root "$KIND_CACHE/docker" --exec-root "$KIND_RUN/exec" \
      -H "$DOCKER_HOST" --pidfile "$KIND_RUN/docker.pid" \
      --oom-score-adjust=0 \
      --add-runtime "nocap=$KIND_BIN/runc-nocap" --default-runtime nocap \
      --log-level warn \
      >"$KIND_RUN/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    if docker version >/dev/null 2>&1; then echo "$DOCKER_HOST"; exit 0; fi
    sleep 0.5
  done
  kind_log "dockerd did not come up in 60s:"; tail -n 30 "$KIND_RUN/dockerd.log" >&2; exit 1
  ;;
stop)
  if running; then
    pid=$(cat "$KIND_RUN/docker.pid")
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { kind_log "dockerd $pid still running after 30s: SIGKILL"; kill -9 "$pid"; }
  fi
  # dockerd's containerd and shims are gone with it; a shim left over would keep the
  # namespace busy, so report it rather than guess.
  [ -e "/run/netns/$KIND_NETNS" ] && ip netns delete "$KIND_NETNS"
  rm -rf "$KIND_RUN"
  ;;
*) echo "usage: kind-docker.sh start|stop" >&2; exit 2 ;;
esac
