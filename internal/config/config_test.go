package config

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func mustParse(t *testing.T, body string) *File {
	t.Helper()
	f, err := Parse([]byte(header + body))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return f
}

// A kube-proxy (iptables mode) file: the iptables.* settings are used, everything unset
// gets kube-proxy's default.
func TestParseKubeProxyFile(t *testing.T) {
	f := mustParse(t, `
mode: iptables
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 20
hostnameOverride: node-a
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
nodePortAddresses: ["10.0.0.0/8", "all"]
iptables:
  masqueradeAll: true
  masqueradeBit: 12
  syncPeriod: 10s
  minSyncPeriod: 250ms
healthzBindAddress: 0.0.0.0
logging:
  verbosity: 2
  format: json
`)
	want := Values{
		Kubeconfig:            "/var/lib/kube-proxy/kubeconfig.conf",
		KubeAPIQPS:            20,
		KubeAPIBurst:          10,
		KubeAPIContentType:    "application/vnd.kubernetes.protobuf",
		HostnameOverride:      "node-a",
		ClusterCIDR:           "10.244.0.0/16,fd00:10:244::/56",
		NodePortAddresses:     []string{"10.0.0.0/8", "all"},
		MasqueradeAll:         true,
		MasqueradeBit:         12,
		IPTablesMasqueradeBit: 12,
		SyncPeriod:            10 * time.Second,
		MinSyncPeriod:         250 * time.Millisecond,
		HealthzBindAddress:    "0.0.0.0:10256",
		MetricsBindAddress:    "127.0.0.1:10249",
		Verbosity:             2,
		LoggingFormat:         "json",
		Conntrack:             DefaultConntrack(),
	}
	if !reflect.DeepEqual(f.Values, want) {
		t.Errorf("values:\n got %+v\nwant %+v", f.Values, want)
	}
	if len(f.Notes) != 1 || !strings.Contains(f.Notes[0], `mode: "iptables" has no effect`) {
		t.Errorf("notes = %q, want one about mode", f.Notes)
	}
}

func TestDefaults(t *testing.T) {
	f := mustParse(t, "")
	want := Values{
		KubeAPIQPS: 5, KubeAPIBurst: 10, KubeAPIContentType: "application/vnd.kubernetes.protobuf",
		MasqueradeBit: 14, IPTablesMasqueradeBit: 14, SyncPeriod: 30 * time.Second, MinSyncPeriod: time.Second,
		HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "127.0.0.1:10249", LoggingFormat: "text",
		Conntrack: Conntrack{MaxPerCore: 32 * 1024, Min: 128 * 1024, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour},
	}
	if !reflect.DeepEqual(f.Values, want) {
		t.Errorf("values:\n got %+v\nwant %+v", f.Values, want)
	}
	if len(f.Notes) != 0 {
		t.Errorf("an empty file has notes: %q", f.Notes)
	}
	// IPv6 bindAddress moves the default server addresses to IPv6, as kube-proxy does.
	f = mustParse(t, "bindAddress: \"::\"\nmetricsBindAddress: \"::1\"\n")
	if f.Values.HealthzBindAddress != "[::]:10256" || f.Values.MetricsBindAddress != "[::1]:10249" {
		t.Errorf("IPv6 defaults: %q %q", f.Values.HealthzBindAddress, f.Values.MetricsBindAddress)
	}
}

// nftables.* wins over iptables.* when a file sets both; the shadowed one is reported.
func TestNFTablesSectionPreferred(t *testing.T) {
	f := mustParse(t, `
mode: nftables
iptables: {syncPeriod: 10s, masqueradeBit: 12, masqueradeAll: true}
nftables: {syncPeriod: 20s, minSyncPeriod: 2s, masqueradeBit: 5, masqueradeAll: false}
`)
	v := f.Values
	if v.SyncPeriod != 20*time.Second || v.MinSyncPeriod != 2*time.Second || v.MasqueradeBit != 5 || v.MasqueradeAll {
		t.Errorf("values = %+v, want nftables.* ones", v)
	}
	joined := strings.Join(f.Notes, "\n")
	for _, n := range []string{"nftables.syncPeriod is used; iptables.syncPeriod is ignored", "nftables.masqueradeAll is used; iptables.masqueradeAll is ignored"} {
		if !strings.Contains(joined, n) {
			t.Errorf("notes lack %q:\n%s", n, joined)
		}
	}
	if strings.Contains(joined, "mode") {
		t.Errorf("mode nftables is the default behaviour but was reported:\n%s", joined)
	}
	// Only iptables.*: used.
	f = mustParse(t, "iptables: {syncPeriod: 7s, masqueradeAll: true}\n")
	if f.Values.SyncPeriod != 7*time.Second || !f.Values.MasqueradeAll || f.Values.MinSyncPeriod != time.Second {
		t.Errorf("iptables-only values = %+v", f.Values)
	}
}

