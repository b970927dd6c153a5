// Command mkimage writes an OCI image-layout tarball with package ociimage, for scripts
// (e2e/hack/build-images.sh).
//
//	mkimage -o agnhost.tar -ref registry.k8s.io/e2e-test-images/agnhost:2.66.1 \
//	    -tar rootfs.tar.gz -file /agnhost=bin/agnhost -link /agnhost-2=agnhost \
//	    -mkdir /uploads -entrypoint /agnhost -cmd pause
//
// -tar and -dir add layers in the order given; -file, -link and -mkdir entries form one
// more layer on top. -file keeps the source's permission bits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/ociimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// layers keeps -tar and -dir in the order given.
type layers struct {
	kind string
	all  *[]ociimage.Layer
}

func (l layers) String() string { return "" }
func (l layers) Set(v string) error {
	if l.kind == "tar" {
		*l.all = append(*l.all, ociimage.Tar(v))
	} else {
		*l.all = append(*l.all, ociimage.Dir(v))
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var (
		img                      ociimage.Image
		out                      string
		files, links, dirs, envs list
	)
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.StringVar(&out, "o", "", "output tarball (required)")
	fs.StringVar(&img.Ref, "ref", "", "image reference, e.g. registry.k8s.io/pause:3.10.2 (required)")
	fs.Var(layers{"tar", &img.Layers}, "tar", "a layer from a tar or tar.gz file (repeatable)")
	fs.Var(layers{"dir", &img.Layers}, "dir", "a layer from a directory tree (repeatable)")
	fs.Var(&files, "file", "DEST=SRC: copy host file SRC to DEST in the top layer (repeatable)")
	fs.Var(&links, "link", "DEST=TARGET: a symbolic link in the top layer (repeatable)")
	fs.Var(&dirs, "mkdir", "DEST[:MODE]: a directory in the top layer, MODE in octal (repeatable)")
	fs.Var((*list)(&img.Config.Entrypoint), "entrypoint", "entrypoint argument (repeatable)")
	fs.Var((*list)(&img.Config.Cmd), "cmd", "cmd argument (repeatable)")
	fs.Var(&envs, "env", "KEY=value (repeatable; default "+ociimage.DefaultPath+")")
	fs.StringVar(&img.Config.User, "user", "0:0", "user")
	fs.StringVar(&img.Config.WorkingDir, "workdir", "/", "working directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if out == "" || img.Ref == "" || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("need -o and -ref, and no arguments")
	}
	if len(envs) > 0 {
		img.Config.Env = envs
	}
	var top []ociimage.File
	for _, f := range files {
		dest, src, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("-file %q: want DEST=SRC", f)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		top = append(top, ociimage.File{Path: dest, Src: src, Mode: fi.Mode().Perm()})
	}
	for _, l := range links {
		dest, target, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-link %q: want DEST=TARGET", l)
		}
		top = append(top, ociimage.File{Path: dest, Link: target})
	}
	for _, d := range dirs {
		dest, m, hasMode := strings.Cut(d, ":")
		f := ociimage.File{Path: dest, Dir: true}
		if hasMode {
			mode, err := strconv.ParseUint(m, 8, 12)
			if err != nil {
				return fmt.Errorf("-mkdir %q: mode: %w", d, err)
			}
			f.Mode = os.FileMode(mode)
		}
		top = append(top, f)
	}
	if len(top) > 0 {
		img.Layers = append(img.Layers, ociimage.Files(top...))
	}
	return ociimage.Write(out, img)
}
