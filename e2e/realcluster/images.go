package realcluster

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Image references the cluster uses (contract A: e2e/hack/build-images.sh prints them).
const (
	PauseImage     = "registry.k8s.io/pause:3.10.2"
	AgnhostImage   = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	KubeProxyImage = "registry.k8s.io/kube-proxy:v1.37.0"
	corednsPrefix  = "registry.k8s.io/coredns/coredns:"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

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
	script := filepath.Join(e2eDir(), "hack", "build-images.sh")
	if _, err := os.Stat(script); err != nil {
		return stopgapImages(ctx)
	}
	out, err := scriptOutput(ctx, script)
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

// stopgapImages builds the base images without e2e/hack/build-images.sh (until helper
// "images" lands it): pause and agnhost from the agnhost binary, agnhost with a static
// busybox for the shell tools the e2e tests exec, kube-proxy with the host's nft and
// conntrack and their libraries. No CoreDNS.
func stopgapImages(ctx context.Context) (map[string]string, error) {
	dir := filepath.Join(cacheDir(), "realcluster-stopgap-images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	bins, err := k8sBinaries(ctx, "agnhost", "kube-proxy")
	if err != nil {
		return nil, err
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("stopgap agnhost image needs a static busybox (apt-get install busybox-static): %w", err)
	}
	tools := []string{"ping", "ip", "cat", "ls", "sleep", "echo", "grep", "sed", "awk", "test", "[", "ps", "hostname", "nslookup", "timeout", "date", "env", "printf", "true", "false", "mkdir", "rm", "touch", "head", "tail", "wc", "tr", "cut", "expr", "seq", "id", "uname", "kill", "netstat"}
	agn := []file{{Src: bins[0], Dest: "/agnhost", Mode: 0o755}, {Src: busybox, Dest: "/bin/busybox", Mode: 0o755}}
	for _, t := range tools {
		agn = append(agn, file{Link: "/bin/busybox", Dest: "/bin/" + t})
	}
	agn = append(agn, file{Dest: "/tmp", Dir: true}, file{Dest: "/etc/hosts", Data: []byte("127.0.0.1 localhost\n")},
		file{Dest: "/etc/nsswitch.conf", Data: []byte("hosts: files dns\n")})
	// busybox's own wget (static glibc) crashes; the host's curl, wget, nc (OpenBSD) and
	// dig with their libraries instead, as the e2e tests call them.
	// busybox's sh runs its own applets before PATH: dash is /bin/sh.
	for _, tool := range []string{"/usr/bin/dash", "/usr/bin/curl", "/usr/bin/wget", "/usr/bin/nc.openbsd", "/usr/bin/dig"} {
		fs, err := withLibraries(ctx, tool)
		if err != nil {
			return nil, fmt.Errorf("stopgap agnhost image: %w (apt-get install curl wget netcat-openbsd dnsutils)", err)
		}
		agn = append(agn, fs...)
	}
	agn = append(agn, file{Dest: "/usr/bin/nc", Link: "/usr/bin/nc.openbsd"}, file{Dest: "/bin/sh", Link: "/usr/bin/dash"})

	kp := []file{{Src: bins[1], Dest: "/usr/local/bin/kube-proxy", Mode: 0o755}, {Dest: "/tmp", Dir: true}}
	for _, tool := range []string{"/usr/sbin/nft", "/usr/sbin/conntrack"} {
		fs, err := withLibraries(ctx, tool)
		if err != nil {
			return nil, err
		}
		kp = append(kp, fs...)
	}
	imgs := map[string]string{
		PauseImage:     filepath.Join(dir, "pause.tar"),
		AgnhostImage:   filepath.Join(dir, "agnhost.tar"),
		KubeProxyImage: filepath.Join(dir, "kube-proxy.tar"),
	}
	specs := map[string]struct {
		files []file
		entry []string
	}{
		PauseImage:     {[]file{{Src: bins[0], Dest: "/agnhost", Mode: 0o755}}, []string{"/agnhost", "pause"}},
		AgnhostImage:   {agn, []string{"/agnhost"}},
		KubeProxyImage: {kp, []string{"/usr/local/bin/kube-proxy"}},
	}
	// CoreDNS, if built by hand into the stopgap cache (go build github.com/coredns/coredns).
	if bin := filepath.Join(cacheDir(), "realcluster-stopgap-coredns", "coredns"); fileExists(bin) {
		ref := corednsPrefix + "v1.14.6"
		imgs[ref] = filepath.Join(dir, "coredns.tar")
		specs[ref] = struct {
			files []file
			entry []string
		}{[]file{{Src: bin, Dest: "/coredns", Mode: 0o755}}, []string{"/coredns"}}
	}
	for ref, s := range specs {
		if err := writeImage(imgs[ref], ref, s.files, s.entry); err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
	}
	return imgs, nil
}

// withLibraries is a dynamically linked host binary plus the shared libraries ldd names.
func withLibraries(ctx context.Context, bin string) ([]file, error) {
	out, err := run(ctx, "ldd", bin)
	if err != nil {
		return nil, err
	}
	fs := []file{{Src: bin, Dest: bin, Mode: 0o755}}
	for _, line := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				real, err := filepath.EvalSymlinks(f)
				if err != nil {
					return nil, err
				}
				fs = append(fs, file{Src: real, Dest: f, Mode: 0o755})
			}
		}
	}
	return fs, nil
}

// file is one entry of an image layer: a host file (Src), literal Data, a symlink to
// Link, or a directory.
type file struct {
	Src, Dest, Link string
	Data            []byte
	Mode            int64
	Dir             bool
}

// writeImage writes an OCI image-layout tarball with one uncompressed layer, tagged ref
// as `ctr images import` reads it.
func writeImage(out, ref string, files []file, entrypoint []string) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	sort.SliceStable(files, func(i, j int) bool { return files[i].Dest < files[j].Dest })
	uniq := files[:0:0]
	for i, f := range files {
		if i == 0 || f.Dest != files[i-1].Dest {
			uniq = append(uniq, f)
		}
	}
	files = uniq
	mtime := time.Unix(0, 0)
	for _, f := range files {
		name := strings.TrimPrefix(f.Dest, "/")
		for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var dl []string
	for d := range dirs {
		dl = append(dl, d)
	}
	sort.Strings(dl)
	for _, d := range dl {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	for _, f := range files {
		name := strings.TrimPrefix(f.Dest, "/")
		switch {
		case f.Dir:
			if dirs[name] {
				continue
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o1777, ModTime: mtime}); err != nil {
				return err
			}
		case f.Link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777, ModTime: mtime}); err != nil {
				return err
			}
		default:
			data := f.Data
			if f.Src != "" {
				var err error
				if data, err = os.ReadFile(f.Src); err != nil {
					return err
				}
			}
			mode := f.Mode
			if mode == 0 {
				mode = 0o644
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: mtime}); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerDigest := digest(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"User": "0:0", "Entrypoint": entrypoint,
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layer.Len()}},
	})
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest),
			"annotations": map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref},
		}},
	})
	tmp := out + ".tmp" + randHex(4) // parallel runs each write their own
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	otw := tar.NewWriter(f)
	add := func(name string, b []byte) error {
		if err := otw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := otw.Write(b)
		return err
	}
	blob := func(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:") }
	for _, e := range []struct {
		name string
		b    []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(manifest), manifest},
		{blob(config), config},
		{blob(layer.Bytes()), layer.Bytes()},
	} {
		if err := add(e.name, e.b); err != nil {
			f.Close()
			return err
		}
	}
	if err := otw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
