// Package ociimage writes container images as OCI image-layout tarballs, so that a test
// cluster can load them with `ctr -n k8s.io images import` and run pods without any
// registry.
//
// A tarball holds oci-layout, index.json and blobs/sha256/<hex>: one linux/amd64 manifest,
// its config (User, Entrypoint, Cmd, Env, WorkingDir and the layers' diff_ids) and the
// layers. The manifest's descriptor in index.json carries the annotations containerd's
// importer names images by: io.containerd.image.name with the full normalized reference
// ("nftproxy:dev" becomes "docker.io/library/nftproxy:dev") and
// org.opencontainers.image.ref.name with the tag, as containerd's own exporter writes.
//
// Layers come from a directory tree (Dir), a list of files, links and directories
// (Files), or an existing tar or tar.gz used as it is (Tar), so a cached Debian root
// filesystem and a freshly built binary make one image:
//
//	err := ociimage.Write("agnhost.tar", ociimage.Image{
//		Ref:    "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
//		Config: ociimage.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
//		Layers: []ociimage.Layer{
//			ociimage.Tar("rootfs.tar.gz"),
//			ociimage.Files(ociimage.File{Path: "/agnhost", Src: "bin/agnhost", Mode: 0o755}),
//		},
//	})
//
// WriteBinary is the one-layer case: a static binary as the image's entrypoint.
// The helper programs under cmd/ are a pause binary and mkimage, the command-line form
// of Write that e2e/hack/build-images.sh uses.
package ociimage

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Media types and annotation keys of the OCI image spec and containerd.
const (
	MediaTypeIndex     = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest  = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig    = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer     = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip"

	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// DefaultPath is the PATH an image gets when its Config has no Env.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is the modification time of everything this package makes up itself (blobs in the
// layout, entries of a Files layer), so that the same inputs give the same digests.
var epoch = time.Unix(0, 0).UTC()

// Config is the runtime part of an image's configuration.
type Config struct {
	User       string   // "uid:gid" or a name; empty means "0:0"
	Entrypoint []string // absolute paths, as a container runtime execs them
	Cmd        []string
	Env        []string          // "KEY=value"; nil means []string{DefaultPath}
	WorkingDir string            // empty means "/"
	Labels     map[string]string // e.g. org.opencontainers.image.version; none if nil
	Created    time.Time         // the config's "created"; left out if zero
}

// Image is what Write puts in one tarball.
type Image struct {
	Ref      string   // e.g. "registry.k8s.io/pause:3.10.2" or "nftproxy:dev"
	Platform Platform // empty fields mean linux and amd64
	Config   Config
	Layers   []Layer // bottom first
}

// Layer is one filesystem layer; make it with Dir, Files or Tar.
type Layer struct {
	dir   string
	files []File
	tar   string
}

// Dir is a layer holding the tree under root (root itself becomes "/"), with the owners,
// modes, modification times, symbolic links, hard links and device nodes found there.
// Sockets and named pipes are left out.
func Dir(root string) Layer { return Layer{dir: root} }

// Files is a layer holding the given entries; directories leading to them are added
// (root-owned, 0755) unless listed.
func Files(files ...File) Layer { return Layer{files: files} }

// Tar is a layer read from an existing tarball, plain or gzip-compressed, stored as it is.
func Tar(path string) Layer { return Layer{tar: path} }

// File is one entry of a Files layer.
type File struct {
	Path     string      // absolute path in the image, e.g. "/agnhost"
	Src      string      // host file to copy, or
	Data     []byte      // the contents (used when Src is empty)
	Link     string      // if set, the entry is a symbolic link to Link
	Dir      bool        // if set, the entry is a directory
	Mode     fs.FileMode // Unix mode bits (0o1777 or fs.ModeSticky|0o777 alike); 0 means 0755 for directories and Src files, 0644 for Data
	UID, GID int
}

// WriteBinary writes to out an image named ref with one layer holding the static binary
// src at path dest (mode 0755), run as user 0:0 with Entrypoint [dest].
func WriteBinary(out, ref, src, dest string) error {
	return Write(out, Image{
		Ref:    ref,
		Config: Config{User: "0:0", Entrypoint: []string{dest}},
		Layers: []Layer{Files(File{Path: dest, Src: src, Mode: 0o755})},
	})
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is the operating system and CPU an image runs on, as in an image index.
type Platform struct {
	Architecture string `json:"architecture"` // GOARCH: amd64, arm64, ...
	OS           string `json:"os"`           // GOOS: linux
	Variant      string `json:"variant,omitempty"`
}

// String is "os/arch" or "os/arch/variant".
func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Created      string        `json:"created,omitempty"`
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Variant      string        `json:"variant,omitempty"`
	Config       runtimeConfig `json:"config"`
	RootFS       rootFS        `json:"rootfs"`
}

type runtimeConfig struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// blob is a layer ready to be copied into the layout.
type blob struct {
	path      string // file holding the bytes
	mediaType string
	digest    string // of the stored bytes
	diffID    string // of the uncompressed tar
	size      int64
}

// Write writes img to the file out as an OCI image-layout tarball. The file appears
// complete or not at all (it is written next to out and renamed).
func Write(out string, img Image) (err error) {
	name, tag, err := NormalizeRef(img.Ref)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	defer os.RemoveAll(tmp)
	b, err := img.build(tmp, "")
	if err != nil {
		return err
	}
	b.desc.Annotations = map[string]string{AnnotationImageName: name, AnnotationRefName: tag}
	idxJSON, err := json.Marshal(index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []descriptor{b.desc}})
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	entries := []member{
		{name: "oci-layout", data: []byte(ociLayout)},
		{name: "blobs/", dir: true},
		{name: "blobs/sha256/", dir: true},
	}
	written := map[string]bool{}
	for _, l := range b.layers {
		if written[l.digest] { // the same layer twice in one image
			continue
		}
		written[l.digest] = true
		entries = append(entries, member{name: blobName(l.digest), path: l.path, size: l.size})
	}
	entries = append(entries,
		member{name: blobName(b.cfgDigest), data: b.cfgJSON},
		member{name: blobName(b.desc.Digest), data: b.mJSON},
		member{name: "index.json", data: idxJSON},
	)
	return writeArchive(out, filepath.Join(tmp, "image.tar"), entries)
}

