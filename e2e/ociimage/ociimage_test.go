package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// layout is an image tarball read back: its entries and the parsed documents.
type layout struct {
	files    map[string][]byte
	index    index
	manifest manifest
	config   imageConfig
}

// readLayout reads and checks an image tarball the way an importer would: every blob is
// named by the digest of its bytes, every descriptor's size and digest match the blob.
func readLayout(t *testing.T, p string) layout {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := layout{files: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		l.files[hdr.Name] = b
	}
	if got := string(l.files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout = %q", got)
	}
	for name, b := range l.files {
		if hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexDigest {
				t.Errorf("blob %s holds bytes with digest %x", name, sum)
			}
		}
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := l.files[blobName(d.Digest)]
		if !ok {
			t.Fatalf("no blob for %s %s", d.MediaType, d.Digest)
		}
		if int64(len(b)) != d.Size {
			t.Fatalf("descriptor of %s says %d bytes, blob has %d", d.Digest, d.Size, len(b))
		}
		return b
	}
	unmarshal(t, l.files["index.json"], &l.index)
	if l.index.SchemaVersion != 2 || l.index.MediaType != MediaTypeIndex || len(l.index.Manifests) != 1 {
		t.Fatalf("index.json = %s", l.files["index.json"])
	}
	md := l.index.Manifests[0]
	if md.MediaType != MediaTypeManifest {
		t.Fatalf("manifest media type %q", md.MediaType)
	}
	unmarshal(t, blob(md), &l.manifest)
	if l.manifest.Config.MediaType != MediaTypeConfig {
		t.Fatalf("config media type %q", l.manifest.Config.MediaType)
	}
	unmarshal(t, blob(l.manifest.Config), &l.config)
	if len(l.config.RootFS.DiffIDs) != len(l.manifest.Layers) {
		t.Fatalf("%d diff_ids for %d layers", len(l.config.RootFS.DiffIDs), len(l.manifest.Layers))
	}
	for i, d := range l.manifest.Layers {
		b := blob(d)
		plain := b
		switch d.MediaType {
		case MediaTypeLayerGzip:
			plain = gunzip(t, b)
		case MediaTypeLayer:
		default:
			t.Fatalf("layer %d media type %q", i, d.MediaType)
		}
		if got := digestOf(plain); got != l.config.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: diff_id %s, uncompressed contents have digest %s", i, l.config.RootFS.DiffIDs[i], got)
		}
	}
	return l
}

func unmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return plain
}

// entry is a layer's tar entry with its contents.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// layerEntries returns layer i's entries by name (without a trailing slash).
func (l layout) layerEntries(t *testing.T, i int) map[string]entry {
	t.Helper()
	d := l.manifest.Layers[i]
	b := l.files[blobName(d.Digest)]
	if d.MediaType == MediaTypeLayerGzip {
		b = gunzip(t, b)
	}
	out := map[string]entry{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
		if _, dup := out[name]; dup {
			t.Errorf("layer %d has %q twice", i, name)
		}
		out[name] = entry{hdr, data}
	}
}

