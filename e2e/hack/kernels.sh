#!/usr/bin/env bash
# make kernels: nftproxy's nf_tables kernel tests and a packet test in Debian's 5.10
# (bullseye), 6.1 (bookworm) and 6.12 (trixie) kernels, each booted under qemu, one
# guest at a time, 1 vCPU. docs/operations.md#kernels-tested has the last results.
#
# The guest's root is the host's / shared read-only over 9p, with tmpfs on /tmp and
# /run, a read-write 9p share for results (OUT/<release>/ here, /run/results in the
# guest) and the guest kernel's own modules bind-mounted at /usr/lib/modules/<release>.
# A busybox-static initramfs loads the virtio and 9p modules and switches to that root;
# the guest runs e2e/hack/kernels-guest.sh, which runs the test binaries compiled here
# (go test -c) with NFTPROXY_KERNEL_TESTS=1 and writes each package's log, exit status
# and a per-test summary into the results share, then powers off.
#
# Settings (environment):
#   KERNELS            suites to boot (default "bullseye bookworm trixie")
#   KERNELS_PKGS       packages whose tests run in each guest; PKG:REGEXP runs only the
#                      tests REGEXP matches (go test -run)
#   KERNELS_SKIP       go test -skip pattern for tests left out under emulation
#   KERNELS_TIMEOUT    seconds one guest may take, boot to power-off (default 1800);
#                      each package gets -test.timeout of what is left
#   KERNELS_ACCEL      qemu accelerator: tcg (default; software) or kvm where /dev/kvm is
#                      real hardware virtualization (not this project's nested machines)
#   KERNELS_MEM        guest memory in MiB (default 1536)
#   KERNELS_ENV        VAR=value words exported to the test binaries in the guest
#                      (e.g. NFTPROXY_FASTPATH_FIGURE=1 for e2e/kernels' measurement)
#   OUT                results directory (default bin/kernels)
# Exit status: 0 when every guest ran every package and every test passed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${KERNELS_CACHE:-/var/cache/nftproxy/kernels}
read -r -a suites <<<"${KERNELS:-bullseye bookworm trixie}"
# Every test of the nf_tables packages and the packet test, and the kernel tests of the
# packages above them that program a table (not the ones that measure cost or
# starvation, nor TestNftVersions, which needs e2e/hack/nft-roots.sh's Debian roots).
default_pkgs="./nft/kernel ./nft/readback ./nft/monitor ./nft/wire ./e2e/kernels
  ./internal/compile:^TestKernel(Differential|SourceRangeChanges)\$
  ./internal/controller:^(TestKernelRefusalIsIsolated|TestKubeProxyLeftoversInKernel)\$
  ./internal/metrics:^(TestKernelCounters|TestAppliedParts)\$
  ./internal/conntrack:^(TestCleanKernel|TestCleanEscapedKernel|TestSetSysctlsInNetns)\$
  ./cmd/nftproxy:^(TestListKernel|TestListFlatMissingEntry|TestListShowsWhoWinsANodePort)\$"
read -r -d '' -a pkgs <<<"${KERNELS_PKGS:-$default_pkgs}" || true
# Left out by default, timing-sensitive under a software CPU (docs/operations.md#kernels-tested):
# TestReadTableWhileSetsComeAndGo races its reads against a transaction every 3 ms; under
# emulation a read of its table takes longer than that, so every retry sees a new
# generation.
skip=${KERNELS_SKIP-^TestReadTableWhileSetsComeAndGo\$}
guest_timeout=${KERNELS_TIMEOUT:-1800}
accel=${KERNELS_ACCEL:-tcg}
mem=${KERNELS_MEM:-1536}
out=${OUT:-$repo/bin/kernels}
export KERNELS_CACHE=$cache

[ "$(id -u)" = 0 ] || { echo "kernels: needs root (the guest shares the host's root)" >&2; exit 1; }
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
# busybox-static: the initramfs needs a static busybox (and the guest its modprobe).
if ! { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; }; then need+=(busybox-static); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "kernels: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The mount point for the guest kernel's modules: the host's root is read-only in the
# guest, so /usr/lib/modules must exist there (it does wherever a kernel package is
# installed; a container image may lack it). An empty directory; the host never uses it.
[ -d /usr/lib/modules ] || mkdir -p /usr/lib/modules

mapfile -t kernels < <("$repo/e2e/hack/kernels-fetch.sh" "${suites[@]}")