// Index is one name for several images, one per platform: a multi-architecture image.
type Index struct {
	Ref    string  // e.g. "ghcr.io/nftproxy/nftproxy:v0.1.0"
	Images []Image // each with its own Platform, no two alike; their Ref is not used
}

// WriteIndex writes idx to the file out as one OCI image-layout tarball that containerd
// (`ctr images import`, also with --all-platforms as `kind load image-archive` runs it),
// podman and Docker load. index.json holds one descriptor, named by the same annotations as
// Write's, of an image index that lists one manifest per platform: a runtime picks its own
// platform from it, as from a registry. For Docker's classic image store, which reads only
// a docker-archive manifest.json, the tarball carries that too, with one entry per platform,
// all tagged with the name; Docker tags the last entry it loads (or the one
// `docker load --platform` selects), so the entries are in the reverse order of Images:
// the first image, the default platform, comes last. Entries are sorted by name and the
// same inputs give a byte-identical tarball.
func WriteIndex(out string, idx Index) error {
	name, tag, err := NormalizeRef(idx.Ref)
	if err != nil {
		return err
	}
	if len(idx.Images) == 0 {
		return errors.New("ociimage: an index needs at least one image")
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	defer os.RemoveAll(tmp)

	blobs := map[string]member{}
	inner := index{SchemaVersion: 2, MediaType: MediaTypeIndex}
	type dockerEntry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var docker []dockerEntry
	seen := map[string]bool{}
	for i, img := range idx.Images {
		b, err := img.build(tmp, fmt.Sprintf("image%d-", i))
		if err != nil {
			return err
		}
		p := b.desc.Platform.String()
		if seen[p] {
			return fmt.Errorf("ociimage: %s: platform %s given twice", idx.Ref, p)
		}
		seen[p] = true
		inner.Manifests = append(inner.Manifests, b.desc)
		d := dockerEntry{Config: blobName(b.cfgDigest), RepoTags: []string{dockerTag(name)}}
		for _, l := range b.layers {
			blobs[l.digest] = member{name: blobName(l.digest), path: l.path, size: l.size}
			d.Layers = append(d.Layers, blobName(l.digest))
		}
		blobs[b.cfgDigest] = member{name: blobName(b.cfgDigest), data: b.cfgJSON}
		blobs[b.desc.Digest] = member{name: blobName(b.desc.Digest), data: b.mJSON}
		docker = append([]dockerEntry{d}, docker...)
	}
	innerJSON, err := json.Marshal(inner)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	innerDigest := digestOf(innerJSON)
	blobs[innerDigest] = member{name: blobName(innerDigest), data: innerJSON}
	outer := index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []descriptor{{
		MediaType:   MediaTypeIndex,
		Digest:      innerDigest,
		Size:        int64(len(innerJSON)),
		Annotations: map[string]string{AnnotationImageName: name, AnnotationRefName: tag},
	}}}
	outerJSON, err := json.Marshal(outer)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	dockerJSON, err := json.Marshal(docker)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	entries := []member{{name: "blobs/", dir: true}, {name: "blobs/sha256/", dir: true}}
	names := make([]string, 0, len(blobs))
	for d := range blobs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		entries = append(entries, blobs[d])
	}
	entries = append(entries,
		member{name: "index.json", data: outerJSON},
		member{name: "manifest.json", data: dockerJSON},
		member{name: "oci-layout", data: []byte(ociLayout)},
	)
	return writeArchive(out, filepath.Join(tmp, "image.tar"), entries)
}

