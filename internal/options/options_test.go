package options

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/config"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	data := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + body
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// parse runs what main does: Parse, Complete, Validate.
func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	fs, o := NewFlagSet()
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := o.Complete(fs); err != nil {
		return o, err
	}
	return o, o.Validate()
}

func TestDefaultsWithoutConfig(t *testing.T) {
	o, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Values{
		KubeAPIQPS: 5, KubeAPIBurst: 10, KubeAPIContentType: "application/vnd.kubernetes.protobuf",
		MasqueradeBit: 14, IPTablesMasqueradeBit: 14, SyncPeriod: 30 * time.Second, MinSyncPeriod: time.Second,
		HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "127.0.0.1:10249",
		DetectLocalMode: "ClusterCIDR", LoggingFormat: "text", Conntrack: config.DefaultConntrack(),
	}
	if got := o.Values(); !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
	}
	// The flag defaults are kube-proxy's configuration defaults.
	d := config.Defaulted()
	if d.ClientConnection.QPS != want.KubeAPIQPS || d.ClientConnection.Burst != want.KubeAPIBurst ||
		*d.NFTables.MasqueradeBit != want.MasqueradeBit || d.NFTables.SyncPeriod.Duration != want.SyncPeriod ||
		d.NFTables.MinSyncPeriod.Duration != want.MinSyncPeriod || d.HealthzBindAddress != want.HealthzBindAddress ||
		d.MetricsBindAddress != want.MetricsBindAddress {
		t.Errorf("flag defaults differ from kube-proxy's config defaults: %+v", d)
	}
}

// With --config, kube-proxy v1.37's precedence: the file replaces the flags of every
// setting it holds (flags given are reported as ignored), except the logging flags and a
// non-empty --hostname-override, which win over the file (options.go Complete,
// copyLogsFromFlags, processHostnameOverrideFlag upstream).
func TestConfigFileAndFlagPrecedence(t *testing.T) {
	path := writeFile(t, `
clientConnection: {kubeconfig: /from/file, qps: 50, burst: 100}
hostnameOverride: file-node
clusterCIDR: 10.1.0.0/16
nodePortAddresses: [192.0.2.0/24]
nftables: {masqueradeAll: true, masqueradeBit: 9, syncPeriod: 10s, minSyncPeriod: 2s}
healthzBindAddress: 127.0.0.1:1111
metricsBindAddress: 127.0.0.1:2222
logging: {verbosity: 3, format: json}
`)
	o, err := parse(t, "--config", path,
		"--cluster-cidr", "10.2.0.0/16", // ignored: the file's
		"--iptables-masquerade-bit=14",     // ignored
		"--iptables-min-sync-period=500ms", // ignored
		"--detect-local-mode=NodeCIDR",     // ignored (its help says so upstream)
		"--conntrack-min=7",                // ignored
		"--kubeconfig=/from/flag",          // ignored
		"-v=1",                             // wins
		"--logging-format=text",            // wins
		"--hostname-override=Flag-Node ",   // wins
	)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Values{
		Kubeconfig: "/from/file", KubeAPIQPS: 50, KubeAPIBurst: 100,
		KubeAPIContentType: "application/vnd.kubernetes.protobuf",
		HostnameOverride:   "flag-node", ClusterCIDR: "10.1.0.0/16", NodePortAddresses: []string{"192.0.2.0/24"},
		MasqueradeAll: true, MasqueradeBit: 9, IPTablesMasqueradeBit: 14, SyncPeriod: 10 * time.Second, MinSyncPeriod: 2 * time.Second,
		HealthzBindAddress: "127.0.0.1:1111", MetricsBindAddress: "127.0.0.1:2222",
		Verbosity: 1, LoggingFormat: "text", Conntrack: config.DefaultConntrack(),
	}
	if got := o.Values(); !reflect.DeepEqual(got, want) {
		t.Errorf("effective:\n got %+v\nwant %+v", got, want)
	}
	if name, _ := o.NodeName(); name != "flag-node" {
		t.Errorf("node name %q, want flag-node", name)
	}
	if fmt.Sprint(o.ClusterCIDRs) != "[10.1.0.0/16]" || o.DetectLocal.Mode != compile.LocalClusterCIDR || fmt.Sprint(o.DetectLocal.ClusterCIDRs) != "[10.1.0.0/16]" {
		t.Errorf("typed values not the file's: %v %+v", o.ClusterCIDRs, o.DetectLocal)
	}
	notes := strings.Join(o.Notes(), "\n")
	for _, f := range []string{"cluster-cidr", "iptables-masquerade-bit", "iptables-min-sync-period", "detect-local-mode", "conntrack-min", "kubeconfig"} {
		if !strings.Contains(notes, "--"+f+" is ignored: with --config the file's value is used") {
			t.Errorf("no note that --%s is ignored:\n%s", f, notes)
		}
	}
	for _, f := range []string{"--v ", "--logging-format", "--hostname-override"} {
		if strings.Contains(notes, f+" is ignored") {
			t.Errorf("%s reported ignored:\n%s", f, notes)
		}
	}
	// An empty --hostname-override leaves the file's; a blank one is an error (kube-proxy's).
	if o, err := parse(t, "--config", path, "--hostname-override="); err != nil || o.HostnameOverride != "file-node" {
		t.Errorf("empty --hostname-override: %v %q, want the file's", err, o.HostnameOverride)
	}
	if _, err := parse(t, "--config", path, "--hostname-override=  "); err == nil || !strings.Contains(err.Error(), "empty hostname-override is invalid") {
		t.Errorf("blank --hostname-override: %v", err)
	}
	// Without --config the flags are the configuration.
	o, err = parse(t, "--cluster-cidr", "10.2.0.0/16", "--conntrack-min=7")
	if err != nil || fmt.Sprint(o.ClusterCIDRs) != "[10.2.0.0/16]" || o.Conntrack.Min != 7 {
		t.Errorf("flags alone: %v %v %d", err, o.ClusterCIDRs, o.Conntrack.Min)
	}
}

