package main

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nftproxy/nftproxy/nft"
)

// explainCluster is cluster() with a Service whose externalIP is a pod address and a
// load balancer with two loadBalancerSourceRanges.
func explainCluster() []runtime.Object {
	podIP := service("podip", "ClusterIP", []string{"10.96.2.1"}, 80, 0, "10.244.9.9")
	ranges := service("ranges", "LoadBalancer", []string{"10.96.2.2"}, 443, 30445)
	ranges.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/25", "203.0.113.128/25"}
	ranges.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.2"}}
	return append(cluster(), podIP, slice("podip", "podip", discovery.AddressTypeIPv4, "node-2", "10.244.1.10"),
		ranges, slice("ranges", "ranges", discovery.AddressTypeIPv4, "node-2", "10.244.1.11"))
}

// noServiceCIDRs makes the fake API one without the ServiceCIDR resource: the proxy then
// uses --service-cluster-ip-range.
func noServiceCIDRs(c *fake.Clientset) *fake.Clientset {
	c.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, "")
	})
	return c
}

// proxyRuleset is what the proxy (and --dry-run) compiles with the same flags: its
// configuration, from the same listing.
func proxyRuleset(t *testing.T, client *fake.Clientset, args []string) string {
	t.Helper()
	req, err := parseExplain(append(args, "192.0.2.1:1"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := proxyConfig(req.opts, localAddrs)
	if err != nil {
		t.Fatal(err)
	}
	state, err := listAPI(context.Background(), client, cfg.NodeName)
	if err != nil {
		t.Fatal(err)
	}
	_, rulesets, _, err := state.compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, rs := range rulesets {
		b.WriteString(nft.Render(rs))
	}
	return b.String()
}

// explain compiles with the proxy's settings: what the proxy does not program (an
// externalIP under AllowServiceExternalIPs=false, outside --external-ip-cidrs or in
// --cluster-cidr, a Service over a limit) is explained as not programmed, and the
// service CIDR is the proxy's (--service-cluster-ip-range when the API serves no
// ServiceCIDRs). Each case also checks the premise on the proxy's own ruleset.
func TestExplainAgreesWithTheProxy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		dest     string
		noCIDRs  bool     // the API serves no ServiceCIDRs
		want     []string // in explain's output
		notInSet string   // not in the proxy's ruleset
		inSet    string   // in the proxy's ruleset
	}{
		{"AllowServiceExternalIPs=false", []string{"--feature-gates=AllowServiceExternalIPs=false", "--from=203.0.113.5"}, "203.0.113.7:443", false,
			[]string{"not translated: service default/web's port 443/TCP at this address is not programmed: the feature gate AllowServiceExternalIPs is false"},
			"203.0.113.7", ""},
		{"--external-ip-cidrs", []string{"--external-ip-cidrs=198.18.0.0/15", "--from=203.0.113.5"}, "203.0.113.7:443", false,
			[]string{"service default/web's port 443/TCP at this address is not programmed", "note: ignored: Service default/web: externalIP 203.0.113.7 is outside the ranges the node allows externalIPs in (--external-ip-cidrs)"},
			"203.0.113.7", ""},
		{"--cluster-cidr refuses externalIPs", []string{"--from=203.0.113.5"}, "10.244.9.9:80", false,
			[]string{"service default/podip's port 80/TCP at this address is not programmed", "note: ignored: Service default/podip: externalIP 10.244.9.9 is inside the cluster CIDR 10.244.0.0/16"},
			"10.244.9.9", ""},
		{"--max-endpoints-per-service-port", []string{"--max-endpoints-per-service-port=2"}, "10.96.1.5:80", false,
			[]string{"dropped: service default/sticky's port 80/TCP at this address is not programmed", "more than --max-endpoints-per-service-port=2: the Service is not programmed"},
			"10.96.1.5", ""},
		{"--max-endpoints-per-service", []string{"--max-endpoints-per-service=2"}, "10.96.1.5:80", false,
			[]string{"service default/sticky's port 80/TCP at this address is not programmed", "more than --max-endpoints-per-service=2: the Service is not programmed"},
			"10.96.1.5", ""},
		{"--max-source-ranges-per-service", []string{"--max-source-ranges-per-service=1", "--from=203.0.113.5"}, "198.51.100.2:443", false,
			[]string{"service default/ranges's port 443/TCP at this address is not programmed", "more than --max-source-ranges-per-service=1: the Service is not programmed"},
			"198.51.100.2", ""},
		{"--service-cluster-ip-range without ServiceCIDRs", []string{"--service-cluster-ip-range=10.96.0.0/16"}, "10.96.9.9:80", true,
			[]string{"dropped: no service uses this address (an unallocated address of the service CIDR 10.96.0.0/16)"},
			"", "10.96.0.0/16"},
		{"ServiceCIDR objects over the flag", []string{"--service-cluster-ip-range=10.100.0.0/16"}, "10.96.9.9:80", false,
			[]string{"dropped: no service uses this address (an unallocated address of the service CIDR 10.96.0.0/16)"},
			"10.100.0.0/16", "10.96.0.0/16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(explainCluster()...)
			if tc.noCIDRs {
				client = noServiceCIDRs(client)
			}
			args := append([]string{"--hostname-override=node-1", "--cluster-cidr=10.244.0.0/16,fd00:244::/56"}, tc.args...)
			rs := proxyRuleset(t, client, args)
			if tc.notInSet != "" && strings.Contains(rs, tc.notInSet) {
				t.Fatalf("premise: the proxy's ruleset holds %s:\n%s", tc.notInSet, rs)
			}
			if tc.inSet != "" && !strings.Contains(rs, tc.inSet) {
				t.Fatalf("premise: the proxy's ruleset lacks %s:\n%s", tc.inSet, rs)
			}
			req, err := parseExplain(append(args, tc.dest), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := explain(context.Background(), client, req, &b); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			if _, outcomes, _ := strings.Cut(b.String(), "\n"); strings.Contains(outcomes, "→") {
				t.Errorf("explained as translated to an endpoint, which the proxy does not program:\n%s", b.String())
			}
		})
	}
}

