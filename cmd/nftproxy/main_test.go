package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/options"
)

func TestLoggerVerbosity(t *testing.T) {
	for _, v := range []int{0, 2, 4} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, "text", v)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("Starting nftproxy", "node", "n1")
		log.V(2).Info("Synced", "services", 3, "took", 5*time.Millisecond) // the controller's per-sync line
		log.V(4).Info("Detail")
		log.Error(errors.New("boom"), "Sync failed")
		klog.V(2).InfoS("client-go v2 line")
		klog.V(5).InfoS("client-go v5 line")
		out := buf.String()
		for line, shown := range map[string]bool{
			"Starting nftproxy": true,
			"Synced":            v >= 2,
			"Detail":            v >= 4,
			"Sync failed":       true,
			"client-go v2 line": v >= 2,
			"client-go v5 line": false,
		} {
			if strings.Contains(out, line) != shown {
				t.Errorf("-v=%d: %q shown=%v, want %v; output:\n%s", v, line, !shown, shown, out)
			}
		}
		if !strings.Contains(out, "INFO") || !strings.Contains(out, "ERROR") || !strings.Contains(out, `"node": "n1"`) || !strings.Contains(out, "boom") {
			t.Errorf("-v=%d text layout:\n%s", v, out)
		}
		if strings.Contains(out, "LEVEL(") {
			t.Errorf("-v=%d: V(n) lines must read INFO:\n%s", v, out)
		}
		if v >= 2 && !strings.Contains(out, "client-go") {
			t.Errorf("klog output not named client-go:\n%s", out)
		}
	}
}

func TestLoggerJSON(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", 2)
	if err != nil {
		t.Fatal(err)
	}
	before := float64(time.Now().UnixMilli())
	log.V(2).Info("Synced", "services", 3, "took", 1500*time.Millisecond)
	log.Error(errors.New("boom"), "Sync failed")
	log.V(3).Info("hidden")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got:\n%s", buf.String())
	}
	var info, errl map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &info); err != nil {
		t.Fatalf("not JSON: %s: %v", lines[0], err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &errl); err != nil {
		t.Fatalf("not JSON: %s: %v", lines[1], err)
	}
	if info["msg"] != "Synced" || info["v"] != 2.0 || info["services"] != 3.0 || info["took"] != "1.5s" {
		t.Errorf("info line: %v", info)
	}
	if ts, ok := info["ts"].(float64); !ok || ts < before || ts > before+60_000 {
		t.Errorf("ts %v is not epoch milliseconds near %v", info["ts"], before)
	}
	if c, _ := info["caller"].(string); !strings.Contains(c, "main_test.go") {
		t.Errorf("caller %q", info["caller"])
	}
	if errl["msg"] != "Sync failed" || errl["err"] != "boom" {
		t.Errorf("error line: %v", errl)
	}
	if _, err := newLogger(&buf, "xml", 0); err == nil {
		t.Error("unknown format accepted")
	}
}

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
	if f.Values.ClusterCIDR != "10.2.0.0/16" || f.Values.SyncPeriod != 10*time.Second {
		t.Errorf("written config: %+v", f.Values)
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