func TestSyncPeriodAliases(t *testing.T) {
	for _, flag := range []string{"--sync-period", "--iptables-sync-period", "--nftables-sync-period"} {
		o, err := parse(t, flag+"=45s")
		if err != nil {
			t.Fatal(err)
		}
		if o.SyncPeriod != 45*time.Second {
			t.Errorf("%s: SyncPeriod = %v", flag, o.SyncPeriod)
		}
		if strings.Contains(strings.Join(o.Notes(), "\n"), "sync-period") {
			t.Errorf("%s reported as having no effect: %q", flag, o.Notes())
		}
	}
}

func TestInvalidConfigFileNamesField(t *testing.T) {
	path := writeFile(t, "clusterCIDR: x\n")
	_, err := parse(t, "--config", path)
	if err == nil || !strings.Contains(err.Error(), `clusterCIDR: "x" is not a CIDR`) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v, want one naming the file and clusterCIDR", err)
	}
	// An invalid file value is an error even when a flag overrides it: the file is wrong.
	_, err = parse(t, "--config", path, "--cluster-cidr", "10.0.0.0/8")
	if err == nil {
		t.Fatal("invalid file accepted because a flag overrode the field")
	}
	if _, err := parse(t, "--config", filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestNotesReportIgnoredFlagsAndFields(t *testing.T) {
	path := writeFile(t, "mode: ipvs\nnodePortAddresses: [localhost, 10.0.0.0/8]\n")
	o, err := parse(t, "--proxy-mode=iptables", "--ipvs-strict-arp", "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(o.Notes(), "\n")
	for _, want := range []string{
		"--proxy-mode=iptables has no effect",
		"--ipvs-strict-arp=true has no effect",
		`mode: "ipvs" has no effect`,
		`"localhost" has no effect`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("notes lack %q:\n%s", want, got)
		}
	}
	if want := "[127.0.0.0/8 ::1/128 10.0.0.0/8]"; fmt.Sprint(o.NodePorts.CIDRs) != want || o.NodePorts.Primary {
		t.Errorf("NodePorts = %+v, want CIDRs %s", o.NodePorts, want)
	}
}

// --config and --write-config-to are real flags now, not ignored ones.
func TestConfigFlagsNotIgnored(t *testing.T) {
	for _, name := range []string{"config", "write-config-to"} {
		if _, ok := ignoredFlags[name]; ok {
			t.Errorf("--%s is in ignoredFlags", name)
		}
	}
	o, err := parse(t, "--write-config-to", "/tmp/x")
	if err != nil || o.WriteConfigTo != "/tmp/x" || len(o.Ignored()) != 0 {
		t.Errorf("--write-config-to: %v %q %q", err, o.WriteConfigTo, o.Ignored())
	}
}

// The effective configuration, written and read back through --config, gives the same
// settings: --write-config-to output is a usable config file.
func TestEffectiveConfigRoundTrip(t *testing.T) {
	path := writeFile(t, "mode: ipvs\nclusterCIDR: 10.1.0.0/16\nconntrack: {maxPerCore: 0}\nnodePortAddresses: [primary]\ndetectLocalMode: ClusterCIDR\n")
	o, err := parse(t, "--config", path, "--hostname-override", "n1")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "effective.yaml")
	if err := config.WriteFile(out, o.EffectiveConfig()); err != nil {
		t.Fatal(err)
	}
	o2, err := parse(t, "--config", out)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Values(), o2.Values()) {
		t.Errorf("round trip:\n got %+v\nwant %+v", o2.Values(), o.Values())
	}
	// Fields nftproxy does not use are carried over from the file.
	ec := o.EffectiveConfig()
	if *ec.Conntrack.MaxPerCore != 0 {
		t.Errorf("unused field not preserved: maxPerCore %d", *ec.Conntrack.MaxPerCore)
	}
	if ec.Mode != "nftables" {
		t.Errorf("mode %q, want nftables (what runs)", ec.Mode)
	}
}

