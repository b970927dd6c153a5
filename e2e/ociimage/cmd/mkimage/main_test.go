package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// readImage returns an image tarball's runtime config and its layers'
// media types and entries (name -> header).
func readImage(t *testing.T, p string) (cfg map[string]any, mediaTypes []string, layers []map[string]*tar.Header) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[hdr.Name] = b
	}
	type desc struct{ MediaType, Digest string }
	blob := func(d desc) []byte { return files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")] }
	var idx struct{ Manifests []desc }
	var m struct {
		Config desc
		Layers []desc
	}
	var c struct{ Config map[string]any }
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blob(idx.Manifests[0]), &m); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blob(m.Config), &c); err != nil {
		t.Fatal(err)
	}
	for _, l := range m.Layers {
		mediaTypes = append(mediaTypes, l.MediaType)
		var r io.Reader = strings.NewReader(string(blob(l)))
		if strings.HasSuffix(l.MediaType, "+gzip") {
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		entries := map[string]*tar.Header{}
		ltr := tar.NewReader(r)
		for {
			hdr, err := ltr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entries[strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")] = hdr
		}
		layers = append(layers, entries)
	}
	return c.Config, mediaTypes, layers
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "etc/from-dir"), []byte("d"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A plain tar for -tar.
	plain := filepath.Join(dir, "plain.tar")
	{
		f, _ := os.Create(plain)
		tw := tar.NewWriter(f)
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "opt/from-tar", Mode: 0o644, Size: 1})
		_, _ = tw.Write([]byte("t"))
		_ = tw.Close()
		f.Close()
	}
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	err := run([]string{
		"-o", out, "-ref", "example.com/tool:v1",
		"-dir", tree, "-tar", plain,
		"-file", "/usr/bin/tool=" + bin, "-link", "/tool=usr/bin/tool", "-mkdir", "/uploads:1777",
		"-entrypoint", "/usr/bin/tool", "-entrypoint", "--flag", "-cmd", "serve",
		"-env", "PATH=/usr/bin", "-env", "A=1", "-user", "1000:1000", "-workdir", "/uploads",
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, types, layers := readImage(t, out)
	want := map[string]any{
		"User": "1000:1000", "WorkingDir": "/uploads",
		"Entrypoint": []any{"/usr/bin/tool", "--flag"}, "Cmd": []any{"serve"},
		"Env": []any{"PATH=/usr/bin", "A=1"},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config %v, want %v", cfg, want)
	}
	// Layers in flag order (-dir, -tar), then the files.
	wantTypes := []string{"application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip"}
	if !reflect.DeepEqual(types, wantTypes) {
		t.Fatalf("layer media types %v, want %v", types, wantTypes)
	}
	if layers[0]["etc/from-dir"] == nil || layers[1]["opt/from-tar"] == nil {
		t.Errorf("-dir or -tar layer lacks its file: %v %v", layers[0], layers[1])
	}
	top := layers[2]
	if h := top["usr/bin/tool"]; h == nil || h.Mode != 0o750 {
		t.Errorf("-file keeps the source's mode 0750: %+v", h)
	}
	if h := top["tool"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin/tool" {
		t.Errorf("-link: %+v", h)
	}
	if h := top["uploads"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
		t.Errorf("-mkdir /uploads:1777: %+v", h)
	}

	for _, args := range [][]string{
		{"-ref", "x:1", "-file", "/x=" + bin},              // no -o
		{"-o", out + "2", "-file", "/x=" + bin},            // no -ref
		{"-o", out + "2", "-ref", "x:1", "-file", bin},     // no DEST=
		{"-o", out + "2", "-ref", "x:1", "-link", "/x"},    // no =TARGET
		{"-o", out + "2", "-ref", "x:1", "-mkdir", "/x:9"}, // not octal
		{"-o", out + "2", "-ref", "x:1"},                   // no layers
		{"-o", out + "2", "-ref", "x:1", "-tar", bin},      // not a tar
		{"-o", out + "2", "-ref", "x:1", "-file", "/x=" + bin, "extra"},
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
		if _, err := os.Stat(out + "2"); !os.IsNotExist(err) {
			t.Errorf("run(%q) left an output file", args)
		}
	}
}
