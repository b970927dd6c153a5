// Package release tests `make release`: the artefacts it writes into dist/, that two runs
// give the same bytes, that the binaries are static and of the right architecture, and
// that a real containerd imports the image tarball as `kind load image-archive` does and
// runs it. docs/release.md.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const imageRepo = "ghcr.io/nftproxy/nftproxy"

var repo = func() string { p, _ := filepath.Abs("../.."); return p }()

func releaseVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// makeRelease runs `make release DIST=dist` and returns how long it took.
func makeRelease(t *testing.T, dist string) time.Duration {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("make", "-C", repo, "--no-print-directory", "release", "DIST="+dist)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	return time.Since(start)
}

// TestRelease builds the release twice and checks every artefact. It runs with the e2e
// suite (NFTPROXY_E2E=1): about 1-2 minutes with a warm Go build cache, and the
// cross-compiled arm64 packages take a few minutes more the first time.
func TestRelease(t *testing.T) {
	if os.Getenv("NFTPROXY_E2E") != "1" {
		t.Skip("builds the whole release twice; set NFTPROXY_E2E=1")
	}
	version := releaseVersion(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	t.Logf("make release: %v, again: %v", makeRelease(t, a), makeRelease(t, b))

	want := []string{
		"SHA256SUMS",
		"nftproxy-" + version + "-image.tar",
		"nftproxy-" + version + "-linux-amd64",
		"nftproxy-" + version + "-linux-amd64.cdx.json",
		"nftproxy-" + version + "-linux-arm64",
		"nftproxy-" + version + "-linux-arm64.cdx.json",
	}
	names := func(d string) []string {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	if got := names(a); !slices.Equal(got, want) {
		t.Fatalf("dist holds %v, want %v", got, want)
	}
	// Reproducible: the second run wrote the same bytes.
	// (Committing or editing tracked files between the two runs changes the commit or
	// tree state linked in, and so every file.)
	for _, n := range want {
		x, _ := os.ReadFile(filepath.Join(a, n))
		y, err := os.ReadFile(filepath.Join(b, n))
		if err != nil || !bytes.Equal(x, y) {
			t.Errorf("%s differs between two runs of make release (%v)", n, err)
		}
	}
	checkSums(t, a, want[1:])
	bins := map[string][]byte{}
	for _, arch := range []string{"amd64", "arm64"} {
		p := filepath.Join(a, "nftproxy-"+version+"-linux-"+arch)
		checkStatic(t, p, arch)
		bins[arch], _ = os.ReadFile(p)
		checkSBOM(t, p+".cdx.json", version)
	}
	runVersion(t, filepath.Join(a, "nftproxy-"+version+"-linux-amd64"), "", version)
	if q := qemu(); q != "" {
		runVersion(t, filepath.Join(a, "nftproxy-"+version+"-linux-arm64"), q, version)
	} else {
		t.Log("no qemu-aarch64 (Debian: qemu-user-static): the arm64 binary was not run")
	}
	image := filepath.Join(a, "nftproxy-"+version+"-image.tar")
	checkImage(t, image, version, bins)
	importIntoContainerd(t, image, version)
}

func checkSums(t *testing.T, dist string, files []string) {
	t.Helper()
	f, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var listed []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's format", sc.Text())
		}
		b, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("SHA256SUMS: %s has sha256 %x, listed %s", name, h, sum)
		}
		listed = append(listed, name)
	}
	if !slices.Equal(listed, files) {
		t.Errorf("SHA256SUMS lists %v, want %v", listed, files)
	}
}

// checkStatic: the binary is an ELF executable for arch with no interpreter and no shared
// libraries, built as make release says (CGO_ENABLED=0, -trimpath).
func checkStatic(t *testing.T, p, arch string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != machine || f.Class != elf.ELFCLASS64 || f.Type != elf.ET_EXEC {
		t.Errorf("%s: machine %v class %v type %v, want %v ELFCLASS64 ET_EXEC", filepath.Base(p), f.Machine, f.Class, f.Type, machine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header: not static", filepath.Base(p), prog.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("%s needs shared libraries %v", filepath.Base(p), libs)
	}
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	// With -trimpath the toolchain leaves -ldflags out of the build info; runVersion
	// checks the version linked in.
	if settings["GOARCH"] != arch || settings["GOOS"] != "linux" || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("%s build settings %v", filepath.Base(p), settings)
	}
	if bi.Path != "github.com/nftproxy/nftproxy/cmd/nftproxy" {
		t.Errorf("%s: main package %s", filepath.Base(p), bi.Path)
	}
}

