#!/bin/bash
# Runs as the first process of a `make kernels` guest (e2e/hack/kernels.sh), on the
# host's root shared read-only, with the results share at /run/results. Runs each test
# binary of run.env there with NFTPROXY_KERNEL_TESTS=1, from its package's directory,
# and writes <name>.log and <name>.rc per package, summary.txt (one line per top-level
# test: PASS|FAIL|SKIP <package> <test> <seconds>), failed-packages, dmesg.txt and
# last status (0 when every package passed), then powers off.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp LANG=C
res=/run/results
# shellcheck source=/dev/null
. "$res/run.env"
exec >>"$res/guest.log" 2>&1
for kv in "${GUEST_ENV[@]}"; do export "${kv?}"; done # KERNELS_ENV
echo "guest: $(uname -r), $(nproc) CPU, $(awk '/MemTotal/ { print $2 " kB" }' /proc/meminfo)"
# nf_tables and the rest load on demand through the guest kernel's modules.
printf '#!/bin/sh\nexec /bin/busybox modprobe "$@"\n' >/run/modprobe
chmod +x /run/modprobe
echo /run/modprobe >/proc/sys/kernel/modprobe
mkdir -p /run/netns
hostname kernels-guest 2>/dev/null || true
ip link set lo up

start=$(date +%s)
status=0
: >"$res/summary.txt"
: >"$res/failed-packages"
for t in "${TESTS[@]}"; do
  read -r name pkg bin run <<<"$t"
  left=$((TIMEOUT - ($(date +%s) - start) - 30))
  if [ "$left" -lt 30 ]; then
    echo "guest: no time left for $pkg"
    echo "$pkg" >>"$res/failed-packages"
    status=1
    continue
  fi
  args=(-test.v -test.count=1 -test.timeout="${left}s")
  [ "$run" = - ] || args+=(-test.run="$run")
  [ -z "$SKIP" ] || args+=(-test.skip="$SKIP")
  echo "guest: $pkg (at most ${left}s)"
  t0=$(date +%s)
  (cd "$REPO/$pkg" && NFTPROXY_KERNEL_TESTS=1 "$bin" "${args[@]}") >"$res/$name.log" 2>&1
  rc=$?
  echo "$rc" >"$res/$name.rc"
  echo "guest: $pkg exit $rc in $(($(date +%s) - t0))s"
  awk -v pkg="$pkg" '/^--- (PASS|FAIL|SKIP): / { d = $4; gsub(/[()s]/, "", d); print $2, pkg, $3, d }' "$res/$name.log" |
    sed 's/^\(PASS\|FAIL\|SKIP\):/\1/' >>"$res/summary.txt"
  if [ "$rc" != 0 ]; then
    status=1
    echo "$pkg" >>"$res/failed-packages"
  fi
done
dmesg >"$res/dmesg.txt" 2>&1
echo "$status" >"$res/status"
sync
busybox poweroff -f
