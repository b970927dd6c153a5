#!/usr/bin/env bash
# Minimal Debian roots holding each release's own nft, for checking that other nft
# versions list and reload nftproxy's table: bullseye (Debian 11, nft 0.9.8), bookworm
# (12, nft 1.0.6), trixie (13, nft 1.1.3). Built with debootstrap on first use (a few
# minutes each, from deb.debian.org) and cached; later calls only print the paths.
#
# usage: nft-roots.sh [suite ...]        (default: bullseye bookworm trixie)
# env:   NFTPROXY_CACHE (/var/cache/nftproxy), DEBIAN_MIRROR (http://deb.debian.org/debian)
# prints "suite path" for each root, one per line. Needs root and debootstrap.
#
# Use a root only inside a network namespace of your own, e.g.
#   ip netns exec NS chroot ROOT nft list ruleset
# (`nft -f -` reads /dev/stdin, so bind /dev and mount /proc into the root first, in a
# mount namespace of its own: `unshare -m sh -c 'mount --bind /dev ROOT/dev && mount -t
# proc proc ROOT/proc && chroot ROOT nft -f -'`).
set -euo pipefail
cache=${NFTPROXY_CACHE:-/var/cache/nftproxy}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suites=("$@"); [ ${#suites[@]} -gt 0 ] || suites=(bullseye bookworm trixie)
out="$cache/nft-roots"
# netbase: /etc/protocols, without which nft prints protocol numbers and reads "tcp" in
# an element as something else, as no real host does.
include=nftables,netbase
mkdir -p "$out"
command -v debootstrap >/dev/null || { echo "nft-roots.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
# One build at a time: test packages run in parallel and may all ask for a root.
exec 9>"$out/.lock"
flock 9

for s in "${suites[@]}"; do
  case "$s" in bullseye|bookworm|trixie) ;; *) echo "nft-roots.sh: unknown suite $s" >&2; exit 1 ;; esac
  root="$out/$s"
  if [ "$(cat "$root/.complete" 2>/dev/null)" != "$include" ]; then
    rm -rf "$root.tmp"
    echo "debootstrap $s into $root (a few minutes, cached)" >&2
    keyring=()
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
    if ! debootstrap "${keyring[@]}" --variant=minbase --include="$include" "$s" "$root.tmp" "$mirror" >"$out/$s.log" 2>&1; then
      echo "nft-roots.sh: debootstrap $s failed; last lines of $out/$s.log:" >&2
      tail -n 20 "$out/$s.log" >&2
      exit 1
    fi
    # Nothing in the root ever runs as a service; drop the caches debootstrap leaves.
    rm -rf "$root.tmp/var/cache/apt/archives/"*.deb
    chroot "$root.tmp" nft --version >/dev/null
    rm -rf "$root"
    mv "$root.tmp" "$root"
    echo "$include" > "$root/.complete"
  fi
  echo "$s $root"
done
