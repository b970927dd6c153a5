package inspect

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// TestVerifyReport formats both outcomes and returns their exit codes.
func TestVerifyReport(t *testing.T) {
	var out bytes.Buffer
	r := Result{Tables: []string{"ip nftproxy", "ip6 nftproxy"}, ServicePorts: 3, Attempts: 1}
	if code := r.Report(&out); code != 0 || out.String() != "equal: the kernel's tables ip nftproxy, ip6 nftproxy match the API's 3 service ports\n" {
		t.Errorf("equal: code %d, output %q", code, out.String())
	}
	out.Reset()
	r.Diff = readback.Diff{"ip nftproxy: set hairpin: extra element 10.244.9.9 . 10.244.9.9", "ip nftproxy: chain intruder extra (0 rules)"}
	r.Attempts = 4
	want := "ip nftproxy: set hairpin: extra element 10.244.9.9 . 10.244.9.9\n" +
		"ip nftproxy: chain intruder extra (0 rules)\n" +
		"different: 2 differences between the kernel's tables ip nftproxy, ip6 nftproxy and the API's 3 service ports (after 4 comparisons)\n"
	if code := r.Report(&out); code != 1 || out.String() != want {
		t.Errorf("different: code %d, output\n%s\nwant\n%s", code, out.String(), want)
	}
}

// TestOverlay: the settings given to verify replace the proxy's in the file verify
// loads, so they win whatever the precedence of flags over --config; the rest stays the
// proxy's, and the API client is verify's own.
func TestOverlay(t *testing.T) {
	settings := func(args ...string) *v1alpha1.KubeProxyConfiguration {
		fs, o := options.NewFlagSet()
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o.EffectiveConfig()
	}
	proxy := settings("--cluster-cidr", "10.99.0.0/16", "--iptables-masquerade-bit", "15", "--kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf", "--hostname-override", "node-1")
	got, err := Overlay(proxy, settings("--cluster-cidr", "10.1.0.0/16", "--kubeconfig", "/root/.kube/config"), settings())
	if err != nil {
		t.Fatal(err)
	}
	// (--iptables-masquerade-bit sets iptables.masqueradeBit, as kube-proxy's flag)
	if got.ClusterCIDR != "10.1.0.0/16" || *got.IPTables.MasqueradeBit != 15 || got.HostnameOverride != "node-1" ||
		got.ClientConnection.Kubeconfig != "/root/.kube/config" {
		t.Errorf("clusterCIDR %q, iptables.masqueradeBit %d, hostname %q, kubeconfig %q", got.ClusterCIDR, *got.IPTables.MasqueradeBit, got.HostnameOverride, got.ClientConnection.Kubeconfig)
	}
	// the proxy's kubeconfig path is the pod's: never taken
	if got, _ := Overlay(proxy, settings(), settings()); got.ClientConnection.Kubeconfig != "" {
		t.Errorf("the proxy's kubeconfig %q was taken", got.ClientConnection.Kubeconfig)
	}
}

// kernelOf is a fake kernel holding what other rulesets encode to.
type kernelOf map[nft.Family]*wire.TableState

func (k kernelOf) Verify(rs *nft.Ruleset, opts ...readback.Option) (readback.Diff, error) {
	return readback.Compare(k[rs.Family], rs, opts...)
}

// TestCompareSlotsByContent: a proxy whose endpoint slots were allocated after another
// chained service came and went holds other slot numbers than a fresh compile of the
// same services; Compare finds the two equal (the slot maps, known by the layout, are
// compared by what the rules select), and finds a changed endpoint.
func TestCompareSlotsByContent(t *testing.T) {
	snap := listSnapshot()
	slots := compile.NewSlots()
	first := listPort("aaa", "10.96.9.9", 30999, 40, 3)
	first.ExternalPolicyLocal = true // chained: its endpoints take slots
	before := *snap
	before.Services = model.Ports(append([]model.ServicePort{first}, derefPorts(snap.Services)...))
	compile.Compile(&before, listConfig(), slots)
	programmed, _ := compile.Compile(snap, listConfig(), slots)
	st, err := wire.EncodeState(programmed)
	if err != nil {
		t.Fatal(err)
	}
	k := kernelOf{nft.IPv4: st}
	fresh, _ := compile.Compile(snap, listConfig(), compile.NewSlots())
	if d, err := readback.Compare(st, fresh); err != nil || d.Empty() {
		t.Fatalf("premise: the slot numbers of the two histories are the same (%v)", err)
	}
	res, err := Compare(k, []*nft.Ruleset{fresh}, len(snap.Services))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Diff.Empty() || len(res.Tables) != 1 || res.Tables[0] != "ip nftproxy" || res.ServicePorts != 5 {
		t.Errorf("same services, other slot history: %+v", res)
	}

	changed := listSnapshot()
	changed.Services[2].Endpoints[0].Port = 9090 // the load balancer, chained
	other, _ := compile.Compile(changed, listConfig(), compile.NewSlots())
	if res, err := Compare(k, []*nft.Ruleset{other}, 5); err != nil || !strings.Contains(res.Diff.String(), "chain svc-default/lb/tcp/http: rule 1 differs") {
		t.Errorf("changed endpoint: %v, differences:\n%s", err, res.Diff)
	}
}

func derefPorts(ps []*model.ServicePort) []model.ServicePort {
	out := make([]model.ServicePort, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out
}

// Dialable reaches a server bound to every address on loopback, and any other where it
// is bound.
func TestDialable(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:10249": "127.0.0.1:10249", ":10249": "127.0.0.1:10249", "[::]:10249": "[::1]:10249",
		"192.0.2.10:10249": "192.0.2.10:10249", "[2001:db8::1]:10249": "[2001:db8::1]:10249", "no-port": "no-port",
	} {
		if got := Dialable(in); got != want {
			t.Errorf("Dialable(%q) = %q, want %q", in, got, want)
		}
	}
}
