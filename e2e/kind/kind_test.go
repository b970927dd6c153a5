package kind

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestKind is `make kind`: a real kind cluster (two nodes, kubeProxyMode none, kindnet)
// in a dockerd of its own inside a network namespace of its own, driven by the sh
// blocks of docs/kind.md run as written, then the checks a CI job would make, the
// schema of `nftproxy list -o json` among them. NFTPROXY_KIND=1 runs it; cold (nothing
// cached under /var/cache/nftproxy/kind) about an hour, warm about 70 s. Needs root,
// docker.io, debootstrap, go, jq; KIND_SRC (a kubernetes-sigs/kind checkout) for
// kindnetd until it is cached. NFTPROXY_KIND_KEEP=1 leaves the cluster and dockerd up.
func TestKind(t *testing.T) {
	if os.Getenv("NFTPROXY_KIND") != "1" {
		t.Skip("NFTPROXY_KIND=1 (make kind) runs a kind cluster: about an hour cold, 70 s warm")
	}
	root := RepoRoot()
	hack := filepath.Join(root, "e2e", "hack")
	k := &kindRun{t: t, root: root, started: time.Now()}
	t.Cleanup(k.summary) // last: after the teardown's steps
	keep := os.Getenv("NFTPROXY_KIND_KEEP") == "1"

	blocks, err := PageBlocks()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "kind-nftproxy.yaml")); err == nil {
		t.Fatal("kind-nftproxy.yaml exists in the checkout: the page writes it; move it away")
	}
	t.Cleanup(func() { os.Remove(filepath.Join(root, "kind-nftproxy.yaml")) })

	// kind mounts the host's /lib/modules into the nodes.
	if _, err := os.Stat("/lib/modules"); os.IsNotExist(err) {
		if err := os.Mkdir("/lib/modules", 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove("/lib/modules") })
	}

	k.step("dockerd in its netns", 2*time.Minute, filepath.Join(hack, "kind-docker.sh"), "start")
	if !keep {
		t.Cleanup(func() {
			k.step("stop dockerd, delete the netns", 2*time.Minute, filepath.Join(hack, "kind-docker.sh"), "stop")
		})
	}
	k.env = k.kindEnv()
	k.step("node image and tools", 150*time.Minute, filepath.Join(hack, "kind-images.sh"))
	agnhost := ""
	for _, l := range strings.Split(k.step("agnhost image", 60*time.Minute, filepath.Join(hack, "build-images.sh")), "\n") {
		if f := strings.Fields(l); len(f) == 2 && strings.Contains(f[0], "/agnhost:") {
			agnhost = f[1]
		}
	}
	if agnhost == "" {
		t.Fatal("build-images.sh printed no agnhost image")
	}
	// make release builds cyclonedx-gomod from the module proxy when bin/ lacks it; the
	// kind namespace has no network, so it is built here first, as release.sh would.
	cdx := regexp.MustCompile(`(?m)^cyclonedx_version=(\S+)$`).FindStringSubmatch(k.readFile("e2e/hack/release.sh"))
	if cdx == nil {
		t.Fatal("e2e/hack/release.sh: no cyclonedx_version=")
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "cyclonedx-gomod")); err != nil {
		k.step("cyclonedx-gomod for make release", 20*time.Minute, "env", "GOBIN="+filepath.Join(root, "bin"), "GOFLAGS=-trimpath",
			"go", "install", "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@"+cdx[1])
	}
	k.inNetns("no cluster left from an earlier run", time.Minute, "kind delete cluster --name nftproxy")

	deleteBlock := blocks[len(blocks)-1]
	if !keep {
		t.Cleanup(func() {
			k.inNetns(fmt.Sprintf("docs/kind.md:%d", deleteBlock.Line), 3*time.Minute, deleteBlock.Code)
		})
	}
	for _, b := range blocks[:len(blocks)-1] {
		if strings.Contains(b.Code, "kubectl create deployment web") {
			// No registry here: the image the page names, built locally, under that name.
			k.inNetns("load agnhost (no registry)", 5*time.Minute, "kind load image-archive "+agnhost+" --name nftproxy")
		}
		k.inNetns(fmt.Sprintf("docs/kind.md:%d", b.Line), 10*time.Minute, b.Code)
	}

	// What the page's checks do not show: every node's listing against the schema, with
	// the web Service in it, and kindnet (kind's default CNI) running on every node.
	schema, err := ListSchema()
	if err != nil {
		t.Fatal(err)
	}
	pods := strings.Fields(k.inNetns("nftproxy pods", time.Minute, "kubectl -n kube-system get pods -l k8s-app=nftproxy -o name"))
	if len(pods) != 2 {
		t.Fatalf("nftproxy pods: %v, want one per node (2)", pods)
	}
	for _, p := range pods {
		out := k.inNetns("list -o json in "+p, time.Minute, "kubectl -n kube-system exec "+p+" -- nftproxy list -o json")
		if err := ValidateList(schema, []byte(out)); err != nil {
			t.Errorf("%s: nftproxy list -o json does not match docs/schema/list-v1.json: %v\n%s", p, err, out)
		}
		for _, want := range []string{`"service": "default/web"`, `"service": "default/kubernetes:https"`, `"service": "kube-system/kube-dns:dns"`} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: nftproxy list -o json has no %s:\n%s", p, want, out)
			}
		}
	}
	k.inNetns("kindnet on every node", 3*time.Minute, "kubectl -n kube-system rollout status daemonset/kindnet --timeout=2m")
	nftVersion := k.inNetns("the node's nft", time.Minute, "docker exec nftproxy-worker nft --version")
	if !regexp.MustCompile(`^nftables v1\.1\.3`).MatchString(nftVersion) {
		t.Errorf("the node's nft: %q, want nftables v1.1.3 (trixie)", nftVersion)
	}
}

