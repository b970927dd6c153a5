package options

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/internal/config"
)

// kubeProxy is the kube-proxy v1.37.0 binary that produced the goldens in
// testdata/kube-proxy-config (e2e/hack/build-k8s.sh builds it there).
var kubeProxy = flag.String("kube-proxy", "/var/cache/nftproxy/k8s-v1.37.0-v2/kube-proxy", "kube-proxy v1.37 binary for TestWriteConfigMatchesKubeProxy")

// writeConfigCases are command lines given to both kube-proxy (with
// --proxy-mode=nftables) and nftproxy with --write-config-to. file, when set, is a
// --config file (written to the test's directory, as config.yaml).
var writeConfigCases = []struct {
	name string
	args []string
	file string
}{
	{name: "defaults"},
	{name: "flags", args: []string{
		"--cluster-cidr=10.244.0.0/16,fd00:244::/56", "--nodeport-addresses=primary,10.0.0.0/8,localhost",
		"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth", "--pod-bridge-interface=cbr0",
		"--masquerade-all", "--iptables-masquerade-bit=9", "--iptables-sync-period=10s", "--iptables-min-sync-period=2s",
		"--conntrack-min=7", "--conntrack-max-per-core=0", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s",
		"--hostname-override=Node-1", "-v=3", "--logging-format=json",
		"--healthz-bind-address=0.0.0.0:12345", "--metrics-bind-address=127.0.0.1:9999",
		"--kube-api-qps=20", "--kube-api-burst=40", "--kube-api-content-type=application/json", "--kubeconfig=/etc/kc",
		"--feature-gates=AllowServiceExternalIPs=false",
	}},
	// --config with flags: kube-proxy v1.37's precedence, the file's values except -v,
	// --logging-format and --hostname-override (a security gate flag that contradicts
	// the file is refused, TestFeatureGateAllowServiceExternalIPs: this one agrees)
	{name: "config-and-flags", args: []string{
		"--cluster-cidr=10.9.0.0/16", "--detect-local-mode=BridgeInterface", "--pod-bridge-interface=br9",
		"--iptables-sync-period=45s", "--conntrack-min=9", "--masquerade-all", "--kubeconfig=/flag/kc",
		"--nodeport-addresses=all", "--feature-gates=AllowServiceExternalIPs=true",
		"-v=4", "--hostname-override=From-Flag",
	}, file: `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: /file/kc, qps: 50}
hostnameOverride: from-file
clusterCIDR: 10.1.0.0/16
detectLocalMode: NodeCIDR
nodePortAddresses: [192.0.2.0/24]
nftables: {masqueradeBit: 12, syncPeriod: 20s, minSyncPeriod: 3s}
conntrack: {maxPerCore: 1000, tcpBeLiberal: true}
logging: {verbosity: 2, format: json}
`},
}

// TestWriteConfigMatchesKubeProxy: nftproxy --write-config-to writes what kube-proxy
// v1.37 --proxy-mode=nftables --write-config-to writes for the same command line
// (the detect-local settings too): the same defaults, and with --config the same
// precedence. The goldens in testdata/kube-proxy-config are kube-proxy's output; when
// the kube-proxy binary is present (-kube-proxy) it is run again and must still produce them
// (-update rewrites them from it).
func TestWriteConfigMatchesKubeProxy(t *testing.T) {
	_, err := os.Stat(*kubeProxy)
	haveKubeProxy := err == nil
	if !haveKubeProxy {
		t.Logf("no kube-proxy binary at %s: comparing with the checked-in goldens only", *kubeProxy)
	}
	for _, tc := range writeConfigCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--proxy-mode=nftables"}, tc.args...)
			if tc.file != "" {
				path := filepath.Join(dir, "config.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config="+path)
			}
			golden := filepath.Join("testdata", "kube-proxy-config", tc.name+".yaml")
			if haveKubeProxy {
				out := filepath.Join(dir, "kube-proxy.yaml")
				cmd := exec.Command(*kubeProxy, append(args, "--write-config-to="+out)...)
				if msg, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("kube-proxy %q: %v\n%s", args, err, msg)
				}
				got, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				if *update {
					if err := os.WriteFile(golden, got, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, _ := os.ReadFile(golden)
				if !bytes.Equal(got, want) {
					t.Errorf("kube-proxy's output differs from %s (run with -update):\n%s", golden, got)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			fs, o := NewFlagSet()
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(fs); err != nil {
				t.Fatal(err)
			}
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := config.Encode(&buf, o.EffectiveConfig()); err != nil {
				t.Fatal(err)
			}
			if diff := yamlDiff(t, want, buf.Bytes()); diff != "" {
				t.Errorf("nftproxy --write-config-to differs from kube-proxy's (%s):\n%s", golden, diff)
			}
		})
	}
}

// yamlDiff lists the leaves where two YAML documents differ, "" if none.
func yamlDiff(t *testing.T, want, got []byte) string {
	t.Helper()
	leaves := func(doc []byte) map[string]string {
		var m any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var walk func(prefix string, v any)
		walk = func(prefix string, v any) {
			if mm, ok := v.(map[string]any); ok && len(mm) > 0 {
				for k, sub := range mm {
					walk(strings.TrimPrefix(prefix+"."+k, "."), sub)
				}
				return
			}
			js, _ := json.Marshal(v)
			out[prefix] = string(js)
		}
		walk("", m)
		return out
	}
	w, g := leaves(want), leaves(got)
	var diffs []string
	for k := range w {
		if w[k] != g[k] {
			diffs = append(diffs, fmt.Sprintf("%s: kube-proxy %s, nftproxy %s", k, w[k], g[k]))
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: kube-proxy (none), nftproxy %s", k, g[k]))
		}
	}
	sort.Strings(diffs)
	if reflect.DeepEqual(w, g) {
		return ""
	}
	return strings.Join(diffs, "\n")
}
