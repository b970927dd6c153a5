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
	Env        []string // "KEY=value"; nil means []string{DefaultPath}
	WorkingDir string   // empty means "/"
}

// Image is what Write puts in one tarball.
type Image struct {
	Ref    string // e.g. "registry.k8s.io/pause:3.10.2" or "nftproxy:dev"
	Config Config
	Layers []Layer // bottom first
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
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
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
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Config       runtimeConfig `json:"config"`
	RootFS       rootFS        `json:"rootfs"`
}

type runtimeConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
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
	if len(img.Layers) == 0 {
		return errors.New("ociimage: an image needs at least one layer")
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	defer os.RemoveAll(tmp)

	var layers []blob
	for i, l := range img.Layers {
		b, err := l.build(filepath.Join(tmp, fmt.Sprintf("layer%d", i)))
		if err != nil {
			return fmt.Errorf("ociimage: %s: layer %d: %w", img.Ref, i, err)
		}
		layers = append(layers, b)
	}

	cfg := imageConfig{
		Architecture: "amd64",
		OS:           "linux",
		Config: runtimeConfig{
			User:       img.Config.User,
			Env:        img.Config.Env,
			Entrypoint: img.Config.Entrypoint,
			Cmd:        img.Config.Cmd,
			WorkingDir: img.Config.WorkingDir,
		},
		RootFS: rootFS{Type: "layers"},
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
	for _, l := range layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.diffID)
		m.Layers = append(m.Layers, descriptor{MediaType: l.mediaType, Digest: l.digest, Size: l.size})
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	m.Config = descriptor{MediaType: MediaTypeConfig, Digest: digestOf(cfgJSON), Size: int64(len(cfgJSON))}
	mJSON, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	idx := index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []descriptor{{
		MediaType:   MediaTypeManifest,
		Digest:      digestOf(mJSON),
		Size:        int64(len(mJSON)),
		Platform:    &platform{Architecture: "amd64", OS: "linux"},
		Annotations: map[string]string{AnnotationImageName: name, AnnotationRefName: tag},
	}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}

	part := filepath.Join(tmp, "image.tar")
	f, err := os.Create(part)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	bytesEntry := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	steps := []func() error{
		func() error { return bytesEntry("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
		func() error { return dir("blobs/") },
		func() error { return dir("blobs/sha256/") },
	}
	written := map[string]bool{}
	for _, l := range layers {
		steps = append(steps, func() error {
			if written[l.digest] { // the same layer twice in one image
				return nil
			}
			written[l.digest] = true
			return copyEntry(tw, blobName(l.digest), l.path, l.size)
		})
	}
	steps = append(steps,
		func() error { return bytesEntry(blobName(m.Config.Digest), cfgJSON) },
		func() error { return bytesEntry(blobName(idx.Manifests[0].Digest), mJSON) },
		func() error { return bytesEntry("index.json", idxJSON) },
		tw.Close, bw.Flush, f.Sync, f.Close,
	)
	for _, step := range steps {
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
