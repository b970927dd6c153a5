#!/usr/bin/env bash
# Builds a release of nftproxy into a directory, without a container engine and without
# network (the Go module cache must hold the modules: `go mod download` once, and
# cyclonedx-gomod is built from it). `make release` runs it; docs/release.md tells the rest.
#
#   e2e/hack/release.sh VERSION DIST IMAGE_REPO
#   e.g. e2e/hack/release.sh v0.1.0 dist ghcr.io/nftproxy/nftproxy
#
# Writes into DIST (emptied first):
#   nftproxy-VERSION-linux-amd64, nftproxy-VERSION-linux-arm64   static binaries
#   nftproxy-VERSION-image.tar       the multi-architecture image IMAGE_REPO:VERSION, one
#                                    OCI image-layout tarball (also with a docker-archive
#                                    manifest.json) for docker/podman load, ctr import, kind
#   nftproxy-VERSION-linux-ARCH.cdx.json   CycloneDX SBOM of each binary, from its Go build info
#   SHA256SUMS                       sha256sum's format, for `sha256sum -c SHA256SUMS`
#
# Reproducible: the same commit and Go toolchain give byte-identical files (-trimpath,
# -buildid=, no VCS stamping, the commit's time as the only time, sorted tar entries).
# env: GO (default go), CYCLONEDX_GOMOD (a cyclonedx-gomod binary; default: built into
# bin/ from the module cache at the version below)
set -Eeuo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
version=${1:?usage: release.sh VERSION DIST IMAGE_REPO}
dist=${2:?usage: release.sh VERSION DIST IMAGE_REPO}
image_repo=${3:?usage: release.sh VERSION DIST IMAGE_REPO}
go=${GO:-go}
cyclonedx_version=v1.10.0
vpkg=github.com/nftproxy/nftproxy/internal/version

log() { echo "release: $*" >&2; }
die() { log "error: $*"; exit 1; }
trap 'log "error: failed at line $LINENO: $BASH_COMMAND"' ERR

# The version comes from one place, the VERSION file (git tags do not travel with every
# checkout); a release is built from exactly that version.
file_version=$(tr -d ' \n' <VERSION)
[ "$version" = "$file_version" ] ||
  die "VERSION=$version but the VERSION file says $file_version: a release is the file's version (edit VERSION and CHANGELOG.md first)"
[[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
  die "$version is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]"
grep -q "^## \[${version#v}\]" CHANGELOG.md || die "CHANGELOG.md has no '## [${version#v}]' section"

commit=unknown tree=unknown epoch=0
if git rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git rev-parse HEAD)
  epoch=$(git log -1 --format=%ct HEAD)
  tree=clean
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    tree=dirty
    log "warning: the work tree has uncommitted changes; the binaries say gitTreeState=dirty"
  fi
fi
build_date=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
rm -f "$dist"/nftproxy-* "$dist"/SHA256SUMS

ldflags="-s -w -buildid= -X $vpkg.gitVersion=$version -X $vpkg.gitCommit=$commit -X $vpkg.gitTreeState=$tree -X $vpkg.buildDate=$build_date"
for arch in amd64 arm64; do
  log "building linux/$arch"
  # Every setting that changes the output is given here, none taken from the environment.
  env CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOAMD64=v1 GOARM64=v8.0 GOFLAGS= GOEXPERIMENT= \
    "$go" build -trimpath -buildvcs=false -ldflags "$ldflags" \
    -o "$dist/nftproxy-$version-linux-$arch" ./cmd/nftproxy
done

cyclonedx=${CYCLONEDX_GOMOD:-$repo/bin/cyclonedx-gomod}
if [ ! -x "$cyclonedx" ]; then
  log "building cyclonedx-gomod $cyclonedx_version into bin/ (from the module cache, else the Go module proxy)"
  # -trimpath: the tool's own hash, which its SBOMs record, is then the same on every machine.
  GOBIN="$repo/bin" GOFLAGS=-trimpath "$go" install "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$cyclonedx_version"
fi
for arch in amd64 arm64; do
  log "SBOM of linux/$arch"
  # -noserial -notimestamp: the same binary gives the same document.
  if ! "$cyclonedx" bin -json -noserial -notimestamp -version "$version" \
    -output "$dist/nftproxy-$version-linux-$arch.cdx.json" "$dist/nftproxy-$version-linux-$arch" 2>"$dist/.cyclonedx.log"; then
    cat "$dist/.cyclonedx.log" >&2
    die "cyclonedx-gomod failed on nftproxy-$version-linux-$arch"
  fi
  rm -f "$dist/.cyclonedx.log"
done

log "image $image_repo:$version (linux/amd64, linux/arm64)"
GOFLAGS= "$go" run ./e2e/ociimage/cmd/releaseimage -o "$dist/nftproxy-$version-image.tar" \
  -ref "$image_repo:$version" -version "$version" -revision "$commit" -created "$epoch" \
  -license LICENSE \
  -bin "linux/amd64=$dist/nftproxy-$version-linux-amd64" \
  -bin "linux/arm64=$dist/nftproxy-$version-linux-arm64"

(cd "$dist" && sha256sum nftproxy-* >SHA256SUMS)
log "done: $dist"
cat "$dist/SHA256SUMS"
