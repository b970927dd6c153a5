package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNeverStartsAProcess: nftproxy talks to the kernel over netlink and never runs nft,
// iptables or anything else. None of our packages may import os/exec (or the raw
// fork/exec calls), and the only dependencies that import os/exec are the allowlisted
// ones below, whose exec paths nftproxy never takes by itself.
func TestNeverStartsAProcess(t *testing.T) {
	allowed := []string{
		// kubeconfig exec credential plugins: only when an operator's kubeconfig asks
		// for one (the in-cluster DaemonSet uses its ServiceAccount token).
		"k8s.io/client-go/plugin/pkg/client/auth/exec",
		// OpenAPI document compiler plugins, reachable only through gnostic's compiler
		// API, which nftproxy does not call.
		"github.com/google/gnostic-models/compiler",
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not found")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var importers []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "|")
		own := strings.HasPrefix(pkg, "github.com/nftproxy/nftproxy")
		for _, imp := range strings.Fields(imports) {
			if imp == "os/exec" {
				importers = append(importers, pkg)
			}
			if own && imp == "os/exec" {
				t.Errorf("%s imports os/exec", pkg)
			}
		}
	}
	// The raw calls cannot be seen in imports: scan our own non-test sources.
	for _, dir := range []string{"../../cmd", "../../internal", "../../nft"} {
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, call := range []string{"ForkExec", "syscall.Exec", "StartProcess", "unix.Exec"} {
				if strings.Contains(string(src), call) {
					t.Errorf("%s uses %s", path, call)
				}
			}
			return nil
		})
	}
	for _, p := range importers {
		if !slices.Contains(allowed, p) {
			t.Errorf("%s imports os/exec: review it and extend the allowlist only if nftproxy never reaches its exec path", p)
		}
	}
}
