package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// Tenant isolation (docs/security.md): what one namespace's Services may take from another's and
// from the node. Each case compiles a snapshot in IPv4 and checks the frontend maps and
// the problems reported.

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// nsPort is a service port in namespace ns, created at t0 + age.
func nsPort(ns, name string, proto uint8, port uint16, clusterIP string, created time.Duration, ep ...string) model.ServicePort {
	return model.ServicePort{
		Name:       model.ServicePortName{Namespace: ns, Name: name, Port: "p", Protocol: proto},
		ClusterIPs: ips(clusterIP), Port: port, Endpoints: eps(8080, ep...), Created: t0.Add(created),
	}
}

func TestIsolation(t *testing.T) {
	dns := nsPort("kube-system", "kube-dns", udp, 53, "10.96.0.10", 0, "10.244.1.53")
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", time.Hour, "10.244.1.80")
	withExt := func(sp model.ServicePort, ext ...string) model.ServicePort {
		sp.ExternalIPs = ips(ext...)
		return sp
	}
	withLB := func(sp model.ServicePort, lb ...string) model.ServicePort {
		sp.LoadBalancerIPs = ips(lb...)
		return sp
	}
	cidr := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	for _, tc := range []struct {
		name     string
		cfg      func(*Config)
		cidrs    []netip.Prefix
		services []model.ServicePort
		// want lists the exact service-ips elements (frontend → verdict)
		want     map[string]string
		problems []string // substrings, in order
	}{
		{
			name: "an externalIP equal to another service's cluster IP is refused, whatever the names",
			services: []model.ServicePort{
				withExt(nsPort("a-evil", "dns", udp, 53, "10.96.5.5", -time.Hour, "10.244.9.9"), "10.96.0.10"),
				dns,
			},
			want: map[string]string{
				"10.96.5.5 . 17 . 53":  "goto svc-a-evil/dns/udp/p",
				"10.96.0.10 . 17 . 53": "goto svc-kube-system/kube-dns/udp/p",
			},
			problems: []string{"Service a-evil/dns: externalIP 10.96.0.10 is a cluster IP, refused"},
		},
		{
			name: "a load-balancer IP equal to a cluster IP of another port is refused too",
			services: []model.ServicePort{
				withLB(nsPort("evil", "lb", tcp, 443, "10.96.5.6", 0, "10.244.9.9"), "10.96.0.20"),
				web,
			},
			want: map[string]string{
				"10.96.5.6 . 6 . 443": "goto svc-evil/lb/tcp/p",
				"10.96.0.20 . 6 . 80": "goto svc-shop/web/tcp/p",
			},
			problems: []string{"Service evil/lb: load-balancer IP 10.96.0.20 is a cluster IP, refused"},
		},
		{
			name:  "an externalIP inside the service CIDRs is refused even when unallocated",
			cidrs: cidr,
			services: []model.ServicePort{
				withExt(nsPort("evil", "x", tcp, 80, "10.96.5.7", 0, "10.244.9.9"), "10.96.77.77", "203.0.113.5"),
			},
			want: map[string]string{
				"10.96.5.7 . 6 . 80":   "goto svc-evil/x/tcp/p",
				"203.0.113.5 . 6 . 80": "goto ext-evil/x/tcp/p",
			},
			problems: []string{"externalIP 10.96.77.77 is inside the service CIDR 10.96.0.0/16, refused"},
		},
		{
			name: "external address conflicts go to the older Service, not the first name",
			services: []model.ServicePort{
				withExt(nsPort("a-new", "x", tcp, 80, "10.96.5.8", 2*time.Hour, "10.244.9.8"), "203.0.113.9"),
				withExt(nsPort("z-old", "y", tcp, 80, "10.96.5.9", time.Hour, "10.244.9.9"), "203.0.113.9"),
			},
			want: map[string]string{
				"10.96.5.8 . 6 . 80":   "goto svc-a-new/x/tcp/p",
				"10.96.5.9 . 6 . 80":   "goto svc-z-old/y/tcp/p",
				"203.0.113.9 . 6 . 80": "goto ext-z-old/y/tcp/p",
			},
			problems: []string{`Service a-new/x: port "p": TCP 203.0.113.9:80 is in use by another Service, ignored`},
		},
		{
			name: "an externalIP on the node's address may not take the ports nftproxy serves",
			cfg:  func(c *Config) { c.ServedPorts = []uint16{10256, 10249}; c.OwnAddrs = ips("192.0.2.99") },
			services: []model.ServicePort{
				withExt(nsPort("evil", "hc", tcp, 10256, "10.96.5.10", 0, "10.244.9.9"), "192.0.2.10"),
				withExt(nsPort("evil", "metrics", tcp, 10249, "10.96.5.11", 0, "10.244.9.9"), "192.0.2.99"),
				withExt(nsPort("ops", "ssh-udp", udp, 10256, "10.96.5.12", 0, "10.244.9.7"), "192.0.2.10"), // UDP: not served
				withExt(nsPort("ops", "web", tcp, 8080, "10.96.5.13", 0, "10.244.9.8"), "192.0.2.10"),      // allowed
			},
			want: map[string]string{
				"10.96.5.10 . 6 . 10256":  "goto svc-evil/hc/tcp/p",
				"10.96.5.11 . 6 . 10249":  "goto svc-evil/metrics/tcp/p",
				"10.96.5.12 . 17 . 10256": "goto svc-ops/ssh-udp/udp/p",
				"192.0.2.10 . 17 . 10256": "goto ext-ops/ssh-udp/udp/p",
				"10.96.5.13 . 6 . 8080":   "goto svc-ops/web/tcp/p",
				"192.0.2.10 . 6 . 8080":   "goto ext-ops/web/tcp/p",
			},
			problems: []string{
				`Service evil/hc: port "p": externalIP 192.0.2.10 is this node's address and TCP port 10256 is served by nftproxy itself, refused`,
				`Service evil/metrics: port "p": externalIP 192.0.2.99 is this node's address and TCP port 10249 is served by nftproxy itself, refused`,
			},
		},
		{
			name: "special external addresses are refused",
			services: []model.ServicePort{
				withLB(withExt(nsPort("evil", "x", tcp, 80, "10.96.5.14", 0, "10.244.9.9"), "127.0.0.1", "169.254.169.254", "0.0.0.0"), "224.0.0.1", "255.255.255.255"),
			},
			want: map[string]string{"10.96.5.14 . 6 . 80": "goto svc-evil/x/tcp/p"},
			problems: []string{ // sorted: internal/admit reports them in order
				"externalIP 0.0.0.0 is the unspecified address, refused",
				"externalIP 127.0.0.1 is a loopback address, refused",
				"externalIP 169.254.169.254 is a link-local address, refused",
				"load-balancer IP 224.0.0.1 is a multicast address, refused",
				"load-balancer IP 255.255.255.255 is the broadcast address, refused",
			},
		},
		{
			name: "AllowServiceExternalIPs=false: no externalIP at all, load-balancer IPs stay",
			cfg:  func(c *Config) { c.NoExternalIPs = true },
			services: []model.ServicePort{
				withLB(withExt(nsPort("ops", "x", tcp, 80, "10.96.5.15", 0, "10.244.9.9"), "203.0.113.1"), "198.51.100.1"),
			},
			want: map[string]string{
				"10.96.5.15 . 6 . 80":   "goto svc-ops/x/tcp/p",
				"198.51.100.1 . 6 . 80": "goto ext-ops/x/tcp/p",
			},
		},
		{
			name: "endpoints at a service's cluster IP are skipped",
			services: []model.ServicePort{
				dns,
				nsPort("evil", "fwd", udp, 53, "10.96.5.16", 0, "10.96.0.10", "10.244.9.9"),
			},
			want: map[string]string{
				"10.96.0.10 . 17 . 53": "goto svc-kube-system/kube-dns/udp/p",
				"10.96.5.16 . 17 . 53": "goto svc-evil/fwd/udp/p",
			},
			problems: []string{`Service evil/fwd: port "p": endpoint address 10.96.0.10 is a service's cluster IP, skipped`},
		},
		{
			name: "conflict messages never name the other Service",
			services: []model.ServicePort{
				withExt(nsPort("payments", "ledger-db", tcp, 5432, "10.96.5.17", 0, "10.244.9.1"), "203.0.113.40"),
				withExt(nsPort("tenant", "probe", tcp, 5432, "10.96.5.18", time.Hour, "10.244.9.2"), "203.0.113.40"),
			},
			want: map[string]string{
				"10.96.5.17 . 6 . 5432":   "goto svc-payments/ledger-db/tcp/p",
				"203.0.113.40 . 6 . 5432": "goto ext-payments/ledger-db/tcp/p",
				"10.96.5.18 . 6 . 5432":   "goto svc-tenant/probe/tcp/p",
			},
			problems: []string{`Service tenant/probe: port "p": TCP 203.0.113.40:5432 is in use by another Service, ignored`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			snap := snapshot(sortedPorts(tc.services)...)
			snap.ServiceCIDRs = tc.cidrs
			rs, problems := compileChecked(t, snap, cfg, NewSlots())
			got := elements(t, rs, MapServiceIPs)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("service-ips:\n got  %v\n want %v", got, tc.want)
			}
			checkProblems(t, problems, tc.problems)
			for _, p := range problems {
				if p.Namespace != "payments" && strings.Contains(p.Reason, "payments") {
					t.Errorf("problem of %s/%s names another namespace's service: %s", p.Namespace, p.Name, p.Reason)
				}
			}
		})
	}
}