// dockerTag is the name Docker's RepoTags use: the normalized reference without the
// docker.io/library/ that Docker leaves implicit.
func dockerTag(normalized string) string {
	if s, ok := strings.CutPrefix(normalized, "docker.io/library/"); ok {
		return s
	}
	return strings.TrimPrefix(normalized, "docker.io/")
}

const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// built is one image's blobs, ready to be written into a layout.
type built struct {
	layers    []blob
	cfgJSON   []byte
	cfgDigest string
	mJSON     []byte
	desc      descriptor // of the manifest, with its platform
}

// build makes img's layers (files named prefix+"layerN" in tmp), config and manifest.
func (img Image) build(tmp, prefix string) (built, error) {
	if len(img.Layers) == 0 {
		return built{}, errors.New("ociimage: an image needs at least one layer")
	}
	plat := img.Platform
	if plat.OS == "" {
		plat.OS = "linux"
	}
	if plat.Architecture == "" {
		plat.Architecture = "amd64"
	}
	if !platformRE.MatchString(plat.OS) || !platformRE.MatchString(plat.Architecture) || (plat.Variant != "" && !platformRE.MatchString(plat.Variant)) {
		return built{}, fmt.Errorf("ociimage: platform %q: want lower-case letters and digits", plat.String())
	}
	var b built
	for i, l := range img.Layers {
		lb, err := l.build(filepath.Join(tmp, fmt.Sprintf("%slayer%d", prefix, i)))
		if err != nil {
			return built{}, fmt.Errorf("ociimage: %s: layer %d: %w", img.Ref, i, err)
		}
		b.layers = append(b.layers, lb)
	}

	cfg := imageConfig{
		Architecture: plat.Architecture,
		OS:           plat.OS,
		Variant:      plat.Variant,
		Config: runtimeConfig{
			User:       img.Config.User,
			Env:        img.Config.Env,
			Entrypoint: img.Config.Entrypoint,
			Cmd:        img.Config.Cmd,
			WorkingDir: img.Config.WorkingDir,
			Labels:     img.Config.Labels,
		},
		RootFS: rootFS{Type: "layers"},
	}
	if !img.Config.Created.IsZero() {
		cfg.Created = img.Config.Created.UTC().Format(time.RFC3339)
	}
	if cfg.Config.User == "" {
		cfg.Config.User = "0:0"
	}
	if cfg.Config.Env == nil {
		cfg.Config.Env = []string{DefaultPath}
	}
	if cfg.Config.WorkingDir == "" {
		cfg.Config.WorkingDir = "/"
	}
	m := manifest{SchemaVersion: 2, MediaType: MediaTypeManifest}
	for _, l := range b.layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.diffID)
		m.Layers = append(m.Layers, descriptor{MediaType: l.mediaType, Digest: l.digest, Size: l.size})
	}
	var err error
	if b.cfgJSON, err = json.Marshal(cfg); err != nil {
		return built{}, fmt.Errorf("ociimage: %w", err)
	}
	b.cfgDigest = digestOf(b.cfgJSON)
	m.Config = descriptor{MediaType: MediaTypeConfig, Digest: b.cfgDigest, Size: int64(len(b.cfgJSON))}
	if b.mJSON, err = json.Marshal(m); err != nil {
		return built{}, fmt.Errorf("ociimage: %w", err)
	}
	b.desc = descriptor{
		MediaType: MediaTypeManifest,
		Digest:    digestOf(b.mJSON),
		Size:      int64(len(b.mJSON)),
		Platform:  &plat,
	}
	return b, nil
}

