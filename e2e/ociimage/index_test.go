package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// indexFixture writes a two-platform index: a shared base layer and one binary per
// architecture, with labels and a creation time.
func indexFixture(t *testing.T, dir string) (out string, bins map[string][]byte, idx Index) {
	t.Helper()
	bins = map[string][]byte{}
	created := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	idx = Index{Ref: "ghcr.io/nftproxy/nftproxy:v0.1.0"}
	for _, arch := range []string{"amd64", "arm64"} {
		src := filepath.Join(dir, "nftproxy-"+arch)
		bins[arch] = bytes.Repeat([]byte("binary for "+arch+" "), 500)
		if err := os.WriteFile(src, bins[arch], 0o755); err != nil {
			t.Fatal(err)
		}
		idx.Images = append(idx.Images, Image{
			Platform: Platform{OS: "linux", Architecture: arch},
			Config: Config{User: "0:0", Entrypoint: []string{"/usr/local/bin/nftproxy"},
				Labels: map[string]string{"org.opencontainers.image.version": "v0.1.0"}, Created: created},
			Layers: []Layer{
				Files(File{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\n")}, File{Path: "/tmp", Dir: true, Mode: 0o1777}),
				Files(File{Path: "/usr/local/bin/nftproxy", Src: src, Mode: 0o755}),
			},
		})
	}
	out = filepath.Join(dir, "index.tar")
	if err := WriteIndex(out, idx); err != nil {
		t.Fatal(err)
	}
	return out, bins, idx
}

func TestWriteIndex(t *testing.T) {
	dir := t.TempDir()
	out, bins, idx := indexFixture(t, dir)

	// Entries: sorted by name, every blob named by its digest, nothing but the layout.
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	var names []string
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !hdr.ModTime.Equal(epoch) || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s: time %v, owner %d:%d", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid)
		}
		names = append(names, hdr.Name)
		b, _ := io.ReadAll(tr)
		files[hdr.Name] = b
	}
	if !slices.IsSorted(names) {
		t.Errorf("entries not sorted: %v", names)
	}
	for name, b := range files {
		if h, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && h != "" && digestOf(b) != "sha256:"+h {
			t.Errorf("blob %s has digest %s", name, digestOf(b))
		}
	}
	// 1 shared base layer, 2 binary layers, 2 configs, 2 manifests, 1 inner index.
	if n := len(names) - 5; n != 8 {
		t.Errorf("%d blobs, want 8 (the base layer once): %v", n, names)
	}

	// index.json: one descriptor, of an index, named as containerd and podman read it.
	var outer index
	unmarshal(t, files["index.json"], &outer)
	if len(outer.Manifests) != 1 || outer.Manifests[0].MediaType != MediaTypeIndex {
		t.Fatalf("index.json = %s", files["index.json"])
	}
	wantAnn := map[string]string{AnnotationImageName: "ghcr.io/nftproxy/nftproxy:v0.1.0", AnnotationRefName: "v0.1.0"}
	if !reflect.DeepEqual(outer.Manifests[0].Annotations, wantAnn) {
		t.Errorf("annotations %v, want %v", outer.Manifests[0].Annotations, wantAnn)
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := files[blobName(d.Digest)]
		if !ok || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: present %v, %d bytes, descriptor says %d", d.Digest, ok, len(b), d.Size)
		}
		return b
	}
	var inner index
	unmarshal(t, blob(outer.Manifests[0]), &inner)
	if len(inner.Manifests) != 2 {
		t.Fatalf("inner index = %+v", inner)
	}
	configs := map[string]string{} // arch -> config blob name
	layers := map[string][]string{}
	for i, md := range inner.Manifests {
		arch := idx.Images[i].Platform.Architecture
		if md.MediaType != MediaTypeManifest || md.Platform == nil || *md.Platform != (Platform{OS: "linux", Architecture: arch}) {
			t.Errorf("manifest %d: %+v platform %+v", i, md, md.Platform)
		}
		var m manifest
		unmarshal(t, blob(md), &m)
		var c imageConfig
		unmarshal(t, blob(m.Config), &c)
		if c.Architecture != arch || c.OS != "linux" || c.Created != "2026-12-01T12:00:00Z" ||
			c.Config.Labels["org.opencontainers.image.version"] != "v0.1.0" || c.Config.User != "0:0" ||
			!slices.Equal(c.Config.Entrypoint, []string{"/usr/local/bin/nftproxy"}) {
			t.Errorf("%s config %+v", arch, c)
		}
		if len(m.Layers) != 2 || len(c.RootFS.DiffIDs) != 2 {
			t.Fatalf("%s: %d layers, %d diff_ids", arch, len(m.Layers), len(c.RootFS.DiffIDs))
		}
		for j, l := range m.Layers {
			plain := gunzip(t, blob(l))
			if digestOf(plain) != c.RootFS.DiffIDs[j] {
				t.Errorf("%s layer %d: diff_id mismatch", arch, j)
			}
			layers[arch] = append(layers[arch], blobName(l.Digest))
			if j == 1 {
				ltr := tar.NewReader(bytes.NewReader(plain))
				var got []byte
				for {
					hdr, err := ltr.Next()
					if err != nil {
						break
					}
					if hdr.Name == "usr/local/bin/nftproxy" {
						got, _ = io.ReadAll(ltr)
					}
				}
				if !bytes.Equal(got, bins[arch]) {
					t.Errorf("%s image holds the wrong binary (%d bytes)", arch, len(got))
				}
			}
		}
		configs[arch] = blobName(m.Config.Digest)
	}
	if layers["amd64"][0] != layers["arm64"][0] {
		t.Error("the base layer is not shared between the platforms")
	}

	// manifest.json for Docker's classic store: the default platform (first) last.
	type dockerEntry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var docker []dockerEntry
	unmarshal(t, files["manifest.json"], &docker)
	want := []dockerEntry{
		{Config: configs["arm64"], RepoTags: []string{"ghcr.io/nftproxy/nftproxy:v0.1.0"}, Layers: layers["arm64"]},
		{Config: configs["amd64"], RepoTags: []string{"ghcr.io/nftproxy/nftproxy:v0.1.0"}, Layers: layers["amd64"]},
	}
	if !reflect.DeepEqual(docker, want) {
		t.Errorf("manifest.json = %+v\nwant %+v", docker, want)
	}

	// Reproducible: the same inputs, byte for byte.
	again := filepath.Join(dir, "again.tar")
	if err := WriteIndex(again, idx); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("writing the same index twice gave different tarballs")
	}
}

func TestWriteIndexBadInput(t *testing.T) {
	dir := t.TempDir()
	layer := Files(File{Path: "/x", Data: []byte("x")})
	for name, idx := range map[string]Index{
		"no images":     {Ref: "a:b"},
		"bad ref":       {Ref: "A:b", Images: []Image{{Layers: []Layer{layer}}}},
		"same platform": {Ref: "a:b", Images: []Image{{Layers: []Layer{layer}}, {Platform: Platform{OS: "linux", Architecture: "amd64"}, Layers: []Layer{layer}}}},
		"bad platform":  {Ref: "a:b", Images: []Image{{Platform: Platform{Architecture: "ARM 64"}, Layers: []Layer{layer}}}},
		"no layers":     {Ref: "a:b", Images: []Image{{}}},
	} {
		out := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".tar")
		if err := WriteIndex(out, idx); err == nil {
			t.Errorf("%s: no error", name)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: a tarball was written", name)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".ociimage-*")); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}
