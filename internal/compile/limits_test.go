package compile

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// addrs returns n distinct addresses counting up from base.
func addrs(base string, n int) []netip.Addr {
	out := make([]netip.Addr, n)
	a := ip(base)
	for i := range out {
		out[i] = a
		a = a.Next()
	}
	return out
}

// hostile returns the ports of one Service with ports × externalIPs frontends.
func hostile(ns, name string, ports, externals int, created time.Duration) []model.ServicePort {
	ext := addrs("203.0.113.0", externals)
	var out []model.ServicePort
	for p := range ports {
		out = append(out, model.ServicePort{
			Name:       model.ServicePortName{Namespace: ns, Name: name, Port: fmt.Sprintf("p%03d", p), Protocol: model.ProtoTCP},
			ClusterIPs: ips("10.96.9.9"), Port: uint16(1000 + p), ExternalIPs: ext,
			Endpoints: eps(8080, "10.244.9.9"), Created: t0.Add(created),
		})
	}
	return out
}

func elementCount(rs *nft.Ruleset) int {
	n := 0
	for _, s := range rs.Flatten().Sets {
		n += len(s.Elements)
	}
	return n
}

func TestLimits(t *testing.T) {
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80")
	for _, tc := range []struct {
		name     string
		limits   Limits
		services []model.ServicePort
		want     map[string]string // service-ips
		problems []string
	}{
		{
			name:     "a Service over the frontend cap is set aside, the others are programmed",
			limits:   Limits{MaxFrontendsPerService: 100},
			services: append(hostile("evil", "wide", 5, 20, 0), web), // 5 × (1 + 20) = 105
			want:     map[string]string{"10.96.0.20 . 6 . 80": "goto svc-shop/web/tcp/p"},
			problems: []string{"Service evil/wide: 105 frontends (ports × cluster, external and load-balancer IPs), more than --max-frontends-per-service=100: the Service is not programmed"},
		},
		{
			name:     "at the frontend cap: programmed",
			limits:   Limits{MaxFrontendsPerService: 105},
			services: hostile("evil", "wide", 5, 20, 0),
			problems: nil,
		},
		{
			name:   "a port over the endpoint cap sets its Service aside",
			limits: Limits{MaxEndpointsPerServicePort: 3},
			services: []model.ServicePort{
				nsPort("evil", "many", tcp, 80, "10.96.5.1", 0, "10.244.9.1", "10.244.9.2", "10.244.9.3", "10.244.9.4"),
				nsPort("shop", "three", tcp, 80, "10.96.5.2", 0, "10.244.1.1", "10.244.1.2", "10.244.1.3"),
			},
			want:     map[string]string{"10.96.5.2 . 6 . 80": "goto svc-shop/three/tcp/p"},
			problems: []string{`Service evil/many: port "p" has 4 endpoints, more than --max-endpoints-per-service-port=3: the Service is not programmed`},
		},
		{
			// each of these costs 2 × (1 cluster IP + 1 endpoint) = 4 elements
			name:   "over the table budget the newest Services are set aside, whatever their names",
			limits: Limits{MaxElements: 8},
			services: []model.ServicePort{
				nsPort("a", "newest", tcp, 80, "10.96.6.1", 3*time.Hour, "10.244.6.1"),
				nsPort("b", "oldest", tcp, 80, "10.96.6.2", time.Hour, "10.244.6.2"),
				nsPort("c", "middle", tcp, 80, "10.96.6.3", 2*time.Hour, "10.244.6.3"),
			},
			want: map[string]string{
				"10.96.6.2 . 6 . 80": "goto svc-b/oldest/tcp/p",
				"10.96.6.3 . 6 . 80": "goto svc-c/middle/tcp/p",
			},
			problems: []string{"Service a/newest: the table's element budget (--max-table-elements=8) is taken by older Services; this one needs about 4 more"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Limits = tc.limits
			snap := snapshot(sortedPorts(tc.services)...)
			rs, problems := Compile(snap, cfg, NewSlots())
			checkUniqueKeys(t, rs)
			checkReferences(t, rs)
			if tc.want != nil {
				if got := elements(t, rs, mapServiceIPs); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("service-ips:\n got  %v\n want %v", got, tc.want)
				}
			}
			checkProblems(t, problems, tc.problems)
			// the other family reports nothing about IPv4-only Services
			cfg6 := configFor(nft.IPv6)
			cfg6.Limits = tc.limits
			if _, p6 := Compile(snap, cfg6, NewSlots()); len(p6) != 0 {
				t.Errorf("IPv6 problems %v, want none (each Service is reported once)", p6)
			}
		})
	}
}

// The 32 KB Service (100 ports × 2,000 externalIPs) costs nothing beyond a pass
// over its ports with the default limits: none of its 200,000 frontends is compiled.
func TestHostileServiceWithDefaultLimits(t *testing.T) {
	cfg := testConfig()
	cfg.Limits = DefaultLimits()
	evil := hostile("evil", "wide", 100, 2000, 0)
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80")
	rs, problems := Compile(snapshot(append(evil, web)...), cfg, NewSlots())
	if got := elements(t, rs, mapServiceIPs); len(got) != 1 || got["10.96.0.20 . 6 . 80"] == "" {
		t.Errorf("service-ips %v, want only shop/web", got)
	}
	if n := elementCount(rs); n > 10 {
		t.Errorf("%d elements in the table, want the handful of shop/web's", n)
	}
	checkProblems(t, problems, []string{"Service evil/wide: 200100 frontends"})
}