var platformRE = regexp.MustCompile(`^[a-z0-9]+$`)

// member is one member of a layout tarball: a directory, bytes, or a file's contents.
type member struct {
	name string
	dir  bool
	data []byte
	path string // file to copy, size bytes long, when data is nil
	size int64
}

// writeArchive writes the entries, in order, to the tar file part, then renames it to out.
func writeArchive(out, part string, entries []member) error {
	f, err := os.Create(part)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	write := func(e member) error {
		switch {
		case e.dir:
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: e.name, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
		case e.data != nil:
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return err
			}
			_, err := tw.Write(e.data)
			return err
		default:
			return copyEntry(tw, e.name, e.path, e.size)
		}
	}
	for _, e := range entries {
		if err := write(e); err != nil {
			return fmt.Errorf("ociimage: writing %s: %w", out, err)
		}
	}
	for _, step := range []func() error{tw.Close, bw.Flush, f.Sync, f.Close} {
		if err := step(); err != nil {
			return fmt.Errorf("ociimage: writing %s: %w", out, err)
		}
	}
	if err := os.Rename(part, out); err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	return nil
}

func blobName(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func hashDigest(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// copyEntry adds the file src, which must be size bytes long, as entry name.
func copyEntry(tw *tar.Writer, name, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != size {
		err = fmt.Errorf("%s changed size while being written (%d, then %d bytes)", src, size, n)
	}
	return err
}

// build turns the layer into a blob, writing a gzip-compressed tar to tmp unless the layer
// is an existing tarball.
func (l Layer) build(tmp string) (blob, error) {
	if l.tar != "" {
		return tarBlob(l.tar)
	}
	f, err := os.Create(tmp)
	if err != nil {
		return blob{}, err
	}
	defer f.Close()
	stored := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, stored), 1<<20)
	gz := gzip.NewWriter(bw)
	plain := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(gz, plain))
	switch {
	case l.dir != "":
		err = writeDir(tw, l.dir)
	default:
		err = writeFiles(tw, l.files)
	}
	for _, step := range []func() error{tw.Close, gz.Close, bw.Flush, f.Close} {
		if err != nil {
			return blob{}, err
		}
		err = step()
	}
	if err != nil {
		return blob{}, err
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		return blob{}, err
	}
	return blob{path: tmp, mediaType: MediaTypeLayerGzip, digest: hashDigest(stored), diffID: hashDigest(plain), size: fi.Size()}, nil
}

// tarBlob describes an existing tarball: its digest, and for a gzip-compressed one the
// digest of the tar inside.
func tarBlob(p string) (blob, error) {
	f, err := os.Open(p)
	if err != nil {
		return blob{}, err
	}
	defer f.Close()
	stored := sha256.New()
	br := bufio.NewReaderSize(io.TeeReader(f, stored), 1<<20)
	magic, _ := br.Peek(2)
	b := blob{path: p, mediaType: MediaTypeLayer}
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		b.mediaType = MediaTypeLayerGzip
		gz, err := gzip.NewReader(br)
		if err != nil {
			return blob{}, fmt.Errorf("%s: %w", p, err)
		}
		plain := sha256.New()
		if err := checkTar(io.TeeReader(gz, plain)); err != nil {
			return blob{}, fmt.Errorf("%s: %w", p, err)
		}
		if _, err := io.Copy(io.Discard, br); err != nil { // any bytes after the gzip stream
			return blob{}, fmt.Errorf("%s: %w", p, err)
		}
		b.diffID = hashDigest(plain)
	} else {
		if err := checkTar(br); err != nil {
			return blob{}, fmt.Errorf("%s: %w", p, err)
		}
		if _, err := io.Copy(io.Discard, br); err != nil {
			return blob{}, fmt.Errorf("%s: %w", p, err)
		}
	}
	b.digest = hashDigest(stored)
	fi, err := f.Stat()
	if err != nil {
		return blob{}, err
	}
	b.size = fi.Size()
	if b.mediaType == MediaTypeLayer {
		b.diffID = b.digest
	}
	return b, nil
}

