package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/options"
)

func TestConfigureWriteConfigTo(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.yaml")
	if err := os.WriteFile(in, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.1.0.0/16\nnftables: {syncPeriod: 10s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.yaml")
	var stderr bytes.Buffer
	fs, o := options.NewFlagSet()
	code, exit := configure(fs, o, []string{"--config", in, "--cluster-cidr=10.2.0.0/16", "--write-config-to", out, "--ipvs-scheduler=rr"}, &stderr)
	if code != 0 || !exit {
		t.Fatalf("code %d exit %v: %s", code, exit, stderr.String())
	}
	// Settings without effect are reported, so --write-config-to checks a file offline.
	if !strings.Contains(stderr.String(), "note: kube-proxy flag --ipvs-scheduler=rr has no effect") {
		t.Errorf("stderr lacks the note: %s", stderr.String())
	}
	f, err := config.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	// As kube-proxy, --config replaces the flag: the file's clusterCIDR is written.
	if f.Values.ClusterCIDR != "10.1.0.0/16" || f.Values.SyncPeriod != 10*time.Second {
		t.Errorf("written config: %+v", f.Values)
	}
	if !strings.Contains(stderr.String(), "--cluster-cidr is ignored: with --config the file's value is used") {
		t.Errorf("stderr lacks the note on --cluster-cidr: %s", stderr.String())
	}
}

func TestConfigureErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args   []string
		code   int
		exit   bool
		stderr string
	}{
		{[]string{"--config", bad}, 2, true, `clusterCIDR: "x" is not a CIDR`},
		{[]string{"--no-such-flag"}, 2, true, "unknown flag"},
		{[]string{"--sync-period=0"}, 2, true, "--sync-period"},
		{[]string{"--help"}, 0, true, "--write-config-to"},
		{[]string{"--write-config-to", filepath.Join(t.TempDir(), "no", "such", "dir")}, 1, true, "--write-config-to"},
		{[]string{"--hostname-override=n1"}, 0, false, ""},
	} {
		var stderr bytes.Buffer
		fs, o := options.NewFlagSet()
		code, exit := configure(fs, o, tc.args, &stderr)
		if code != tc.code || exit != tc.exit || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%q: code %d exit %v stderr %q; want %d %v %q", tc.args, code, exit, stderr.String(), tc.code, tc.exit, tc.stderr)
		}
	}
}

// A security feature gate given as a flag that contradicts --config (whose value is
// the one used) stops nftproxy before it starts: one line naming both, exit code 2.
func TestConfigureRefusesContradictingSecurityGate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.1.0.0/16\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	fs, o := options.NewFlagSet()
	code, exit := configure(fs, o, []string{"--config", file, "--feature-gates=AllowServiceExternalIPs=false"}, &stderr)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if code != 2 || !exit || len(lines) != 1 || !strings.Contains(lines[0], "--feature-gates AllowServiceExternalIPs=false contradicts --config "+file) {
		t.Errorf("code %d exit %v stderr %q; want 2, one line naming the flag and the file", code, exit, stderr.String())
	}
}