func TestWriteBinary(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "nftproxy")
	bin := bytes.Repeat([]byte("\x7fELF not really a binary "), 1000)
	if err := os.WriteFile(src, bin, 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	if err := WriteBinary(out, "nftproxy:dev", src, "/usr/local/bin/nftproxy"); err != nil {
		t.Fatal(err)
	}
	l := readLayout(t, out)

	md := l.index.Manifests[0]
	wantAnn := map[string]string{AnnotationImageName: "docker.io/library/nftproxy:dev", AnnotationRefName: "dev"}
	if !reflect.DeepEqual(md.Annotations, wantAnn) {
		t.Errorf("annotations = %v, want %v", md.Annotations, wantAnn)
	}
	if md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != "amd64" {
		t.Errorf("platform = %+v", md.Platform)
	}
	c := l.config
	if c.OS != "linux" || c.Architecture != "amd64" || c.RootFS.Type != "layers" {
		t.Errorf("config os/arch/rootfs = %s/%s/%s", c.OS, c.Architecture, c.RootFS.Type)
	}
	wantRC := runtimeConfig{User: "0:0", Env: []string{DefaultPath}, Entrypoint: []string{"/usr/local/bin/nftproxy"}, WorkingDir: "/"}
	if !reflect.DeepEqual(c.Config, wantRC) {
		t.Errorf("runtime config = %+v, want %+v", c.Config, wantRC)
	}
	if len(l.manifest.Layers) != 1 || l.manifest.Layers[0].MediaType != MediaTypeLayerGzip {
		t.Fatalf("layers = %+v", l.manifest.Layers)
	}
	entries := l.layerEntries(t, 0)
	var names []string
	for n := range entries {
		names = append(names, n)
	}
	if len(names) != 4 {
		t.Errorf("layer entries %v, want usr, usr/local, usr/local/bin, usr/local/bin/nftproxy", names)
	}
	for _, d := range []string{"usr", "usr/local", "usr/local/bin"} {
		if e, ok := entries[d]; !ok || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o755 {
			t.Errorf("directory %s: %+v", d, e.hdr)
		}
	}
	e := entries["usr/local/bin/nftproxy"]
	if e.hdr == nil || e.hdr.Typeflag != tar.TypeReg || e.hdr.Mode != 0o755 || e.hdr.Uid != 0 || e.hdr.Gid != 0 {
		t.Fatalf("binary entry %+v", e.hdr)
	}
	if !bytes.Equal(e.data, bin) {
		t.Errorf("binary in the layer differs from the source (%d bytes, want %d)", len(e.data), len(bin))
	}

	// The same inputs give the same bytes (fixed times, sorted entries), so a rebuilt
	// image keeps its digest.
	again := filepath.Join(dir, "again.tar")
	if err := WriteBinary(again, "nftproxy:dev", src, "/usr/local/bin/nftproxy"); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("writing the same image twice gave different tarballs")
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".ociimage-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func TestNormalizeRef(t *testing.T) {
	for _, tc := range []struct{ ref, name, tag string }{
		{"nftproxy:dev", "docker.io/library/nftproxy:dev", "dev"},
		{"nftproxy", "docker.io/library/nftproxy:latest", "latest"},
		{"someone/tool:1.0", "docker.io/someone/tool:1.0", "1.0"},
		{"index.docker.io/someone/tool:1.0", "docker.io/someone/tool:1.0", "1.0"},
		{"registry.k8s.io/pause:3.10.2", "registry.k8s.io/pause:3.10.2", "3.10.2"},
		{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", "registry.k8s.io/e2e-test-images/agnhost:2.66.1", "2.66.1"},
		{"registry.k8s.io/coredns/coredns:v1.14.6", "registry.k8s.io/coredns/coredns:v1.14.6", "v1.14.6"},
		{"localhost:5000/x/y", "localhost:5000/x/y:latest", "latest"},
		{"localhost/x:v1", "localhost/x:v1", "v1"},
	} {
		name, tag, err := NormalizeRef(tc.ref)
		if err != nil || name != tc.name || tag != tc.tag {
			t.Errorf("NormalizeRef(%q) = %q, %q, %v; want %q, %q", tc.ref, name, tag, err, tc.name, tc.tag)
		}
	}
	for _, ref := range []string{"", "Upper:case", "x@sha256:0123", "x:", "x:bad/tag", "/x", "x//y", "x:" + strings.Repeat("t", 129), "bad host.io/x"} {
		if name, _, err := NormalizeRef(ref); err == nil {
			t.Errorf("NormalizeRef(%q) = %q, want an error", ref, name)
		}
	}
}

func TestLayers(t *testing.T) {
	dir := t.TempDir()

	// A directory tree: a file, an executable, a symlink, a hard link, a subdirectory.
	root := filepath.Join(dir, "root")
	for _, d := range []string{"etc", "usr/bin", "empty"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("box\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "usr/bin/tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(t, os.Link(filepath.Join(root, "usr/bin/tool"), filepath.Join(root, "usr/bin/tool2")))
	must(t, os.Symlink("usr/bin", filepath.Join(root, "bin")))
	if os.Geteuid() == 0 {
		must(t, os.Lchown(filepath.Join(root, "etc/hostname"), 1000, 50000))
	}

	// A plain tar and a gzip-compressed one, as another tool would write them.
	plainTar := filepath.Join(dir, "plain.tar")
	writeTar(t, plainTar, false, map[string]string{"./opt/a.txt": "from a plain tar"})
	gzTar := filepath.Join(dir, "layer.tar.gz")
	writeTar(t, gzTar, true, map[string]string{"./opt/b.txt": "from a tar.gz"})

	src := filepath.Join(dir, "agnhost")
	must(t, os.WriteFile(src, []byte("binary"), 0o600))
	out := filepath.Join(dir, "image.tar")
	img := Image{
		Ref: "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
		Config: Config{
			User:       "1000:50000",
			Entrypoint: []string{"/agnhost"},
			Cmd:        []string{"pause"},
			Env:        []string{DefaultPath, "A=b"},
			WorkingDir: "/uploads",
		},
		Layers: []Layer{
			Dir(root),
			Tar(plainTar),
			Tar(gzTar),
			Files(
				File{Path: "/agnhost", Src: src, Mode: 0o755},
				File{Path: "/agnhost-2", Link: "agnhost"},
				File{Path: "/uploads", Dir: true, Mode: 0o1777},
				File{Path: "/etc/motd", Data: []byte("hello\n"), UID: 1000, GID: 50000},
			),
		},
	}
	must(t, Write(out, img))
	l := readLayout(t, out)

	if got := l.index.Manifests[0].Annotations[AnnotationImageName]; got != img.Ref {
		t.Errorf("image name %q, want %q", got, img.Ref)
	}
	wantRC := runtimeConfig{User: "1000:50000", Env: img.Config.Env, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, WorkingDir: "/uploads"}
	if !reflect.DeepEqual(l.config.Config, wantRC) {
		t.Errorf("runtime config = %+v, want %+v", l.config.Config, wantRC)
	}
	wantTypes := []string{MediaTypeLayerGzip, MediaTypeLayer, MediaTypeLayerGzip, MediaTypeLayerGzip}
	for i, d := range l.manifest.Layers {
		if d.MediaType != wantTypes[i] {
			t.Errorf("layer %d media type %s, want %s", i, d.MediaType, wantTypes[i])
		}
	}
	// Tar layers are stored byte for byte.
	for i, p := range map[int]string{1: plainTar, 2: gzTar} {
		b, _ := os.ReadFile(p)
		if got := l.manifest.Layers[i].Digest; got != digestOf(b) {
			t.Errorf("layer %d digest %s, the file's is %s", i, got, digestOf(b))
		}
	}
	if l.config.RootFS.DiffIDs[1] != l.manifest.Layers[1].Digest {
		t.Error("an uncompressed layer's diff_id differs from its digest")
	}

	d := l.layerEntries(t, 0)
	check := func(name string, typ byte, mode int64, data, link string) {
		t.Helper()
		e, ok := d[name]
		if !ok {
			t.Errorf("%s missing", name)
			return
		}
		if e.hdr.Typeflag != typ || e.hdr.Mode&0o7777 != mode || string(e.data) != data || e.hdr.Linkname != link {
			t.Errorf("%s: type %c mode %o data %q link %q; want %c %o %q %q", name, e.hdr.Typeflag, e.hdr.Mode, e.data, e.hdr.Linkname, typ, mode, data, link)
		}
		if e.hdr.Uname != "" || e.hdr.Gname != "" {
			t.Errorf("%s carries this machine's user names %q/%q", name, e.hdr.Uname, e.hdr.Gname)
		}
	}
	check("etc/hostname", tar.TypeReg, 0o644, "box\n", "")
	check("usr/bin/tool", tar.TypeReg, 0o755, "#!/bin/sh\necho hi\n", "")
	check("usr/bin/tool2", tar.TypeLink, 0o755, "", "usr/bin/tool")
	check("bin", tar.TypeSymlink, 0o777, "", "usr/bin")
	check("empty", tar.TypeDir, 0o755, "", "")
	if len(d) != 8 { // bin empty etc etc/hostname usr usr/bin usr/bin/tool usr/bin/tool2
		t.Errorf("directory layer has %d entries, want 8", len(d))
	}
	if os.Geteuid() == 0 {
		if h := d["etc/hostname"].hdr; h.Uid != 1000 || h.Gid != 50000 {
			t.Errorf("etc/hostname owner %d:%d, want 1000:50000", h.Uid, h.Gid)
		}
	}
	if got := string(l.layerEntries(t, 2)["opt/b.txt"].data); got != "from a tar.gz" {
		t.Errorf("gzip tar layer: opt/b.txt = %q", got)
	}

	f := l.layerEntries(t, 3)
	if e := f["agnhost-2"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeSymlink || e.hdr.Linkname != "agnhost" {
		t.Errorf("agnhost-2: %+v", e.hdr)
	}
	if e := f["uploads"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o1777 {
		t.Errorf("uploads: %+v", e.hdr)
	}
	if e := f["etc/motd"]; e.hdr == nil || string(e.data) != "hello\n" || e.hdr.Mode != 0o644 || e.hdr.Uid != 1000 || e.hdr.Gid != 50000 {
		t.Errorf("etc/motd: %+v %q", e.hdr, e.data)
	}
	if e := f["etc"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir {
		t.Errorf("etc (parent of etc/motd) missing: %+v", e.hdr)
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.tar.gz")
	must(t, os.WriteFile(garbage, []byte("\x1f\x8bthis is not gzip"), 0o644))
	truncated := filepath.Join(dir, "truncated.tar")
	writeTar(t, truncated, false, map[string]string{"a": strings.Repeat("x", 4096)})
	b, _ := os.ReadFile(truncated)
	must(t, os.WriteFile(truncated, b[:1000], 0o644))
	src := filepath.Join(dir, "bin")
	must(t, os.WriteFile(src, []byte("x"), 0o755))

	for name, img := range map[string]Image{
		"bad ref":          {Ref: "Bad:Ref/x", Layers: []Layer{Files(File{Path: "/x", Data: []byte("x")})}},
		"no layers":        {Ref: "x:1"},
		"missing src":      {Ref: "x:1", Layers: []Layer{Files(File{Path: "/x", Src: filepath.Join(dir, "nope")})}},
		"directory as src": {Ref: "x:1", Layers: []Layer{Files(File{Path: "/x", Src: dir})}},
		"relative path":    {Ref: "x:1", Layers: []Layer{Files(File{Path: "x", Src: src})}},
		"twice":            {Ref: "x:1", Layers: []Layer{Files(File{Path: "/x", Src: src}, File{Path: "/x/", Src: src})}},
		"below a file":     {Ref: "x:1", Layers: []Layer{Files(File{Path: "/x", Src: src}, File{Path: "/x/y", Src: src})}},
		"empty entry":      {Ref: "x:1", Layers: []Layer{Files(File{Path: "/x"})}},
		"missing dir":      {Ref: "x:1", Layers: []Layer{Dir(filepath.Join(dir, "nope"))}},
		"not gzip":         {Ref: "x:1", Layers: []Layer{Tar(garbage)}},
		"truncated tar":    {Ref: "x:1", Layers: []Layer{Tar(truncated)}},
		"not a tar":        {Ref: "x:1", Layers: []Layer{Tar(src)}},
	} {
		out := filepath.Join(dir, "out.tar")
		if err := Write(out, img); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: output file exists after a failed write", name)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".ociimage-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writeTar writes a tar (gzip-compressed if compress) of the given files with GNU tar's
// "./" names when it is installed, else with archive/tar.
func writeTar(t *testing.T, p string, compress bool, files map[string]string) {
	t.Helper()
	if _, err := exec.LookPath("tar"); err == nil {
		src := t.TempDir()
		for name, data := range files {
			must(t, os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755))
			must(t, os.WriteFile(filepath.Join(src, name), []byte(data), 0o644))
		}
		flags := "-cf"
		if compress {
			flags = "-czf"
		}
		if out, err := exec.Command("tar", "--numeric-owner", "-C", src, flags, p, ".").CombinedOutput(); err != nil {
			t.Fatalf("tar: %v: %s", err, out)
		}
		return
	}
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if compress {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for name, data := range files {
		must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}))
		_, err := tw.Write([]byte(data))
		must(t, err)
	}
	must(t, tw.Close())
	if zw != nil {
		must(t, zw.Close())
	}
	must(t, os.WriteFile(p, buf.Bytes(), 0o644))
}
