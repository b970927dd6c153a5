package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// BuildBinaries builds nftproxy and the load client into dir and finds (or builds)
// kube-proxy with e2e/hack/build-k8s.sh. The nftproxy build is retried for a few
// minutes: the tree may be mid-change.
func BuildBinaries(ctx context.Context, dir string) (Binaries, error) {
	root := repoRoot()
	b := Binaries{Nftproxy: filepath.Join(dir, "nftproxy"), LoadClient: filepath.Join(dir, "loadclient")}
	build := func(out, pkg string) error {
		var last error
		for attempt := range 10 {
			cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", versionLDFlags(ctx, root), "-o", out, pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			o, err := cmd.CombinedOutput()
			if err == nil {
				return nil
			}
			last = fmt.Errorf("go build %s: %v: %s", pkg, err, o)
			if attempt < 9 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(30 * time.Second):
				}
			}
		}
		return last
	}
	if err := build(b.Nftproxy, "./cmd/nftproxy"); err != nil {
		return b, err
	}
	if err := build(b.LoadClient, "./e2e/bench/loadclient"); err != nil {
		return b, err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(root, "e2e", "hack", "build-k8s.sh"), "kube-proxy").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return b, fmt.Errorf("build-k8s.sh kube-proxy: %w", err)
	}
	b.KubeProxy = strings.TrimSpace(string(out))
	return b, nil
}

// versionLDFlags stamps the version and commit as `make build` does (the VERSION file's
// version, as a pre-release with the commit: v0.1.0-dev.g<commit>[.dirty]), so the
// report names the nftproxy it measured.
func versionLDFlags(ctx context.Context, root string) string {
	git := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, _ := cmd.Output()
		return strings.TrimSpace(string(out))
	}
	release := "v0.0.0"
	if b, err := os.ReadFile(filepath.Join(root, "VERSION")); err == nil {
		release = strings.TrimSpace(string(b))
	}
	v := release + "-dev.g" + git("rev-parse", "--short", "HEAD")
	if git("status", "--porcelain", "--untracked-files=no") != "" {
		v += ".dirty"
	}
	const pkg = "github.com/nftproxy/nftproxy/internal/version"
	return fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitCommit=%s", pkg, v, pkg, git("rev-parse", "HEAD"))
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func hostInfo(ctx context.Context, bins Binaries) Host {
	h := Host{CPUs: numCPU()}
	run := func(name string, args ...string) string {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = repoRoot()
		out, _ := cmd.CombinedOutput()
		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	h.Kernel = run("uname", "-r")
	h.Commit = run("git", "describe", "--always", "--dirty")
	h.KubeProxy = run(bins.KubeProxy, "--version")
	h.Nftproxy = run(bins.Nftproxy, "--version")
	h.Load = "load average at the start " + loadAvg()
	h.Nft = run("nft", "--version")
	h.Iptables = run("iptables", "--version")
	return h
}