// kindRun runs the test's steps, logging each one's output to
// $NFTPROXY_CACHE/kind/logs and its wall time to the summary.
type kindRun struct {
	t       *testing.T
	root    string
	env     []string
	netns   string
	started time.Time
	times   []string
}

func (k *kindRun) kindEnv() []string {
	// the variables kind-env.sh sets, for the page's commands
	out, err := exec.Command("bash", "-c", ". "+filepath.Join(k.root, "e2e/hack/kind-env.sh")+" && echo \"$PATH\" && echo \"$DOCKER_HOST\" && echo \"$KIND_NETNS\"").Output()
	if err != nil {
		k.t.Fatalf("kind-env.sh: %v", err)
	}
	v := strings.Split(strings.TrimSpace(string(out)), "\n")
	k.netns = v[2]
	kubeconfig := filepath.Join(k.t.TempDir(), "kubeconfig")
	return append(os.Environ(), "PATH="+v[0], "DOCKER_HOST="+v[1], "KIND_NETNS="+v[2], "KUBECONFIG="+kubeconfig)
}

// step runs a command in the repository and returns its stdout; a failure stops the test.
func (k *kindRun) step(what string, timeout time.Duration, name string, args ...string) string {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	return k.run(what, cmd)
}

// inNetns runs a bash script in the kind network namespace, in the repository's top
// directory, as `bash -euo pipefail`.
func (k *kindRun) inNetns(what string, timeout time.Duration, script string) string {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+k.netns, "bash", "-euo", "pipefail", "-c", script)
	return k.run(what, cmd)
}

func (k *kindRun) run(what string, cmd *exec.Cmd) string {
	k.t.Helper()
	logDir := "/var/cache/nftproxy/kind/logs"
	if c := os.Getenv("NFTPROXY_CACHE"); c != "" {
		logDir = filepath.Join(c, "kind", "logs")
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		k.t.Fatal(err)
	}
	name := regexp.MustCompile(`[^a-zA-Z0-9.-]+`).ReplaceAllString(what, "_")
	logf, err := os.Create(filepath.Join(logDir, "test-"+name+".log"))
	if err != nil {
		k.t.Fatal(err)
	}
	defer logf.Close()
	var stdout, tail bytes.Buffer
	cmd.Dir = k.root
	cmd.Env = k.env
	cmd.Stdout = io.MultiWriter(&stdout, logf)
	cmd.Stderr = io.MultiWriter(&tail, logf)
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err = cmd.Run()
	d := time.Since(start).Round(100 * time.Millisecond)
	k.times = append(k.times, fmt.Sprintf("%8s  %s", d, what))
	k.t.Logf("%s: %s (log %s)", what, d, logf.Name())
	if err != nil {
		k.t.Fatalf("%s: %v\n%s\n--- stdout\n%s\n--- stderr (last 4000 bytes)\n%s", what, err, strings.Join(cmd.Args, " "), lastBytes(stdout.String(), 4000), lastBytes(tail.String(), 4000))
	}
	return stdout.String()
}

func (k *kindRun) readFile(rel string) string {
	b, err := os.ReadFile(filepath.Join(k.root, rel))
	if err != nil {
		k.t.Fatal(err)
	}
	return string(b)
}

func (k *kindRun) summary() {
	k.t.Logf("wall times:\n%s\n%8s  total", strings.Join(k.times, "\n"), time.Since(k.started).Round(time.Second))
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