# The test binaries, built once for every guest (which sees /tmp as its own tmpfs: each
# guest gets a copy in its results share).
bins="$out/tests"
rm -rf "$bins" && mkdir -p "$bins"
tests=()
for pr in "${pkgs[@]}"; do
  p=${pr%%:*} run=-
  [ "$p" = "$pr" ] || run=${pr#*:}
  name=$(echo "${p#./}" | tr / -)
  echo "kernels: go test -c $p" >&2
  (cd "$repo" && go test -c -o "$bins/$name.test" "$p")
  [ -x "$bins/$name.test" ] || { echo "kernels: $p has no tests" >&2; exit 1; }
  tests+=("$name ${p#./} /run/results/bin/$name.test $run") # copied into each guest's share
done

# initramfs for release $1 into file $2: busybox, the virtio/9p modules and their
# dependencies (modules.dep, in load order), and /init.
initramfs() {
  local rel=$1 dst=$2 mods="$cache/$1/lib/modules/$1" dir
  dir=$(mktemp -d)
  mkdir -p "$dir/bin" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/newroot" "$dir/mod"
  cp /bin/busybox "$dir/bin/busybox"
  ln -s busybox "$dir/bin/sh"
  local order=() seen=" "
  add() { # depth-first: dependencies before the module
    local m=$1 d
    case "$seen" in *" $m "*) return ;; esac
    seen="$seen$m "
    for d in $(awk -v m="$m:" '$1 == m { for (i = 2; i <= NF; i++) print $i }' "$mods/modules.dep"); do add "$d"; done
    order+=("$m")
  }
  local want
  for want in virtio_pci 9pnet_virtio 9p; do
    local path
    path=$(awk -v w="$want" -F: '{ n = $1; sub(/.*\//, "", n); sub(/\.ko$/, "", n); gsub(/-/, "_", n) } n == w { print $1; exit }' "$mods/modules.dep")
    if [ -n "$path" ]; then add "$path"; fi # else built in
  done
  local m i=0
  : >"$dir/modules"
  for m in "${order[@]}"; do
    i=$((i + 1))
    cp "$mods/$m" "$dir/mod/$i.ko"
    echo "$i.ko $m" >>"$dir/modules"
  done
  cat >"$dir/init" <<INIT
#!/bin/sh
export PATH=/bin
busybox mount -t proc proc /proc
busybox mount -t sysfs sysfs /sys
busybox mount -t devtmpfs devtmpfs /dev
while read -r f m; do busybox insmod /mod/\$f || echo "initramfs: insmod \$m failed"; done </modules
fail() { echo "initramfs: \$*"; busybox poweroff -f; }
busybox mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /newroot || fail "mounting the host's root"
busybox mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp || fail "tmpfs /tmp"
busybox mount -t tmpfs -o mode=755 tmpfs /newroot/run || fail "tmpfs /run"
busybox mkdir -p /newroot/run/results
busybox mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /newroot/run/results || fail "mounting the results share"
busybox mount -t tmpfs -o mode=755 tmpfs /newroot/usr/lib/modules || fail "tmpfs /usr/lib/modules"
busybox mkdir -p /newroot/usr/lib/modules/$rel
busybox mount -o bind /newroot$mods /newroot/usr/lib/modules/$rel || fail "binding the modules"
busybox mount -o move /dev /newroot/dev
busybox mount -o move /sys /newroot/sys
busybox mount -o move /proc /newroot/proc
exec busybox switch_root /newroot /bin/bash $repo/e2e/hack/kernels-guest.sh
INIT
  chmod +x "$dir/init"
  (cd "$dir" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$dst"
  rm -rf "$dir"
}

fmt_s() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
rows=()
status=0
for k in "${kernels[@]}"; do
  read -r suite rel dir <<<"$k"
  res="$out/$rel"
  rm -rf "$res" && mkdir -p "$res"
  initramfs "$rel" "$res/initramfs.gz"
  cp -r "$bins" "$res/bin"
  {
    printf 'REPO=%q\nTIMEOUT=%q\nSKIP=%q\nSTART=%q\n' "$repo" "$guest_timeout" "$skip" "$(date +%s)"
    printf 'GUEST_ENV=(%s)\n' "${KERNELS_ENV:-}"
    printf 'TESTS=(\n'
    for t in "${tests[@]}"; do printf '  %q\n' "$t"; done
    printf ')\n'
  } >"$res/run.env"
  echo "kernels: $suite $rel: booting (accel $accel, 1 vCPU, ${mem} MiB, at most $(fmt_s "$guest_timeout"))" >&2
  t0=$(date +%s)
  rc=0
  timeout --kill-after=10 "$guest_timeout" qemu-system-x86_64 -accel "$accel" -cpu max -smp 1 -m "$mem" \
    -nodefaults -no-reboot -display none -monitor none -nic none \
    -serial "file:$res/console.log" \
    -kernel "$dir/boot/vmlinuz-$rel" -initrd "$res/initramfs.gz" \
    -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=results,path=$res,security_model=none" \
    -device virtio-9p-pci,fsdev=results,mount_tag=results || rc=$?
  wall=$(($(date +%s) - t0))
  rm -rf "$res/bin" # the guest's copy of the test binaries ($bins has them)
  touch "$res/summary.txt" # absent when the guest never got to the tests
  passed=$(awk '$1 == "PASS"' "$res/summary.txt" | wc -l)
  failed=$(awk '$1 == "FAIL"' "$res/summary.txt" | wc -l)
  skipped=$(awk '$1 == "SKIP"' "$res/summary.txt" | wc -l)
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    result="timed out after $(fmt_s "$guest_timeout") ($res)"
  elif [ ! -f "$res/status" ]; then
    result="no result (qemu exit $rc; $res/console.log)"
  elif [ "$(cat "$res/status")" = 0 ]; then
    result=ok
  else
    result="FAIL ($(awk '$1 == "FAIL" { printf "%s%s", s, $3; s = " " }' "$res/summary.txt"))"
    [ "$failed" -gt 0 ] || result="FAIL (packages: $(tr "\n" " " <"$res/failed-packages"))"
  fi
  [ "$result" = ok ] || status=1
  rows+=("$(printf '%-8s %-24s %6s %6s %7s %8s  %s' "$suite" "$rel" "$passed" "$failed" "$skipped" "$(fmt_s "$wall")" "$result")")
  echo "kernels: $rel: $result, $passed passed, $failed failed, $skipped skipped, $(fmt_s "$wall") ($res)" >&2
done
printf '%-8s %-24s %6s %6s %7s %8s  %s\n' suite kernel passed failed skipped wall result
printf '%s\n' "${rows[@]}"
[ -z "$skip" ] || echo "left out under emulation (-skip): $skip"
exit $status
