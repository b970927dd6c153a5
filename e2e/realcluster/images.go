package realcluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Image references the cluster uses (contract A: e2e/hack/build-images.sh prints them).
const (
	PauseImage     = "registry.k8s.io/pause:3.10.2"
	AgnhostImage   = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	KubeProxyImage = "registry.k8s.io/kube-proxy:v1.37.0"
	corednsPrefix  = "registry.k8s.io/coredns/coredns:"
)

func cacheDir() string {
	if d := os.Getenv("NFTPROXY_CACHE"); d != "" {
		return d
	}
	return "/var/cache/nftproxy"
}

// k8sBinaries runs e2e/hack/build-k8s.sh for names (cached), or, when every binary is
// already in its cache directory, returns their paths without waiting for its lock
// (another build may hold it for minutes).
func k8sBinaries(ctx context.Context, names ...string) ([]string, error) {
	ver := os.Getenv("K8S_VERSION")
	if ver == "" {
		ver = "v1.37.0"
	}
	var paths []string
	for _, n := range names {
		p := filepath.Join(cacheDir(), "k8s-"+ver+"-v2", n)
		if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
			paths = nil
			break
		}
		paths = append(paths, p)
	}
	if paths != nil {
		return paths, nil
	}
	out, err := scriptOutput(ctx, filepath.Join(e2eDir(), "hack", "build-k8s.sh"), names...)
	if err != nil {
		return nil, err
	}
	paths = strings.Fields(out)
	if len(paths) != len(names) {
		return nil, fmt.Errorf("build-k8s.sh printed %d paths for %d binaries: %q", len(paths), len(names), out)
	}
	return paths, nil
}

// buildK8s returns the cluster's binaries (e2e.test is built only when asked for: E2ETest).
func buildK8s(ctx context.Context) (Binaries, error) {
	p, err := k8sBinaries(ctx, "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{APIServer: p[0], ControllerManager: p[1], Scheduler: p[2], Kubelet: p[3], Kubectl: p[4]}, nil
}

// E2ETest returns upstream's e2e.test v1.37.0 (built and cached by build-k8s.sh).
func E2ETest(ctx context.Context) (string, error) {
	p, err := k8sBinaries(ctx, "e2e.test")
	if err != nil {
		return "", err
	}
	return p[0], nil
}

func scriptOutput(ctx context.Context, script string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, script, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", filepath.Base(script), err, lastLines(stderr.String(), 20))
	}
	return string(out), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// baseImages returns ref -> OCI tarball of the pause, agnhost, CoreDNS and kube-proxy
// images, from e2e/hack/build-images.sh (contract A).
func baseImages(ctx context.Context) (map[string]string, error) {
	out, err := scriptOutput(ctx, filepath.Join(e2eDir(), "hack", "build-images.sh"))
	if err != nil {
		return nil, err
	}
	imgs := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			imgs[f[0]] = f[1]
		}
	}
	for _, ref := range []string{PauseImage, AgnhostImage, KubeProxyImage} {
		if imgs[ref] == "" {
			return nil, fmt.Errorf("build-images.sh did not print %s: %q", ref, out)
		}
	}
	return imgs, nil
}

// CoreDNSImage is the CoreDNS reference among the images, "" if there is none.
func (c *Cluster) CoreDNSImage() string {
	for ref := range c.images {
		if strings.HasPrefix(ref, corednsPrefix) {
			return ref
		}
	}
	return ""
}
