package realcluster

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/ociimage"
)

// APIPlaceholder is the API address the shipped manifests carry (contract B).
const APIPlaceholder = "https://CONTROL_PLANE_ENDPOINT:6443"

// NftproxyImageRef is the image the chart's defaults and manifests/daemonset.yaml name:
// ghcr.io/nftproxy/nftproxy:<the chart's appVersion>. The tests build it from this tree.
var NftproxyImageRef = chartImageRef()

//go:embed testdata/kube-proxy.yaml
var kubeProxyManifest string

//go:embed testdata/coredns.yaml
var corednsManifest string

// ManifestsDir is the repository's manifests/ directory.
func ManifestsDir() string { return filepath.Join(filepath.Dir(e2eDir()), "manifests") }

// NftproxyManifests returns manifests/rbac.yaml, config.yaml and daemonset.yaml as
// shipped, with exactly the two substitutions of contract B: the API placeholder becomes
// the API server's real URL and, if image is not empty, NftproxyImageRef becomes image.
func NftproxyManifests(image string) (string, error) {
	var docs []string
	for _, f := range []string{"rbac.yaml", "config.yaml", "daemonset.yaml"} {
		b, err := os.ReadFile(filepath.Join(ManifestsDir(), f))
		if err != nil {
			return "", err
		}
		docs = append(docs, SubstituteManifest(string(b), image))
	}
	return strings.Join(docs, "\n---\n"), nil
}

// SubstituteManifest applies contract B's substitutions to one manifest file. docs/kind.md
// describes the same two (with sed) for a kind cluster.
func SubstituteManifest(y, image string) string {
	y = strings.ReplaceAll(y, APIPlaceholder, APIServerURL)
	if image != "" {
		y = strings.ReplaceAll(y, "image: "+NftproxyImageRef, "image: "+image)
	}
	return y
}

// InstallNftproxy applies the manifests (image "" keeps NftproxyImageRef) and waits until its
// DaemonSet has a ready pod on every node.
func (c *Cluster) InstallNftproxy(ctx context.Context, image string) error {
	y, err := NftproxyManifests(image)
	if err != nil {
		return err
	}
	if out, err := c.KubectlInput(ctx, y, "apply", "-f", "-"); err != nil {
		return err
	} else {
		c.h.Logf("applied manifests/:\n%s", strings.TrimSpace(out))
	}
	return c.WaitDaemonSet(ctx, "kube-system", "nftproxy", 3*time.Minute)
}

// InstallKubeProxy applies testdata/kube-proxy.yaml (kube-proxy v1.37.0, nftables mode,
// a kubeadm-like DaemonSet with its own kubeconfig ConfigMap) and waits for it.
func (c *Cluster) InstallKubeProxy(ctx context.Context) error {
	y := strings.ReplaceAll(kubeProxyManifest, APIPlaceholder, APIServerURL)
	if _, err := c.KubectlInput(ctx, y, "apply", "-f", "-"); err != nil {
		return err
	}
	return c.WaitDaemonSet(ctx, "kube-system", "kube-proxy", 3*time.Minute)
}

// WaitDaemonSet waits until the DaemonSet's latest generation is rolled out and ready on
// every node.
func (c *Cluster) WaitDaemonSet(ctx context.Context, ns, name string, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.h.WaitFor(wctx, "DaemonSet "+ns+"/"+name+" ready", nil, func(ctx context.Context) error {
		ds, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ds.Status
		if ds.Generation != s.ObservedGeneration || s.DesiredNumberScheduled != int32(len(c.Nodes)) ||
			s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled ||
			s.NumberAvailable != s.DesiredNumberScheduled {
			return fmt.Errorf("desired %d, updated %d, ready %d, available %d", s.DesiredNumberScheduled,
				s.UpdatedNumberScheduled, s.NumberReady, s.NumberAvailable)
		}
		return nil
	})
}

// deployCoreDNS applies testdata/coredns.yaml (Deployment + kube-dns Service at
// DNSServiceIP) if the images include CoreDNS. It becomes ready once a proxy makes the
// `kubernetes` Service reachable.
func (c *Cluster) deployCoreDNS(ctx context.Context) error {
	img := c.CoreDNSImage()
	if img == "" {
		c.h.Logf("no CoreDNS image; cluster DNS is not deployed")
		return nil
	}
	y := strings.ReplaceAll(corednsManifest, "COREDNS_IMAGE", img)
	y = strings.ReplaceAll(y, "DNS_SERVICE_IP", DNSServiceIP)
	_, err := c.KubectlInput(ctx, y, "apply", "-f", "-")
	return err
}

// BuildNftproxyImage builds ./cmd/nftproxy (static) into dir and writes an OCI image of
// it tagged ref, following the Containerfile (binary at /usr/local/bin/nftproxy, user 0).
// It returns the tarball path and the binary's.
func BuildNftproxyImage(ctx context.Context, dir, ref string) (tarball, bin string, err error) {
	bin = filepath.Join(dir, "nftproxy")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/nftproxy")
	cmd.Dir = filepath.Dir(e2eDir())
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build ./cmd/nftproxy: %w: %s", err, out)
	}
	tarball = filepath.Join(dir, "nftproxy-"+strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	if err := writeBinaryImage(tarball, ref, bin, "/usr/local/bin/nftproxy"); err != nil {
		return "", "", err
	}
	return tarball, bin, nil
}

// ReleaseImage builds this tree's release into dir with `make release` (what an operator
// installs: the multi-architecture image tarball, named NftproxyImageRef, and the static
// binaries) and returns the image tarball and the linux/amd64 binary.
func ReleaseImage(ctx context.Context, dir string) (tarball, bin string, err error) {
	repo := filepath.Dir(e2eDir())
	v, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		return "", "", err
	}
	version := strings.TrimSpace(string(v))
	if want := ChartImageRepository + ":" + version; want != NftproxyImageRef {
		return "", "", fmt.Errorf("the release image is %s, the chart names %s", want, NftproxyImageRef)
	}
	cmd := exec.CommandContext(ctx, "make", "-C", repo, "--no-print-directory", "release", "DIST="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make release: %w: %s", err, out)
	}
	return filepath.Join(dir, "nftproxy-"+version+"-image.tar"), filepath.Join(dir, "nftproxy-"+version+"-linux-amd64"), nil
}

// writeBinaryImage writes an OCI image of one static binary (contract A).
func writeBinaryImage(out, ref, src, dest string) error {
	return ociimage.WriteBinary(out, ref, src, dest)
}
