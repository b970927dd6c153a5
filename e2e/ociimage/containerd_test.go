package ociimage

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// kernelTestsRequired mirrors internal/testnetns.Required: with NFTPROXY_KERNEL_TESTS=1 (CI)
// a missing privilege or tool fails the test instead of skipping it.
func kernelTestsRequired() bool { return os.Getenv("NFTPROXY_KERNEL_TESTS") == "1" }

func needRootAndTools(t *testing.T, tools ...string) {
	t.Helper()
	missing := ""
	if os.Geteuid() != 0 {
		missing = "root"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = tool + " (Debian: apt-get install containerd runc)"
		}
	}
	if missing == "" {
		return
	}
	if kernelTestsRequired() {
		t.Fatalf("test needs %s", missing)
	}
	t.Skipf("test needs %s (set NFTPROXY_KERNEL_TESTS=1 to require it)", missing)
}

// containerd is a throwaway containerd with its own root, state and socket.
type containerd struct {
	t       *testing.T
	address string
}

func startContainerd(t *testing.T) *containerd {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	// The CRI plugin is off: it would look for CNI and serve kubelets; import and run
	// need only the content store, snapshotter and runc shim.
	conf := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "c.sock"),
		filepath.Join(dir, "c.sock.ttrpc"), filepath.Join(dir, "opt"))
	must(t, os.WriteFile(cfg, []byte(conf), 0o644))
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	must(t, err)
	cmd := exec.Command("containerd", "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := &containerd{t: t, address: filepath.Join(dir, "c.sock")}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("containerd log (last 4 KiB):\n%s", tail(b, 4096))
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := c.ctrErr("version"); err == nil {
			return c
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd exited: %v\n%s", err, tail(b, 4096))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd did not answer within 30 s")
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (c *containerd) ctrErr(args ...string) (string, error) {
	out, err := exec.Command("ctr", append([]string{"--address", c.address, "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

func (c *containerd) ctr(args ...string) string {
	c.t.Helper()
	out, err := c.ctrErr(args...)
	if err != nil {
		c.t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestContainerdImport loads images written by this package into a real containerd
// (Debian's 1.6, as the cluster harness uses it), checks the names they get, and runs
// the pause program from one of them.
func TestContainerdImport(t *testing.T) {
	needRootAndTools(t, "containerd", "ctr", "containerd-shim-runc-v2", "runc", "go")
	dir := t.TempDir()
	pause := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-trimpath", "-o", pause, "./cmd/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pause: %v\n%s", err, out)
	}
	pauseTar := filepath.Join(dir, "pause.tar")
	must(t, WriteBinary(pauseTar, "registry.k8s.io/pause:3.10.2", pause, "/pause"))
	// Every kind of layer: containerd's unpacker checks each applied layer against its
	// diff_id, so a wrong one fails the import.
	tree := filepath.Join(dir, "tree")
	must(t, os.MkdirAll(filepath.Join(tree, "etc/nftproxy"), 0o755))
	must(t, os.WriteFile(filepath.Join(tree, "etc/nftproxy/a.conf"), []byte("a\n"), 0o644))
	must(t, os.Symlink("a.conf", filepath.Join(tree, "etc/nftproxy/b.conf")))
	plainTar := filepath.Join(dir, "plain.tar")
	writeTar(t, plainTar, false, map[string]string{"./opt/plain.txt": "plain"})
	gzTar := filepath.Join(dir, "layer.tar.gz")
	writeTar(t, gzTar, true, map[string]string{"./opt/gz.txt": "gz"})
	devTar := filepath.Join(dir, "dev.tar")
	must(t, Write(devTar, Image{
		Ref:    "nftproxy:dev",
		Config: Config{Entrypoint: []string{"/usr/local/bin/nftproxy"}, Cmd: []string{"--help"}},
		Layers: []Layer{
			Dir(tree),
			Tar(plainTar),
			Tar(gzTar),
			Files(File{Path: "/usr/local/bin/nftproxy", Src: pause, Mode: 0o755}),
		},
	}))

	c := startContainerd(t)
	for _, p := range []string{pauseTar, devTar} {
		out := c.ctr("images", "import", p)
		if !strings.Contains(out, "done") {
			t.Errorf("import %s did not unpack:\n%s", filepath.Base(p), out)
		}
	}
	refs := strings.Fields(c.ctr("images", "ls", "-q"))
	for _, want := range []string{"registry.k8s.io/pause:3.10.2", "docker.io/library/nftproxy:dev"} {
		found := false
		for _, r := range refs {
			found = found || r == want
		}
		if !found {
			t.Errorf("ctr images ls: %v, want %s among them", refs, want)
		}
	}
	if t.Failed() {
		return
	}

	// Run the pause image (its own network namespace, nothing shared with the host),
	// stop it with SIGTERM and expect exit status 0.
	id := fmt.Sprintf("ociimage-test-%d", os.Getpid())
	run := exec.Command("ctr", "--address", c.address, "-n", "k8s.io", "run", "--rm", "registry.k8s.io/pause:3.10.2", id)
	// A file, not a pipe: Wait must not depend on every process that may inherit the
	// output closing it.
	runOut, err := os.Create(filepath.Join(dir, "run.out"))
	must(t, err)
	defer runOut.Close()
	run.Stdout, run.Stderr = runOut, runOut
	output := func() string { b, _ := os.ReadFile(runOut.Name()); return string(b) }
	must(t, run.Start())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = run.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = run.Process.Kill()
			<-done
		}
	})
	running := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !running; time.Sleep(200 * time.Millisecond) {
		out, _ := c.ctrErr("task", "ls")
		running = strings.Contains(out, id) && strings.Contains(out, "RUNNING")
	}
	if !running {
		t.Fatalf("pause container never ran:\n%s", output())
	}
	c.ctr("task", "kill", "-s", "SIGTERM", id)
	select {
	case <-done:
		if runErr != nil {
			t.Fatalf("ctr run: %v (want exit status 0 after SIGTERM)\n%s", runErr, output())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("pause did not exit within 20 s of SIGTERM\n%s", output())
	}
	if !strings.Contains(output(), "pause: terminated") {
		t.Errorf("pause's output %q, want its exit message", output())
	}
}

// TestContainerdRefusesWrongDiffID shows that the import above checks the layers: the same
// kind of image with a diff_id that does not match its layer is refused at unpack.
func TestContainerdRefusesWrongDiffID(t *testing.T) {
	needRootAndTools(t, "containerd", "ctr")
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tar")
	must(t, Write(good, Image{Ref: "nftproxy:bad", Layers: []Layer{Files(File{Path: "/x", Data: []byte("x")})}}))
	bad := filepath.Join(dir, "bad.tar")
	rewriteConfig(t, good, bad, func(c *imageConfig) { c.RootFS.DiffIDs[0] = digestOf([]byte("something else")) })

	c := startContainerd(t)
	c.ctr("images", "import", good) // the unchanged image imports
	c.ctr("images", "rm", "docker.io/library/nftproxy:bad")
	out, err := c.ctrErr("images", "import", bad)
	if err == nil {
		t.Fatalf("containerd imported an image with a wrong diff_id:\n%s", out)
	}
	if !strings.Contains(out, "wrong diff id") {
		t.Fatalf("import failed for another reason than the diff_id: %v\n%s", err, out)
	}
	t.Logf("refused as expected: %v\n%s", err, out)
}

// rewriteConfig copies the image tarball in to out with its config changed by edit, and
// the manifest and index updated to the new digests.
func rewriteConfig(t *testing.T, in, out string, edit func(*imageConfig)) {
	t.Helper()
	l := readLayout(t, in)
	edit(&l.config)
	cfg, err := json.Marshal(l.config)
	must(t, err)
	l.manifest.Config.Digest, l.manifest.Config.Size = digestOf(cfg), int64(len(cfg))
	m, err := json.Marshal(l.manifest)
	must(t, err)
	l.index.Manifests[0].Digest, l.index.Manifests[0].Size = digestOf(m), int64(len(m))
	idx, err := json.Marshal(l.index)
	must(t, err)
	files := map[string][]byte{"oci-layout": l.files["oci-layout"], "index.json": idx, blobName(digestOf(cfg)): cfg, blobName(digestOf(m)): m}
	for _, d := range l.manifest.Layers {
		files[blobName(d.Digest)] = l.files[blobName(d.Digest)]
	}
	f, err := os.Create(out)
	must(t, err)
	defer f.Close()
	tw := tar.NewWriter(f)
	for name, b := range files {
		must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b))}))
		_, err := tw.Write(b)
		must(t, err)
	}
	must(t, tw.Close())
}