// sortedPorts returns the service ports in name order, as snapshots hold them.
func sortedPorts(sps []model.ServicePort) []model.ServicePort {
	out := append([]model.ServicePort(nil), sps...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Name.Less(out[j-1].Name); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// The incremental compiler drops an endpoint as soon as its address becomes a cluster
// IP, and takes it back when the address stops being one, although the endpoint's own
// service did not change.
func TestIsolationEndpointBecomesClusterIP(t *testing.T) {
	victim := nsPort("evil", "fwd", tcp, 80, "10.96.5.1", 0, "10.96.0.99", "10.244.9.9")
	later := nsPort("shop", "new", tcp, 80, "10.96.0.99", time.Hour, "10.244.1.1")
	cc := NewCompiler(testConfig(), NewSlots())
	endpointsOf := func(rs *nft.Ruleset) string {
		var all []string
		for _, s := range rs.Flatten().Sets {
			if strings.HasPrefix(s.Name, MapEndpoints) { // the flat map and the slot pages
				for _, e := range s.Elements {
					all = append(all, valuesString(e.Data))
				}
			}
		}
		return strings.Join(all, ",")
	}
	rs, problems := cc.Compile(snapshot(victim))
	if got := endpointsOf(rs); !strings.Contains(got, "10.96.0.99") || len(problems) != 0 {
		t.Fatalf("before: endpoints %s, problems %v; want 10.96.0.99 used, no problem", got, problems)
	}
	rs, problems = cc.Compile(snapshot(victim, later))
	if got := endpointsOf(rs); strings.Contains(got, "10.96.0.99 . 8080") {
		t.Errorf("after the address became a cluster IP: endpoints %s still hold it", got)
	}
	checkProblems(t, problems, []string{"endpoint address 10.96.0.99 is a service's cluster IP, skipped"})
	rs, problems = cc.Compile(snapshot(victim))
	if got := endpointsOf(rs); !strings.Contains(got, "10.96.0.99") || len(problems) != 0 {
		t.Errorf("after the cluster IP went away: endpoints %s, problems %v; want 10.96.0.99 used again", got, problems)
	}
}

// Node ports never answer on loopback: not through --nodeport-addresses that cover it
// (the set), and not through "all local addresses" (the fib rule excludes 127/8, ::1).
func TestNodePortsNeverOnLoopback(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		cfg := configFor(fam)
		cfg.NodePortAddrs = ips("127.0.0.1", "192.0.2.10", "::1", "2001:db8::10")
		rs, _ := compileChecked(t, snapshot(), cfg, NewSlots())
		got := elements(t, rs, SetNodePortIPs)
		for k := range got {
			if ip(k).IsLoopback() {
				t.Errorf("%s: nodeport-ips holds %s", fam, k)
			}
		}
		if len(got) != 1 {
			t.Errorf("%s: nodeport-ips %v, want the one non-loopback address", fam, got)
		}
		cfg.NodePortAllLocal = true
		rs, _ = compileChecked(t, snapshot(), cfg, NewSlots())
		text := nft.Render(rs)
		want := "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"
		if fam == nft.IPv6 {
			want = "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports"
		}
		if !strings.Contains(text, want) {
			t.Errorf("%s: no rule %q in\n%s", fam, want, text)
		}
	}
}

// loadBalancerSourceRanges that cannot be parsed never open a load balancer: a family
// with no usable range drops everything; a family with usable ranges keeps them.
func TestSourceRangesFailClosed(t *testing.T) {
	lb := model.ServicePort{
		Name: spn("lb", "https", tcp), ClusterIPs: ips("10.96.0.30", "fd00:96::30"), Port: 443,
		LoadBalancerIPs: ips("198.51.100.30", "2001:db8:1::30"), Endpoints: eps(8443, "10.244.1.30", "fd00:244::30"),
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, SourceRangesBroken: true,
	}
	fw := ChainName("fw", lb.Name)
	drop := nft.Verdict{Kind: nft.Drop}
	for _, tc := range []struct {
		fam    nft.Family
		want   [][]nft.Stmt
		ranges []string // the admitted sources' set
	}{
		// IPv4 has a usable range (and the node's address is in it, so the VIP too)
		{nft.IPv4, [][]nft.Stmt{
			{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: fw}, nft.Verdict{Kind: nft.Return}},
			{drop},
		}, []string{"192.0.2.0/24", "198.51.100.30"}},
		// IPv6 has none: closed
		{nft.IPv6, [][]nft.Stmt{{drop}}, nil},
	} {
		snap := snapshot(lb)
		rs, _ := compileChecked(t, snap, configFor(tc.fam), NewSlots())
		ch := chainNamed(rs, fw)
		if ch == nil {
			t.Errorf("%s: no firewall chain: the load balancer is open", tc.fam)
			continue
		}
		got := make([][]nft.Stmt, len(ch.Rules))
		for i, r := range ch.Rules {
			got[i] = r.Stmts
		}
		if rulesString(tc.fam, got) != rulesString(tc.fam, tc.want) {
			t.Errorf("%s: firewall\n got %s\nwant %s", tc.fam, rulesString(tc.fam, got), rulesString(tc.fam, tc.want))
		}
		var ranges []string
		for _, s := range rs.Sets {
			if s.Name == fw {
				for _, e := range s.Elements {
					ranges = append(ranges, nft.RenderElementKey(s, e))
				}
			}
		}
		if !slices.Equal(ranges, tc.ranges) {
			t.Errorf("%s: admitted sources %v, want %v", tc.fam, ranges, tc.ranges)
		}
		if len(elements(t, rs, MapFirewallIPs)) != 1 {
			t.Errorf("%s: firewall-ips %v, want the load-balancer IP", tc.fam, elements(t, rs, MapFirewallIPs))
		}
	}
	// without a broken entry, a family without ranges stays open, as upstream
	lb.SourceRangesBroken = false
	if rs, _ := compileChecked(t, snapshot(lb), configFor(nft.IPv6), NewSlots()); chainNamed(rs, fw) != nil {
		t.Errorf("IPv6 without ranges and nothing broken: firewall chain present")
	}
}
