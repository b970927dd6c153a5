// Command releaseimage writes nftproxy's release image: one OCI image-layout tarball
// holding an image index with one image per platform (package ociimage's WriteIndex),
// which docker, podman, `ctr images import` and `kind load image-archive` load.
// e2e/hack/release.sh runs it; see docs/release.md.
//
//	releaseimage -o dist/nftproxy-v0.1.0-image.tar -ref ghcr.io/nftproxy/nftproxy:v0.1.0 \
//	    -version v0.1.0 -revision "$(git rev-parse HEAD)" -created 1764590400 \
//	    -license LICENSE -bin linux/amd64=dist/nftproxy-v0.1.0-linux-amd64 \
//	    -bin linux/arm64=dist/nftproxy-v0.1.0-linux-arm64
//
// Each image is what the Containerfile builds, without a container engine: the static
// binary at /usr/local/bin/nftproxy as the entrypoint, run as user 0:0 (the DaemonSet
// gives it only CAP_NET_ADMIN), on a base layer shared by all platforms standing in for
// distroless/static: /etc/passwd and /etc/group with root, nobody and nonroot (65532),
// a world-writable /tmp, and the licence under /usr/share/doc/nftproxy. There is no CA
// bundle: nftproxy talks only to the API server, with the cluster's own CA. The config
// carries the org.opencontainers.image.* labels (version, revision, created, source,
// licenses). The same inputs give a byte-identical tarball.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/ociimage"
)

// Where the binary lives in the image, as in the Containerfile.
const binPath = "/usr/local/bin/nftproxy"

const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "releaseimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var (
		out, ref, version, revision, created, license string
		bins                                          list
	)
	fs := flag.NewFlagSet("releaseimage", flag.ContinueOnError)
	fs.StringVar(&out, "o", "", "output tarball (required)")
	fs.StringVar(&ref, "ref", "", "image name and tag, e.g. ghcr.io/nftproxy/nftproxy:v0.1.0 (required)")
	fs.Var(&bins, "bin", "OS/ARCH=PATH: the static nftproxy binary for that platform (repeatable; the first is the default platform for Docker's classic store)")
	fs.StringVar(&version, "version", "", "the version label (org.opencontainers.image.version; required)")
	fs.StringVar(&revision, "revision", "", "the git commit label (org.opencontainers.image.revision)")
	fs.StringVar(&created, "created", "0", "the image's creation time: seconds since 1970 (SOURCE_DATE_EPOCH) or RFC 3339")
	fs.StringVar(&license, "license", "", "the licence file, copied to /usr/share/doc/nftproxy/LICENSE (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if out == "" || ref == "" || version == "" || license == "" || len(bins) == 0 || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("need -o, -ref, -version, -license and at least one -bin, and no arguments")
	}
	when, err := parseTime(created)
	if err != nil {
		return fmt.Errorf("-created %q: %w", created, err)
	}
	lic, err := os.ReadFile(license)
	if err != nil {
		return err
	}
	base := ociimage.Files(
		ociimage.File{Path: "/etc/passwd", Data: []byte(passwd), Mode: 0o644},
		ociimage.File{Path: "/etc/group", Data: []byte(group), Mode: 0o644},
		ociimage.File{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
		ociimage.File{Path: "/root", Dir: true, Mode: 0o700},
		ociimage.File{Path: "/tmp", Dir: true, Mode: 0o1777},
		ociimage.File{Path: "/usr/share/doc/nftproxy/LICENSE", Data: lic, Mode: 0o644},
	)
	labels := map[string]string{
		"org.opencontainers.image.title":       "nftproxy",
		"org.opencontainers.image.description": "A Kubernetes service proxy that programs nftables over netlink",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.created":     when.Format(time.RFC3339),
		"org.opencontainers.image.source":      "https://github.com/nftproxy/nftproxy",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = revision
	}
	idx := ociimage.Index{Ref: ref}
	for _, b := range bins {
		plat, path, ok := strings.Cut(b, "=")
		osName, arch, ok2 := strings.Cut(plat, "/")
		if !ok || !ok2 || path == "" {
			return fmt.Errorf("-bin %q: want OS/ARCH=PATH, e.g. linux/arm64=dist/nftproxy-linux-arm64", b)
		}
		if fi, err := os.Stat(path); err != nil {
			return err
		} else if !fi.Mode().IsRegular() {
			return fmt.Errorf("-bin %s: not a regular file", path)
		}
		idx.Images = append(idx.Images, ociimage.Image{
			Platform: ociimage.Platform{OS: osName, Architecture: arch},
			Config: ociimage.Config{
				User:       "0:0",
				Entrypoint: []string{binPath},
				Labels:     labels,
				Created:    when,
			},
			Layers: []ociimage.Layer{base, ociimage.Files(ociimage.File{Path: binPath, Src: path, Mode: 0o755})},
		})
	}
	return ociimage.WriteIndex(out, idx)
}

// parseTime reads seconds since 1970 or an RFC 3339 time.
func parseTime(s string) (time.Time, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return time.Time{}, errors.New("before 1970")
		}
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Parse(time.RFC3339, s)
}
