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

// TestOnlyNftTalksNfTables: the libraries that speak nf_tables over netlink are
// imported by packages under nft/ only, so that the whole wire protocol (sockets,
// attribute layouts, the ruleset generation) has one home (nft/wire) and its users
// (nft/kernel, nft/monitor, nft/readback). Other netlink families (conntrack,
// addresses: github.com/vishvananda/netlink) are not nf_tables and are not covered, nor
// is the test harness under e2e/ (never built into nftproxy; e2e/shapes writes candidate
// rulesets through google/nftables as "another program" would).
func TestOnlyNftTalksNfTables(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not found")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}", "github.com/nftproxy/nftproxy/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	nfTables := []string{"github.com/google/nftables", "github.com/mdlayher/netlink"}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "|")
		if !strings.HasPrefix(pkg, "github.com/nftproxy/nftproxy/") {
			continue
		}
		checked++
		if strings.HasPrefix(pkg, "github.com/nftproxy/nftproxy/nft/") || strings.HasPrefix(pkg, "github.com/nftproxy/nftproxy/e2e/") {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			for _, lib := range nfTables {
				if imp == lib || strings.HasPrefix(imp, lib+"/") {
					t.Errorf("%s imports %s: only packages under nft/ may speak nf_tables", pkg, imp)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d of our packages listed: the check saw nothing", checked)
	}
}

// TestInspectImportRules: internal/inspect is the commands' logic below the wiring. It
// reads tables back and traces rulesets it is handed; it lists no API (client-go), runs
// no proxy (internal/controller, nor what is built on it: internal/serve, this command)
// and writes nothing to the kernel (nft/kernel, nft/monitor). It reads the table's
// objects through internal/compile's layout, which no other of its imports replaces.
func TestInspectImportRules(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not found")
	}
	const inspect = "github.com/nftproxy/nftproxy/internal/inspect"
	out, err := exec.Command("go", "list", "-deps", inspect).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, inspect) || !slices.Contains(deps, "github.com/nftproxy/nftproxy/internal/compile") {
		t.Fatalf("go list -deps %s saw neither it nor internal/compile: %q", inspect, deps)
	}
	for _, dep := range deps {
		for _, banned := range []string{
			"github.com/nftproxy/nftproxy/internal/controller",
			"github.com/nftproxy/nftproxy/internal/serve",
			"github.com/nftproxy/nftproxy/cmd",
			"github.com/nftproxy/nftproxy/nft/kernel",
			"github.com/nftproxy/nftproxy/nft/monitor",
			"k8s.io/client-go",
		} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("%s depends on %s", inspect, dep)
			}
		}
	}
}
