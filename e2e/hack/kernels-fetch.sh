#!/usr/bin/env bash
# Fetches and unpacks one Debian kernel per suite (default: bullseye bookworm trixie)
# into KERNELS_CACHE (/var/cache/nftproxy/kernels), through an apt state of its own
# under that directory: the machine's apt sources, lists and archives are left as they
# are. The mirror is the one the machine's own Debian sources name. Prints one line
# per suite: "<suite> <kernel release> <directory>". A suite fetched before is not
# fetched again (KERNELS_REFRESH=1 looks for a newer kernel).
#
# <directory> holds boot/vmlinuz-<release> and lib/modules/<release>/ (with modules.dep,
# modules.alias from busybox depmod, and the modules decompressed).
set -euo pipefail
cache=${KERNELS_CACHE:-/var/cache/nftproxy/kernels}
suites=("${@:-bullseye bookworm trixie}")
[ $# -eq 0 ] && suites=(bullseye bookworm trixie)
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "kernels-fetch: no Debian mirror in the machine's apt sources" >&2; exit 1; }

for suite in "${suites[@]}"; do
  if [ -z "${KERNELS_REFRESH:-}" ] && [ -f "$cache/$suite.release" ]; then
    rel=$(cat "$cache/$suite.release")
    if [ -f "$cache/$rel/boot/vmlinuz-$rel" ] && [ -f "$cache/$rel/lib/modules/$rel/modules.dep" ]; then
      echo "$suite $rel $cache/$rel"
      continue
    fi
  fi
  st="$cache/apt/$suite"
  mkdir -p "$st/lists/partial" "$st/cache/archives/partial" "$st/etc"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$st/etc/sources.list"
  apt=(-o Dir::Etc::sourcelist="$st/etc/sources.list" -o Dir::Etc::sourceparts=/dev/null
    -o Dir::State::Lists="$st/lists" -o Dir::Cache="$st/cache" -o Dir::State::status=/dev/null
    -o APT::Architecture=amd64 -o Acquire::Languages=none -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  echo "kernels-fetch: $suite: apt-get update (private state $st)" >&2
  apt-get "${apt[@]}" update -qq >&2
  # linux-image-amd64 depends on the suite's current linux-image-<release>.
  pkg=$(apt-cache "${apt[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [ -n "$pkg" ] || { echo "kernels-fetch: $suite: no linux-image-<release> behind linux-image-amd64" >&2; exit 1; }
  rel=${pkg#linux-image-}
  echo "kernels-fetch: $suite: $pkg" >&2
  (cd "$st/cache/archives" && apt-get "${apt[@]}" download -qq "$pkg" >&2)
  deb=$(ls -t "$st/cache/archives/${pkg}_"*.deb | head -1)
  tmp="$cache/.unpack-$rel"
  rm -rf "$tmp" && mkdir -p "$tmp"
  dpkg-deb -x "$deb" "$tmp/x"
  mkdir -p "$tmp/boot" "$tmp/lib/modules"
  mv "$tmp/x/boot/vmlinuz-$rel" "$tmp/boot/"
  if [ -d "$tmp/x/usr/lib/modules/$rel" ]; then mv "$tmp/x/usr/lib/modules/$rel" "$tmp/lib/modules/"; else mv "$tmp/x/lib/modules/$rel" "$tmp/lib/modules/"; fi
  rm -rf "$tmp/x"
  # busybox's insmod and modprobe (in the initramfs and in the guest) read plain .ko.
  find "$tmp/lib/modules/$rel" -name '*.ko.xz' -print0 | xargs -0 -r -n 200 xz -d
  find "$tmp/lib/modules/$rel" -name '*.ko.zst' -print0 | xargs -0 -r -n 200 zstd -q -d --rm
  busybox depmod -b "$tmp" "$rel"
  rm -rf "${cache:?}/$rel"
  mv "$tmp" "$cache/$rel"
  echo "$rel" >"$cache/$suite.release"
  echo "$suite $rel $cache/$rel"
done