func TestBareIPBindAddressGetsDefaultPort(t *testing.T) {
	o, err := parse(t, "--healthz-bind-address=::", "--metrics-bind-address=127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	if o.HealthzBindAddress != "[::]:10256" || o.MetricsBindAddress != "127.0.0.2:10249" {
		t.Errorf("got %q %q", o.HealthzBindAddress, o.MetricsBindAddress)
	}
	if o, err := parse(t, "--healthz-bind-address="); err != nil || o.HealthzBindAddress != "" {
		t.Errorf("empty address (disabled): %v %q", err, o.HealthzBindAddress)
	}
}

func TestValidateFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster-cidr=x"}, `--cluster-cidr: "x" is not a CIDR`},
		{[]string{"--iptables-masquerade-bit=32"}, `--iptables-masquerade-bit: 32 is not in 0..31`},
		{[]string{"--sync-period=0"}, `--sync-period: 0s must be greater than 0`},
		{[]string{"--min-sync-period=-1s"}, `--min-sync-period: -1s must not be negative`},
		{[]string{"--min-sync-period=1m", "--sync-period=30s"}, `--min-sync-period (1m0s) must not exceed --sync-period (30s)`},
		{[]string{"--nodeport-addresses=primary,10.0.0.0/8,primary"}, `--nodeport-addresses[2]: "primary" is given twice`},
		{[]string{"--nodeport-addresses=bogus"}, `--nodeport-addresses[0]: "bogus" is not a CIDR`},
		{[]string{"--healthz-bind-address=nohost:1"}, `--healthz-bind-address: "nohost:1": "nohost" is not an IP address`},
		{[]string{"--metrics-bind-address=1.2.3.4:99999"}, `--metrics-bind-address: "1.2.3.4:99999": "99999" is not a port`},
		{[]string{"--logging-format=xml"}, `--logging-format: "xml" is not text or json`},
		{[]string{"--detect-local-mode=Nodecidr"}, `--detect-local-mode: "Nodecidr" is not one of`},
		{[]string{"--detect-local-mode=BridgeInterface"}, `--pod-bridge-interface: must not be empty`},
		{[]string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=x/y"}, `--pod-interface-name-prefix: "x/y" is not an interface name`},
		{[]string{"-v=-1"}, `-v: -1 must not be negative`},
	} {
		_, err := parse(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestKubeProxyCommandLineAccepted(t *testing.T) {
	// A typical kube-proxy DaemonSet command line.
	o, err := parse(t, "--config=/dev/null/none", "--hostname-override=n")
	if err == nil {
		t.Fatal("a missing config file must fail")
	}
	_ = o
	o, err = parse(t, "--proxy-mode=nftables", "--hostname-override=n", "--conntrack-max-per-core=0",
		"--iptables-localhost-nodeports=false", "--feature-gates=A=true", "--v=2", "--profiling")
	if err != nil {
		t.Fatal(err)
	}
	// --proxy-mode=nftables is what nftproxy does: not reported. --feature-gates is
	// read: gates without effect are notes.
	if o.Verbosity != 2 || !o.Profiling || len(o.Ignored()) != 1 || strings.Contains(strings.Join(o.Ignored(), " "), "proxy-mode") {
		t.Errorf("verbosity %d, profiling %v, ignored %q", o.Verbosity, o.Profiling, o.Ignored())
	}
	if notes := strings.Join(o.Notes(), "\n"); !strings.Contains(notes, "--feature-gates: feature gate A=true has no effect in nftproxy") {
		t.Errorf("notes lack the gate without effect:\n%s", notes)
	}
}

// --feature-gates=AllowServiceExternalIPs=false, from the flag or the file's
// featureGates, turns externalIPs off (docs/security.md, item 2); the flag wins over the
// file.
func TestFeatureGateAllowServiceExternalIPs(t *testing.T) {
	o, err := parse(t, "--feature-gates=AllowServiceExternalIPs=false,Other=true")
	if err != nil {
		t.Fatal(err)
	}
	if o.ExternalIPsAllowed() {
		t.Errorf("--feature-gates=AllowServiceExternalIPs=false: externalIPs still allowed")
	}
	if o, _ := parse(t); !o.ExternalIPsAllowed() {
		t.Errorf("default: externalIPs not allowed")
	}
	if _, err := parse(t, "--feature-gates=AllowServiceExternalIPs=maybe"); err == nil {
		t.Errorf("a gate that is not a boolean was accepted")
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates: {AllowServiceExternalIPs: false}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err = parse(t, "--config="+file)
	if err != nil {
		t.Fatal(err)
	}
	if o.ExternalIPsAllowed() {
		t.Errorf("config file featureGates AllowServiceExternalIPs=false: externalIPs still allowed")
	}
	if strings.Contains(strings.Join(o.Notes(), "\n"), "featureGates.AllowServiceExternalIPs") {
		t.Errorf("the gate is reported as without effect: %q", o.Notes())
	}
	if c := o.EffectiveConfig(); c.FeatureGates["AllowServiceExternalIPs"] {
		t.Errorf("effective config lost the gate: %v", c.FeatureGates)
	}
	// with --config the file's value is used (as kube-proxy): a flag that says otherwise
	// is refused rather than ignored, in either direction
	if _, err = parse(t, "--config="+file, "--feature-gates=AllowServiceExternalIPs=true"); err == nil ||
		!strings.Contains(err.Error(), "--feature-gates AllowServiceExternalIPs=true contradicts --config") {
		t.Errorf("a flag contradicting the file's gate: err %v, want the contradiction named", err)
	}
	unset := filepath.Join(dir, "unset.yaml")
	if err := os.WriteFile(unset, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err = parse(t, "--config="+unset, "--feature-gates=AllowServiceExternalIPs=false"); err == nil {
		t.Error("--feature-gates AllowServiceExternalIPs=false with a file that leaves it true (the default) was accepted")
	}
	// agreeing, or another gate: accepted
	for _, args := range [][]string{
		{"--config=" + file, "--feature-gates=AllowServiceExternalIPs=false"},
		{"--config=" + unset, "--feature-gates=AllowServiceExternalIPs=true"},
		{"--config=" + unset, "--feature-gates=SomeOtherGate=false"},
	} {
		if _, err := parse(t, args...); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

func TestLimitFlags(t *testing.T) {
	o, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxFrontendsPerService != 1000 || o.MaxEndpointsPerServicePort != 10000 || o.MaxEndpointsPerService != 100000 || o.MaxTableElements != 2000000 {
		t.Errorf("defaults %d %d %d %d", o.MaxFrontendsPerService, o.MaxEndpointsPerServicePort, o.MaxEndpointsPerService, o.MaxTableElements)
	}
	if _, err := parse(t, "--max-endpoints-per-service=-5"); err == nil || !strings.Contains(err.Error(), "--max-endpoints-per-service:") {
		t.Errorf("negative --max-endpoints-per-service: %v", err)
	}
	if o, err := parse(t, "--max-endpoints-per-service=500"); err != nil || o.MaxEndpointsPerService != 500 {
		t.Errorf("--max-endpoints-per-service=500: %v %d", err, o.MaxEndpointsPerService)
	}
	if _, err := parse(t, "--max-table-elements=-1"); err == nil || !strings.Contains(err.Error(), "--max-table-elements") {
		t.Errorf("negative limit: %v", err)
	}
	if o, err := parse(t, "--max-frontends-per-service=0"); err != nil || o.MaxFrontendsPerService != 0 {
		t.Errorf("0 (no limit): %v", err)
	}
}

func TestServedPorts(t *testing.T) {
	o, err := parse(t, "--healthz-bind-address=0.0.0.0:10256", "--metrics-bind-address=192.0.2.10:9100")
	if err != nil {
		t.Fatal(err)
	}
	ports, addrs, all := o.ServedPorts()
	if fmt.Sprint(ports) != "[10256 9100]" || fmt.Sprint(addrs) != "[192.0.2.10]" || !all {
		t.Errorf("ServedPorts = %v %v %v, want [10256 9100] [192.0.2.10] true", ports, addrs, all)
	}
	o, _ = parse(t, "--metrics-bind-address=", "--healthz-bind-address=192.0.2.10:10256")
	if ports, _, all := o.ServedPorts(); fmt.Sprint(ports) != "[10256]" || all {
		t.Errorf("metrics disabled, healthz on one address: ports %v all %v, want [10256] false", ports, all)
	}
}

// --detect-local-mode and its inputs become one typed value, from the
// flags or from the file's detectLocalMode and detectLocal block.
func TestDetectLocalModes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want compile.DetectLocal
	}{
		{nil, compile.DetectLocal{Mode: compile.LocalClusterCIDR}},
		{[]string{"--cluster-cidr=10.244.0.0/16,fd00::/56"}, compile.DetectLocal{Mode: compile.LocalClusterCIDR,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/56")}}},
		{[]string{"--detect-local-mode=NodeCIDR", "--cluster-cidr=10.244.0.0/16"}, compile.DetectLocal{Mode: compile.LocalNodeCIDR}},
		{[]string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"}, compile.DetectLocal{Mode: compile.LocalBridgeInterface, Interface: "cbr0"}},
		{[]string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"}, compile.DetectLocal{Mode: compile.LocalInterfaceNamePrefix, Interface: "veth"}},
		{[]string{"--config", writeFile(t, "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: cali}\n")},
			compile.DetectLocal{Mode: compile.LocalInterfaceNamePrefix, Interface: "cali"}},
		{[]string{"--config", writeFile(t, "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cni0}\n")},
			compile.DetectLocal{Mode: compile.LocalBridgeInterface, Interface: "cni0"}},
	} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if !reflect.DeepEqual(o.DetectLocal, tc.want) {
			t.Errorf("%q: %+v, want %+v", tc.args, o.DetectLocal, tc.want)
		}
		if len(o.Ignored()) != 0 {
			t.Errorf("%q: reported as without effect: %q", tc.args, o.Ignored())
		}
	}
}

// The file's enableProfiling serves /debug/pprof as --profiling does; with --config the
// flag is ignored as the other flags the file holds.
func TestConfigFileEnableProfiling(t *testing.T) {
	for _, tc := range []struct {
		file string
		args []string
		want bool
	}{
		{"enableProfiling: true\n", nil, true},
		{"enableProfiling: false\n", []string{"--profiling"}, false},
		{"", []string{"--profiling"}, false},
	} {
		o, err := parse(t, append([]string{"--config", writeFile(t, tc.file)}, tc.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if o.Profiling != tc.want {
			t.Errorf("file %q, flags %q: Profiling %v, want %v", tc.file, tc.args, o.Profiling, tc.want)
		}
	}
	if o, err := parse(t, "--profiling"); err != nil || !o.Profiling {
		t.Errorf("--profiling without --config: Profiling %v, err %v", o.Profiling, err)
	}
}