// Settings that mean nothing here are accepted and each non-default one reported once.
func TestNotApplicableReported(t *testing.T) {
	f := mustParse(t, `
mode: ipvs
ipvs: {scheduler: rr, strictARP: true}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 24h}
oomScoreAdj: -999
featureGates: {SomeGate: true}
enableProfiling: true
configSyncPeriod: 15m
clusterCIDR: 10.0.0.0/8
`)
	want := []string{
		`config file: featureGates.SomeGate: true has no effect in nftproxy`,
		`config file: ipvs.scheduler: "rr" has no effect in nftproxy`,
		`config file: ipvs.strictARP: true has no effect in nftproxy`,
		`config file: mode: "ipvs" has no effect in nftproxy`,
	}
	if !reflect.DeepEqual(f.Notes, want) {
		t.Errorf("notes:\n got %q\nwant %q", f.Notes, want)
	}
}

func TestUnknownFieldTolerated(t *testing.T) {
	f := mustParse(t, "clusterCIDR: 10.0.0.0/8\nnoSuchField: 1\n")
	if f.Values.ClusterCIDR != "10.0.0.0/8" {
		t.Errorf("clusterCIDR = %q", f.Values.ClusterCIDR)
	}
	if len(f.Notes) != 1 || !strings.Contains(f.Notes[0], "noSuchField") {
		t.Errorf("notes = %q, want one naming the unknown field", f.Notes)
	}
}

func TestInvalidValuesNameTheField(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`clusterCIDR: "x"`, `clusterCIDR: "x" is not a CIDR`},
		{`clusterCIDR: "10.0.0.0/8,10.1.0.0/16"`, `clusterCIDR: at most one CIDR per IP family`},
		{`nftables: {masqueradeBit: 40}`, `nftables.masqueradeBit: 40 is not in 0..31`},
		{`iptables: {masqueradeBit: -1}`, `iptables.masqueradeBit: -1 is not in 0..31`},
		{`iptables: {syncPeriod: -5s}`, `iptables.syncPeriod: -5s must be greater than 0`},
		{`nftables: {syncPeriod: 2s, minSyncPeriod: 5s}`, `nftables.minSyncPeriod: 5s must not exceed nftables.syncPeriod (2s)`},
		{`nodePortAddresses: ["10.0.0.0/8", "nope"]`, `nodePortAddresses[1]: "nope" is not a CIDR`},
		{`nodePortAddresses: ["all", "10.0.0.0/8", "all"]`, `nodePortAddresses[2]: "all" is given twice`},
		{`healthzBindAddress: "foo:bar"`, `healthzBindAddress: "foo:bar": "foo" is not an IP address`},
		{`metricsBindAddress: "127.0.0.1:0"`, `metricsBindAddress: "127.0.0.1:0": "0" is not a port`},
		{`detectLocalMode: BridgeInterface`, `detectLocal.bridgeInterface: must not be empty (detectLocalMode is BridgeInterface)`},
		{"detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: a-very-long-interface}", `detectLocal.interfaceNamePrefix: "a-very-long-interface" is longer than an interface name`},
		{`detectLocalMode: Nonsense`, `detectLocalMode: "Nonsense" is not one of`},
		{`logging: {format: xml}`, `logging.format: "xml" is not text or json`},
		{`clientConnection: {burst: -3}`, `clientConnection.burst: -3 must not be negative`},
	} {
		_, err := Parse([]byte(header + tc.body + "\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.body, err, tc.want)
		}
	}
	// Several errors are all reported.
	_, err := Parse([]byte(header + "clusterCIDR: x\nlogging: {format: xml}\n"))
	if err == nil || !strings.Contains(err.Error(), "clusterCIDR") || !strings.Contains(err.Error(), "logging.format") {
		t.Errorf("two errors: %v", err)
	}
}

func TestNotAKubeProxyConfiguration(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: ConfigMap\n",
		"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Nope\n",
		"clusterCIDR: 10.0.0.0/8\n", // no type
		header + "clusterCIDR: [1, 2]\n",
		"{{{",
	} {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("%q: no error", doc)
		}
	}
}