// explain's configuration is the proxy's for the same command line, field by field, but
// for the node's addresses, which explain takes from the Node object.
func TestExplainConfigIsTheProxys(t *testing.T) {
	client := fake.NewClientset(explainCluster()...)
	args := []string{"--hostname-override=node-1", "--cluster-cidr=10.244.0.0/16", "--service-cluster-ip-range=10.100.0.0/16",
		"--feature-gates=AllowServiceExternalIPs=false", "--external-ip-cidrs=198.18.0.0/15", "--masquerade-all",
		"--nodeport-addresses=192.0.2.0/24", "--max-endpoints-per-service-port=7", "--max-endpoints-per-service=8",
		"--max-source-ranges-per-service=9", "--max-frontends-per-service=10", "--max-table-elements=5000",
		"--metrics-bind-address=0.0.0.0:10249", "--min-sync-period=3s", "--sync-period=5m", "192.0.2.1:1"}
	req, err := parseExplain(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	in, err := fromAPI(context.Background(), client, req.opts)
	if err != nil {
		t.Fatal(err)
	}
	nodeIPs := func() ([]netip.Addr, error) { return in.snap.Node.IPs, nil }
	want, err := proxyConfig(req.opts, nodeIPs)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.snap.Node.IPs) == 0 {
		t.Fatal("no node addresses")
	}
	got := in.cfg
	gotAddrs, _ := got.Pipeline.LocalAddrs()
	if !reflect.DeepEqual(gotAddrs, in.snap.Node.IPs) {
		t.Errorf("explain's node addresses %v, want the Node object's %v", gotAddrs, in.snap.Node.IPs)
	}
	got.Pipeline.LocalAddrs, want.Pipeline.LocalAddrs = nil, nil // funcs: compared by their result above
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		name := gv.Type().Field(i).Name
		if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
			t.Errorf("%s: explain has %v, the proxy %v", name, gv.Field(i).Interface(), wv.Field(i).Interface())
		}
	}
	if pol := want.Pipeline.Compile.Policy; !pol.NoExternalIPs || len(want.Pipeline.ServiceCIDRs) == 0 || len(pol.ExternalIPCIDRs) == 0 || len(pol.ClusterCIDRs) == 0 ||
		pol.Limits.MaxEndpointsPerServicePort != 7 || pol.Limits.MaxSourceRangesPerService != 9 || len(pol.ServedPorts) == 0 {
		t.Errorf("the command line did not reach the proxy's configuration: %+v", want)
	}
}

// proxyConfig is the one place that builds the controller's configuration: no other
// file of the command fills a controller.Config literal, so that no command can leave
// a new setting out.
func TestOneConfigBuilder(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var builders []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				if cl, ok := n.(*ast.CompositeLit); ok && len(cl.Elts) > 0 {
					if sel, ok := cl.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Config" {
						if x, ok := sel.X.(*ast.Ident); ok && x.Name == "controller" {
							builders = append(builders, fn.Name.Name)
						}
					}
				}
				return true
			})
		}
	}
	if !reflect.DeepEqual(builders, []string{"proxyConfig"}) {
		t.Errorf("controller.Config is filled in %v; only proxyConfig may build it", builders)
	}
}