// TestBytesPerObject measures what compiling costs per frontend and per endpoint (heap
// allocated while compiling, and retained by the ruleset). The figures are logged for
// docs/security.md; only the element counts are asserted.
//
//	go test ./internal/compile -run BytesPerObject -v
func TestBytesPerObject(t *testing.T) {
	measure := func(name string, sps []model.ServicePort, objects int) {
		cfg := testConfig()
		snap := snapshot(sps...)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		rs, _ := Compile(snap, cfg, NewSlots())
		runtime.GC()
		runtime.ReadMemStats(&after)
		n := elementCount(rs)
		t.Logf("%s: %d objects → %d elements; %.0f bytes allocated and %.0f retained per object",
			name, objects, n, float64(after.TotalAlloc-before.TotalAlloc)/float64(objects),
			float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(objects))
		if n < 2*objects {
			t.Errorf("%s: %d elements for %d objects, want at least 2 each", name, n, objects)
		}
		runtime.KeepAlive(rs)
	}
	measure("frontends (10 ports × 1000 externalIPs)", hostile("x", "wide", 10, 999, 0), 10*1000)
	measure("endpoints (1 port × 10000 endpoints)", []model.ServicePort{{
		Name: spn("many", "p", tcp), ClusterIPs: ips("10.96.9.9"), Port: 80, Endpoints: manyEndpoints(10000),
	}}, 10000)
}

// A Service's source ranges are one set lookup per port, however many there are: an
// off-range packet used to walk a rule per range (20,000 ranges: 1.2 ms a packet).
func TestSourceRangesOneLookup(t *testing.T) {
	sps := rangesService(2, 20000)
	// a range holding another and two neighbours merge with it
	sps[0].SourceRanges = append(slices.Clone(sps[0].SourceRanges), netip.MustParsePrefix("100.64.0.0/31"), netip.MustParsePrefix("100.64.0.1/32"))
	sps[1].SourceRanges = sps[0].SourceRanges
	rs, problems := Compile(snapshot(sps...), testConfig(), NewSlots())
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	checkReferences(t, rs)
	for _, sp := range sps {
		fw := ChainName("fw", sp.Name)
		ch := chainNamed(rs, fw)
		if ch == nil || len(ch.Rules) != 2 {
			t.Fatalf("%s: firewall chain %v, want a lookup and a drop", sp.Name, ch)
		}
		if l, ok := ch.Rules[0].Stmts[0].(nft.Lookup); !ok || l.Set != fw {
			t.Errorf("%s: first rule %v, want a lookup of the set %s", sp.Name, ch.Rules[0].Stmts, fw)
		}
		s := setNamed(rs, fw)
		if s == nil || !s.Interval || len(s.Elements) != 20000-1 {
			t.Fatalf("%s: source set %+v, want an interval set of 19999 ranges", sp.Name, s)
		}
		if got := nft.RenderElementKey(s, s.Elements[0]); got != "100.64.0.0-100.64.0.2" {
			t.Errorf("%s: first range %s, want 100.64.0.0-100.64.0.2 (merged)", sp.Name, got)
		}
	}
}

// What affinity and source ranges cost the kernel is counted in the budget, and a
// Service with more ranges than the cap is set aside.
func TestSourceRangesAndAffinityCost(t *testing.T) {
	plain := affinityService(100)
	plain[0].AffinityTimeout = 0
	sticky := affinityService(100)
	if d := ElementCost(&sticky[0]) - ElementCost(&plain[0]); d != 100*affinityCost {
		t.Errorf("affinity adds %d elements to 100 endpoints, want %d", d, 100*affinityCost)
	}
	fenced := rangesService(1, 500)
	open := fenced[0]
	open.SourceRanges = nil
	if d := ElementCost(&fenced[0]) - ElementCost(&open); d != 1+2*500 {
		t.Errorf("500 source ranges add %d elements, want %d", d, 1+2*500)
	}

	cfg := testConfig()
	cfg.Limits = Limits{MaxSourceRangesPerService: 499}
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80")
	rs, problems := Compile(snapshot(append(rangesService(3, 500), web)...), cfg, NewSlots())
	checkProblems(t, problems, []string{"Service default/fenced: 500 loadBalancerSourceRanges, more than --max-source-ranges-per-service=499: the Service is not programmed"})
	if got := elements(t, rs, mapServiceIPs); len(got) != 1 || got["10.96.0.20 . 6 . 80"] == "" {
		t.Errorf("service-ips %v, want only shop/web", got)
	}
	cfg.Limits.MaxSourceRangesPerService = 500
	if _, problems := Compile(snapshot(rangesService(3, 500)...), cfg, NewSlots()); len(problems) > 0 {
		t.Errorf("at the cap: %v", problems)
	}
}