// checkTar reads r to its end as a tar stream, so that a truncated or foreign file fails
// here rather than in containerd.
func checkTar(r io.Reader) error {
	tr := tar.NewReader(r)
	n := 0
	for {
		_, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("not a valid tar: %w", err)
		}
		n++
	}
	if n == 0 {
		return errors.New("empty tar")
	}
	_, err := io.Copy(io.Discard, r) // the zero blocks' padding, so the digest covers it
	return err
}

// writeDir adds the tree under root to tw, in lexical order.
func writeDir(tw *tar.Writer, root string) error {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSocket|fs.ModeNamedPipe) != 0 {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		// Names of the image's own users, not this machine's.
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if fi.Mode().IsRegular() && st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if first, ok := seen[key]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
					return tw.WriteHeader(hdr)
				}
				seen[key] = hdr.Name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		return copyFile(tw, p, hdr.Size)
	})
}

func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s shrank while being read (%d of %d bytes)", p, n, size)
	}
	return err
}

// writeFiles adds the entries, and the directories leading to them, sorted by path.
func writeFiles(tw *tar.Writer, files []File) error {
	entries := map[string]File{}
	for _, f := range files {
		clean := path.Clean("/" + f.Path)
		if clean == "/" || !strings.HasPrefix(f.Path, "/") {
			return fmt.Errorf("file path %q: want an absolute path below /", f.Path)
		}
		if _, dup := entries[clean]; dup {
			return fmt.Errorf("file path %q listed twice", f.Path)
		}
		if f.Src == "" && f.Link == "" && !f.Dir && f.Data == nil {
			return fmt.Errorf("file %q: no Src, Data, Link or Dir", f.Path)
		}
		entries[clean] = f
	}
	for p := range entries {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if e, ok := entries[d]; ok {
				if !e.Dir {
					return fmt.Errorf("%q is below %q, which is not a directory", p, d)
				}
				continue
			}
			entries[d] = File{Path: d, Dir: true}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		f := entries[p]
		hdr := &tar.Header{Name: p[1:], Uid: f.UID, Gid: f.GID, ModTime: epoch, Format: tar.FormatPAX}
		mode := int64(f.Mode & 0o7777)
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if mode == 0 {
				mode = 0o755
			}
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, mode = tar.TypeSymlink, f.Link, 0o777
		case f.Src != "":
			fi, err := os.Stat(f.Src)
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("%s: not a regular file", f.Src)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if mode == 0 {
				mode = 0o755
			}
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
			if mode == 0 {
				mode = 0o644
			}
		}
		hdr.Mode = mode
		if f.Mode&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		if f.Mode&fs.ModeSetgid != 0 {
			hdr.Mode |= 0o2000
		}
		if f.Mode&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		switch {
		case hdr.Typeflag == tar.TypeReg && f.Src != "":
			if err := copyFile(tw, f.Src, hdr.Size); err != nil {
				return err
			}
		case hdr.Typeflag == tar.TypeReg:
			if _, err := tw.Write(f.Data); err != nil {
				return err
			}
		}
	}
	return nil
}

var (
	domainRE = regexp.MustCompile(`^(localhost|[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*)(:[0-9]+)?$`)
	pathRE   = regexp.MustCompile(`^[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$`)
	tagRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// NormalizeRef returns the full name containerd gives a reference, as Docker normalizes
// it ("nftproxy:dev" is "docker.io/library/nftproxy:dev"; a missing tag is "latest"),
// and its tag. References by digest are refused: an image written here has no digest
// before it is written.
func NormalizeRef(ref string) (name, tag string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("ociimage: image reference %q: %s", ref, why)
	}
	if strings.Contains(ref, "@") {
		return bad("digests are not supported, give a tag")
	}
	repo, tag := ref, "latest"
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		repo, tag = ref[:i], ref[i+1:]
	}
	if !tagRE.MatchString(tag) {
		return bad("invalid tag")
	}
	domain, rest := "docker.io", repo
	if i := strings.Index(repo, "/"); i >= 0 {
		first := repo[:i]
		if strings.ContainsAny(first, ".:") || first == "localhost" {
			domain, rest = first, repo[i+1:]
		}
	}
	if !domainRE.MatchString(domain) {
		return bad("invalid registry host")
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	if domain == "docker.io" && !strings.Contains(rest, "/") {
		rest = "library/" + rest
	}
	if !pathRE.MatchString(rest) {
		return bad("invalid repository name (lower-case letters, digits and separators)")
	}
	return domain + "/" + rest + ":" + tag, tag, nil
}