// What --write-config-to writes reads back to the same values, with nothing to report.
func TestWriteReadRoundTrip(t *testing.T) {
	v := Values{
		Kubeconfig: "/k", KubeAPIQPS: 7.5, KubeAPIBurst: 3, KubeAPIContentType: "application/json",
		HostnameOverride: "n1", ClusterCIDR: "10.244.0.0/16", NodePortAddresses: []string{"192.0.2.0/24"},
		MasqueradeAll: true, MasqueradeBit: 3, IPTablesMasqueradeBit: 3, SyncPeriod: time.Minute, MinSyncPeriod: 3 * time.Second,
		HealthzBindAddress: "127.0.0.1:1234", MetricsBindAddress: "", DetectLocalMode: "ClusterCIDR",
		Verbosity: 4, LoggingFormat: "json",
	}
	c := Defaulted()
	v.Apply(c)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := WriteFile(path, c); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !bytes.HasPrefix(data, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n")) || !bytes.Contains(data, []byte("kind: KubeProxyConfiguration")) {
		t.Errorf("written file lacks apiVersion/kind:\n%s", data)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	// An empty metrics address reads back as the default: kube-proxy cannot disable it.
	v.MetricsBindAddress = "127.0.0.1:10249"
	if !reflect.DeepEqual(f.Values, v) {
		t.Errorf("round trip:\n got %+v\nwant %+v\n%s", f.Values, v, data)
	}
	if len(f.Notes) != 0 {
		t.Errorf("notes after round trip: %q", f.Notes)
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Fatal("no error")
	}
}

// nodePortAddresses as kube-proxy v1.37 parses it: keywords and CIDRs in any
// combination, each keyword once, "primary" the default.
func TestParseNodePortAddresses(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	for _, tc := range []struct {
		in   []string
		want NodePortAddresses
	}{
		{nil, NodePortAddresses{Primary: true}},
		{[]string{"primary"}, NodePortAddresses{Primary: true}},
		{[]string{"primary", "10.1.2.3/8"}, NodePortAddresses{Primary: true, CIDRs: pfx("10.0.0.0/8")}},
		{[]string{"all", "localhost", "10.0.0.0/8", "0.0.0.0/0"}, NodePortAddresses{Localhost: true, CIDRs: pfx("0.0.0.0/0", "::/0", "127.0.0.0/8", "::1/128", "10.0.0.0/8")}},
	} {
		got, err := ParseNodePortAddresses("n", tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range [][]string{{"primary", "primary"}, {"10.0.0.0/8", "bogus"}, {"10.0.0.0"}} {
		if _, err := ParseNodePortAddresses("n", in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// Resolve gives kube-proxy's nftables-mode meaning per family.
func TestNodePortAddressesResolve(t *testing.T) {
	a := netip.MustParseAddr
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{a("127.0.0.1"), a("::1"), a("192.0.2.10"), a("10.1.0.5"), a("2001:db8::10")}, nil
	}
	nodeIPs := []netip.Addr{a("192.0.2.10")}
	for _, tc := range []struct {
		in    []string
		v6    bool
		all   bool
		addrs string
	}{
		{nil, false, false, "[192.0.2.10]"},
		{nil, true, true, "[]"}, // no IPv6 node IP: all local IPv6 addresses, as kube-proxy
		{[]string{"10.0.0.0/8"}, false, false, "[10.1.0.5]"},
		{[]string{"10.0.0.0/8"}, true, true, "[]"},  // the list names no IPv6 range
		{[]string{"localhost"}, false, false, "[]"}, // loopback never answers
		{[]string{"localhost"}, true, false, "[]"},
		{[]string{"localhost", "primary"}, false, false, "[192.0.2.10]"},
		{[]string{"all"}, false, true, "[]"},
		{[]string{"all"}, true, true, "[]"},
		{[]string{"primary", "2001:db8::/64"}, true, false, "[2001:db8::10]"},
	} {
		n, err := ParseNodePortAddresses("n", tc.in)
		if err != nil {
			t.Fatal(err)
		}
		r, err := n.Resolve(tc.v6, nodeIPs, local)
		if err != nil || r.AllLocal != tc.all || fmt.Sprint(r.Addrs) != tc.addrs {
			t.Errorf("%q v6=%v: got all=%v %v (%v), want all=%v %s", tc.in, tc.v6, r.AllLocal, r.Addrs, err, tc.all, tc.addrs)
		}
	}
	n, _ := ParseNodePortAddresses("n", []string{"localhost"})
	n2, _ := ParseNodePortAddresses("n", []string{"10.0.0.0/8"})
	notes := strings.Join(append(n.Notes(), n2.Notes()...), "\n")
	for _, want := range []string{`"localhost" has no effect`, "contains only IPv4 addresses; NodePort connections will be accepted on all local IPv6 IPs"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

func TestAppendPortIfNeeded(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0": "0.0.0.0:10256", "::": "[::]:10256", "[::1]": "[::1]:10256",
		"1.2.3.4:99": "1.2.3.4:99", "host": "host",
	} {
		if got := AppendPortIfNeeded(in, 10256); got != want {
			t.Errorf("AppendPortIfNeeded(%q) = %q, want %q", in, got, want)
		}
	}
}