func checkSBOM(t *testing.T, p, version string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat string `json:"bomFormat"`
		Metadata  struct {
			Component struct{ Name, Version string } `json:"component"`
		} `json:"metadata"`
		Components []struct{ Name, Version, Purl string } `json:"components"`
	}
	if err := json.Unmarshal(b, &bom); err != nil {
		t.Fatalf("%s: %v", filepath.Base(p), err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Version != version ||
		!strings.HasSuffix(bom.Metadata.Component.Name, "github.com/nftproxy/nftproxy") {
		t.Errorf("%s: format %q, component %+v", filepath.Base(p), bom.BOMFormat, bom.Metadata.Component)
	}
	found := false
	for _, c := range bom.Components {
		found = found || (strings.HasSuffix(c.Name, "k8s.io/client-go") && c.Version == "v0.37.0" && strings.HasPrefix(c.Purl, "pkg:golang/"))
	}
	if !found || len(bom.Components) < 20 {
		t.Errorf("%s: %d components, k8s.io/client-go v0.37.0 among them: %v", filepath.Base(p), len(bom.Components), found)
	}
}

func qemu() string {
	for _, q := range []string{"qemu-aarch64-static", "qemu-aarch64"} {
		if p, err := exec.LookPath(q); err == nil {
			return p
		}
	}
	return ""
}

func runVersion(t *testing.T, bin, emulator, version string) {
	t.Helper()
	args := []string{bin, "--version"}
	if emulator != "" {
		args = append([]string{emulator}, args...)
	}
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil || string(out) != "nftproxy "+version+"\n" {
		t.Errorf("%s: %v, output %q, want %q", strings.Join(args, " "), err, out, "nftproxy "+version+"\n")
	}
}

// descriptor, index, manifest and config: the parts of the OCI documents checked here.
type descriptor struct {
	MediaType   string `json:"mediaType"`
	Digest      string `json:"digest"`
	Size        int64  `json:"size"`
	Platform    *struct{ Architecture, OS string }
	Annotations map[string]string `json:"annotations"`
}

type index struct {
	Manifests []descriptor `json:"manifests"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string
		Entrypoint []string
		Labels     map[string]string
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// checkImage reads the tarball as an importer does: one named index, a manifest per
// platform, each image holding that platform's binary at /usr/local/bin/nftproxy as its
// entrypoint, user 0:0, and Docker's manifest.json naming the same image.
func checkImage(t *testing.T, p, version string, bins map[string][]byte) {
	t.Helper()
	files := readTar(t, p)
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		if h := sha256.Sum256(b); !ok || int64(len(b)) != d.Size || "sha256:"+hex.EncodeToString(h[:]) != d.Digest {
			t.Fatalf("blob %s missing or wrong (%d bytes, descriptor %d)", d.Digest, len(b), d.Size)
		}
		return b
	}
	var outer, inner index
	must(t, json.Unmarshal(files["index.json"], &outer))
	if len(outer.Manifests) != 1 || outer.Manifests[0].Annotations["io.containerd.image.name"] != imageRepo+":"+version ||
		outer.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != version {
		t.Fatalf("index.json = %s", files["index.json"])
	}
	must(t, json.Unmarshal(blob(outer.Manifests[0]), &inner))
	var platforms []string
	for _, md := range inner.Manifests {
		arch := md.Platform.Architecture
		platforms = append(platforms, md.Platform.OS+"/"+arch)
		var m struct {
			Config descriptor   `json:"config"`
			Layers []descriptor `json:"layers"`
		}
		must(t, json.Unmarshal(blob(md), &m))
		var c imageConfig
		must(t, json.Unmarshal(blob(m.Config), &c))
		if c.Architecture != arch || c.OS != "linux" || c.Config.User != "0:0" ||
			!slices.Equal(c.Config.Entrypoint, []string{"/usr/local/bin/nftproxy"}) ||
			c.Config.Labels["org.opencontainers.image.version"] != version {
			t.Errorf("%s config: %+v", arch, c)
		}
		var got []byte
		for _, l := range m.Layers {
			for name, data := range untarGz(t, blob(l)) {
				if name == "usr/local/bin/nftproxy" {
					got = data
				}
			}
		}
		if !bytes.Equal(got, bins[arch]) {
			t.Errorf("the %s image's /usr/local/bin/nftproxy is not dist's binary (%d bytes)", arch, len(got))
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v", platforms)
	}
	var docker []struct {
		Config           string
		RepoTags, Layers []string
	}
	must(t, json.Unmarshal(files["manifest.json"], &docker))
	if len(docker) != 2 {
		t.Fatalf("manifest.json = %s", files["manifest.json"])
	}
	for _, d := range docker {
		if !slices.Equal(d.RepoTags, []string{imageRepo + ":" + version}) || files[d.Config] == nil {
			t.Errorf("manifest.json entry %+v", d)
		}
	}
}

func readTar(t *testing.T, p string) map[string][]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return tarFiles(t, f)
}

func tarFiles(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			must(t, err)
			out[hdr.Name] = b
		}
	}
}

func untarGz(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	must(t, err)
	return tarFiles(t, zr)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// importIntoContainerd imports the tarball into a throwaway containerd (its own root,
// state and socket; Debian's 1.6, as the cluster harness uses) the way `kind load
// image-archive` does (`ctr -n k8s.io images import --all-platforms --digests`) and
// plainly, and runs `nftproxy --version` from the image in a container of its own.
func importIntoContainerd(t *testing.T, image, version string) {
	t.Helper()
	for _, tool := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(tool); err != nil || os.Geteuid() != 0 {
			t.Logf("not importing into containerd: needs root and %s", tool)
			return
		}
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	must(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "c.sock"),
		filepath.Join(dir, "c.sock.ttrpc"), filepath.Join(dir, "opt"))), 0o644))
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	must(t, err)
	defer logf.Close()
	cmd := exec.Command("containerd", "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command("ctr", append([]string{"--address", filepath.Join(dir, "c.sock"), "-n", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := ctr("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd did not answer within 30 s:\n%s", b)
		}
	}
	name := imageRepo + ":" + version
	for _, args := range [][]string{
		{"images", "import", "--all-platforms", "--digests", image}, // as kind load image-archive
		{"images", "import", image},
	} {
		if out, err := ctr(args...); err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		out, err := ctr("images", "ls", "name=="+name)
		if err != nil || !strings.Contains(out, name) || !strings.Contains(out, "linux/amd64,linux/arm64") {
			t.Errorf("after ctr %s, images ls: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[2] != image {
			_, _ = ctr("images", "rm", name)
		}
	}
	// A container of its own (own network namespace, nothing of the host's).
	out, err := ctr("run", "--rm", name, fmt.Sprintf("release-test-%d", os.Getpid()), "/usr/local/bin/nftproxy", "--version")
	if err != nil || strings.TrimSpace(out) != "nftproxy "+version {
		t.Errorf("ctr run %s nftproxy --version: %v, output %q", name, err, out)
	}
}
