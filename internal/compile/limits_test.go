package compile

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/admit"
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

// withPort returns sp with its port named port.
func withPort(sp model.ServicePort, port string) model.ServicePort {
	sp.Name.Port = port
	return sp
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
		limits   admit.Limits
		services []model.ServicePort
		want     map[string]string // service-ips
		problems []string
	}{
		{
			name:     "a Service over the frontend cap is set aside, the others are programmed",
			limits:   admit.Limits{MaxFrontendsPerService: 100},
			services: append(hostile("evil", "wide", 5, 20, 0), web), // 5 × (1 + 20) = 105
			want:     map[string]string{"10.96.0.20 . 6 . 80": "goto svc-shop/web/tcp/p"},
			problems: []string{"Service evil/wide: 105 frontends (ports × cluster, external and load-balancer IPs), more than --max-frontends-per-service=100: the Service is not programmed"},
		},
		{
			name:     "at the frontend cap: programmed",
			limits:   admit.Limits{MaxFrontendsPerService: 105},
			services: hostile("evil", "wide", 5, 20, 0),
			problems: nil,
		},
		{
			name:   "a port over the endpoint cap sets its Service aside",
			limits: admit.Limits{MaxEndpointsPerServicePort: 3},
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
			limits: admit.Limits{MaxElements: 8},
			services: []model.ServicePort{
				nsPort("a", "newest", tcp, 80, "10.96.6.1", 3*time.Hour, "10.244.6.1"),
				nsPort("b", "oldest", tcp, 80, "10.96.6.2", time.Hour, "10.244.6.2"),
				nsPort("c", "middle", tcp, 80, "10.96.6.3", 2*time.Hour, "10.244.6.3"),
			},
			want: map[string]string{
				"10.96.6.2 . 6 . 80": "goto svc-b/oldest/tcp/p",
				"10.96.6.3 . 6 . 80": "goto svc-c/middle/tcp/p",
			},
			// three namespaces, each over its share (8/3): the shares leave the budget to
			// the oldest
			problems: []string{"Service a/newest: its namespace needs more than its share of the table's element budget (--max-table-elements), and this Service, among its newest, needs about 4 elements"},
		},
		{
			name:   "a Service over the endpoint cap in total is set aside alone",
			limits: admit.Limits{MaxEndpointsPerService: 10},
			services: []model.ServicePort{
				withPort(nsPort("evil", "multi", tcp, 80, "10.96.7.1", 0, "10.244.9.1", "10.244.9.2", "10.244.9.3", "10.244.9.4"), "a"),
				withPort(nsPort("evil", "multi", tcp, 81, "10.96.7.1", 0, "10.244.9.1", "10.244.9.2", "10.244.9.3", "10.244.9.4"), "b"),
				withPort(nsPort("evil", "multi", tcp, 82, "10.96.7.1", 0, "10.244.9.1", "10.244.9.2", "10.244.9.3", "10.244.9.4"), "c"),
				withPort(nsPort("evil", "small", tcp, 80, "10.96.7.2", 0, "10.244.9.1"), "a"),
				withPort(nsPort("shop", "ten", tcp, 80, "10.96.7.3", 0, "10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"), "a"),
				withPort(nsPort("shop", "ten", tcp, 81, "10.96.7.3", 0, "10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"), "b"),
			},
			want: map[string]string{
				"10.96.7.2 . 6 . 80": "goto svc-evil/small/tcp/a",
				"10.96.7.3 . 6 . 80": "goto svc-shop/ten/tcp/a",
				"10.96.7.3 . 6 . 81": "goto svc-shop/ten/tcp/b",
			},
			problems: []string{"Service evil/multi: 12 endpoints over its ports in total, more than --max-endpoints-per-service=10: the Service is not programmed"},
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
				if got := elements(t, rs, MapServiceIPs); fmt.Sprint(got) != fmt.Sprint(tc.want) {
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
	cfg.Limits = admit.DefaultLimits()
	evil := hostile("evil", "wide", 100, 2000, 0)
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80")
	rs, problems := Compile(snapshot(append(evil, web)...), cfg, NewSlots())
	if got := elements(t, rs, MapServiceIPs); len(got) != 1 || got["10.96.0.20 . 6 . 80"] == "" {
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

// bigService returns the ports of a Service in ns with ports ports of n endpoints each,
// created at t0 + created: what a tenant writes to fill the table budget.
func bigService(ns, name, clusterIP string, ports, n int, created time.Duration) []model.ServicePort {
	var out []model.ServicePort
	for p := range ports {
		out = append(out, model.ServicePort{
			Name:       model.ServicePortName{Namespace: ns, Name: name, Port: fmt.Sprintf("p%03d", p), Protocol: model.ProtoTCP},
			ClusterIPs: ips(clusterIP), Port: uint16(1000 + p), Endpoints: manyEndpoints(n), Created: t0.Add(created),
		})
	}
	return out
}

func costOf(sps ...[]model.ServicePort) int {
	n := 0
	for _, s := range sps {
		for i := range s {
			n += ElementCost(&s[i])
		}
	}
	return n
}

// programmed reports whether the cluster IP and port lead to a service chain.
func programmed(t *testing.T, rs *nft.Ruleset, clusterIP string, port uint16) bool {
	t.Helper()
	return elements(t, rs, MapServiceIPs)[fmt.Sprintf("%s . 6 . %d", clusterIP, port)] != ""
}

// problemsOf returns the reasons reported on namespace ns's Services, by name.
func problemsOf(problems []model.Problem, ns string) map[string]string {
	out := map[string]string{}
	for _, p := range problems {
		if p.Namespace == ns {
			out[p.Name] = p.Reason
		}
	}
	return out
}

// A tenant's two big Services fill the table budget before anyone else's Service
// exists (the attack: 99 ports × 10,000 endpoints each, here scaled down). A Service
// created afterwards in another namespace is still programmed, and the tenant's newest
// Service is the one set aside. First come, first served gave the budget to the
// tenant and set every later Service aside, in any namespace.
func TestBudgetTenantCannotStarveLaterNamespace(t *testing.T) {
	evilA := bigService("evil", "fill-a", "10.96.8.1", 4, 200, time.Hour)
	evilB := bigService("evil", "fill-b", "10.96.8.2", 4, 200, 2*time.Hour)
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 3*time.Hour, "10.244.1.80") // the newest
	cfg := testConfig()
	cfg.Limits = admit.Limits{MaxElements: costOf(evilA, evilB)} // the tenant alone fills it exactly
	sps := append(append(append([]model.ServicePort(nil), evilA...), evilB...), web)
	rs, problems := Compile(snapshot(sortedPorts(sps)...), cfg, NewSlots())
	if !programmed(t, rs, "10.96.0.20", 80) {
		t.Errorf("shop/web, created after the tenant filled the budget, is not programmed; problems %v", problems)
	}
	if got := problemsOf(problems, "shop"); len(got) != 0 {
		t.Errorf("problems on shop: %v, want none", got)
	}
	// the tenant keeps its oldest Service and loses its newest
	if !programmed(t, rs, "10.96.8.1", 1000) {
		t.Errorf("evil/fill-a (the tenant's oldest, within its share) is not programmed")
	}
	if programmed(t, rs, "10.96.8.2", 1000) {
		t.Errorf("evil/fill-b is programmed: the budget is exceeded")
	}
	evil := problemsOf(problems, "evil")
	if len(evil) != 1 || evil["fill-b"] == "" {
		t.Fatalf("problems on evil: %v, want one on fill-b", evil)
	}
	// the reason tells the tenant nothing about other namespaces: no name, not the budget
	// nor what is left of it
	left := cfg.Limits.MaxElements - costOf(evilA) - costOf([]model.ServicePort{web})
	for _, secret := range []string{"shop", "web", "older", fmt.Sprint(cfg.Limits.MaxElements), fmt.Sprint(left)} {
		if strings.Contains(evil["fill-b"], secret) {
			t.Errorf("the tenant's reason %q discloses %q", evil["fill-b"], secret)
		}
	}
	if n := elementCount(rs); n > cfg.Limits.MaxElements {
		t.Errorf("%d elements in the table, over the budget of %d", n, cfg.Limits.MaxElements)
	}
}

// A Helm upgrade that deletes and re-creates the victim's Service (a new, later
// creationTimestamp) while a tenant holds the budget: the re-created Service is
// programmed again, on the incremental path a running proxy takes, and the tenant's
// newest Service makes room.
func TestBudgetRecreatedServiceIsProgrammedAgain(t *testing.T) {
	evilA := bigService("evil", "fill-a", "10.96.8.1", 4, 200, time.Hour)
	evilB := bigService("evil", "fill-b", "10.96.8.2", 4, 200, 2*time.Hour)
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80", "10.244.1.81")
	cfg := testConfig()
	cfg.Limits = admit.Limits{MaxElements: costOf(evilA, evilB)}
	cc := NewCompiler(cfg, NewSlots())
	for _, step := range []struct {
		name      string
		sps       [][]model.ServicePort
		web, full bool // web is programmed; evil/fill-b is programmed
	}{
		{"the victim, then the tenant's first Service", [][]model.ServicePort{{web}, evilA}, true, false},
		{"the tenant's second Service: over the budget", [][]model.ServicePort{{web}, evilA, evilB}, true, false},
		{"helm deletes the victim: the tenant alone fits", [][]model.ServicePort{evilA, evilB}, false, true},
		{"helm re-creates the victim, the newest Service now", [][]model.ServicePort{{withCreated(web, 3*time.Hour)}, evilA, evilB}, true, false},
	} {
		var sps []model.ServicePort
		for _, s := range step.sps {
			sps = append(sps, s...)
		}
		rs, problems := cc.Compile(snapshot(sortedPorts(sps)...))
		fresh, freshProblems := Compile(snapshot(sortedPorts(sps)...), cfg, NewSlots())
		if got, want := elements(t, rs.Flatten(), MapServiceIPs), elements(t, fresh, MapServiceIPs); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: incremental service-ips %v, a fresh compile's %v", step.name, got, want)
		}
		if fmt.Sprint(problems) != fmt.Sprint(freshProblems) {
			t.Errorf("%s: incremental problems %v, a fresh compile's %v", step.name, problems, freshProblems)
		}
		if got := programmed(t, rs.Flatten(), "10.96.0.20", 80); got != step.web {
			t.Errorf("%s: shop/web programmed %v, want %v; problems %v", step.name, got, step.web, problems)
		}
		if got := programmed(t, rs.Flatten(), "10.96.8.2", 1000); got != step.full {
			t.Errorf("%s: evil/fill-b programmed %v, want %v", step.name, got, step.full)
		}
		if !programmed(t, rs.Flatten(), "10.96.8.1", 1000) {
			t.Errorf("%s: evil/fill-a (the tenant's oldest) is not programmed", step.name)
		}
		if p := problemsOf(problems, "shop"); len(p) != 0 {
			t.Errorf("%s: problems on shop %v, want none", step.name, p)
		}
	}
}

func withCreated(sp model.ServicePort, created time.Duration) model.ServicePort {
	sp.Created = t0.Add(created)
	return sp
}

// Over the budget only the namespaces over their share lose Services, newest first;
// what their shares leave unused goes to their next-oldest Services.
func TestBudgetSharesBetweenNamespaces(t *testing.T) {
	// costs: 2 × (1 cluster IP + endpoints) per single-port Service
	svc := func(ns, name, cip string, created time.Duration, n int) model.ServicePort {
		sp := nsPort(ns, name, tcp, 80, cip, created)
		sp.Endpoints = manyEndpoints(n)
		return sp
	}
	sps := []model.ServicePort{
		svc("a", "small", "10.96.1.1", 5*time.Hour, 4), // 10, the newest of all
		svc("b", "one", "10.96.2.1", 0, 19),            // 40
		svc("b", "two", "10.96.2.2", time.Hour, 19),    // 40
		svc("b", "three", "10.96.2.3", 2*time.Hour, 9), // 20
		svc("c", "one", "10.96.3.1", time.Hour, 29),    // 60
		svc("c", "two", "10.96.3.2", 3*time.Hour, 14),  // 30
	}
	if c := costOf(sps); c != 200 {
		t.Fatalf("the Services cost %d, want 200 (ElementCost changed: adjust the test)", c)
	}
	cfg := testConfig()
	// 130: a needs 10 (within), b and c share 120: 60 each. b keeps one (40) and three
	// (20) = 60; c keeps one (60). Left: 0, so b/two and c/two are set aside.
	cfg.Limits = admit.Limits{MaxElements: 130}
	rs, problems := Compile(snapshot(sortedPorts(sps)...), cfg, NewSlots())
	got := map[string]bool{}
	for _, p := range problems {
		got[p.Namespace+"/"+p.Name] = true
	}
	if want := map[string]bool{"b/two": true, "c/two": true}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("set aside %v, want %v", got, want)
	}
	if !programmed(t, rs, "10.96.1.1", 80) {
		t.Errorf("a/small, the newest Service but within its namespace's share, is not programmed")
	}
	// 140: a takes 10, b and c 65 each: b keeps one and three (60), c keeps one (60);
	// the 10 left fit neither b/two (40) nor c/two (30).
	// 170: shares of 80: b keeps one and two (80), c one (60); the 20 left go to the
	// oldest of the rest that fits, b/three (20), none to c/two.
	// 190: c needs 90, within its part of the 180 left; b's share is 90: one and two
	// (80); b/three (20) does not fit the 10 left.
	for _, tc := range []struct {
		max  int
		want string
	}{
		{140, "map[b/two:true c/two:true]"},
		{170, "map[c/two:true]"},
		{190, "map[b/three:true]"},
		{200, "map[]"},
	} {
		cfg.Limits.MaxElements = tc.max
		_, problems := Compile(snapshot(sortedPorts(sps)...), cfg, NewSlots())
		got := map[string]bool{}
		for _, p := range problems {
			got[p.Namespace+"/"+p.Name] = true
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("budget %d: set aside %v, want %v", tc.max, got, tc.want)
		}
	}
}

// The budget's incremental bookkeeping (per namespace, over-limit Services) agrees with
// a fresh compile's along random changes, with a budget tight enough to be shared most
// of the time and a cap on each Service's endpoints.
func TestCompilerIncrementalBudget(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			cfg := configFor(fam)
			cfg.Limits = admit.Limits{MaxEndpointsPerService: 8, MaxElements: 80}
			// a Maglev port alone costs 50 times this budget: its namespace would take its
			// share and leave the others too little for the walk to reuse parts
			walkIncremental(t, fam, cfg, func(sp model.ServicePort) bool { return sp.Balancing == model.BalancingMaglev })
		})
	}
}

// BenchmarkBudgetAddOneService is a steady-state sync that adds (or removes) one
// Service at 30,000 Services in 100 namespaces, with the limits off, under the table
// budget, and over it because one tenant namespace needs far more than its share (100
// ports of 1,000 endpoints). Under the budget the limits cost the look at the changed
// Service; over it, a sort of the namespaces and a walk over the tenant's ports.
//
//	go test ./internal/compile -run '^$' -bench BudgetAddOneService
func BenchmarkBudgetAddOneService(b *testing.B) {
	var base []*model.ServicePort
	for i := range 30000 {
		sp := &model.ServicePort{
			Name:       model.ServicePortName{Namespace: fmt.Sprintf("ns%03d", i%100), Name: fmt.Sprintf("s%06d", i), Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i/65536), byte(i / 256), byte(i)})},
			Port:       80, Created: t0,
		}
		for j := range 10 {
			k := i*10 + j
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + k/65536), byte(k / 256), byte(k)}), Port: 8080, Ready: true, Serving: true})
		}
		base = append(base, sp)
	}
	tenantEps := manyEndpoints(1000)
	for p := range 100 {
		base = append(base, &model.ServicePort{
			Name:       model.ServicePortName{Namespace: "tenant", Name: "fill", Port: fmt.Sprintf("p%03d", p), Protocol: model.ProtoTCP},
			ClusterIPs: ips("10.100.0.1"), Port: uint16(1000 + p), Endpoints: tenantEps, Created: t0,
		})
	}
	slices.SortFunc(base, func(a, b *model.ServicePort) int { return a.Name.Compare(b.Name) })
	added := &model.ServicePort{
		Name:       model.ServicePortName{Namespace: "ns050", Name: "added", Port: "http", Protocol: model.ProtoTCP},
		ClusterIPs: ips("10.101.0.1"), Port: 80, Endpoints: eps(8080, "10.244.200.1"), Created: t0.Add(time.Hour),
	}
	with := slices.Insert(slices.Clone(base), sort.Search(len(base), func(i int) bool { return !base[i].Name.Less(added.Name) }), added)
	node := model.Node{Name: "node-1", IPs: ips("192.0.2.10")}
	total, tenant := 0, 0
	for _, sp := range with {
		total += ElementCost(sp)
		if sp.Name.Namespace == "tenant" {
			tenant += ElementCost(sp)
		}
	}
	for _, tc := range []struct {
		name   string
		limits admit.Limits
	}{
		{"limits=off", admit.Limits{}},
		{"under-budget", admit.DefaultLimits()},
		{"over-budget", admit.Limits{MaxElements: total - tenant*3/4}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := testConfig()
			cfg.Limits = tc.limits
			cc := NewCompiler(cfg, NewSlots())
			snaps := [2]*model.Snapshot{{Node: node, Services: base}, {Node: node, Services: with}}
			_, problems := cc.Compile(snaps[1])
			if over := len(problems) > 0; over != (tc.name == "over-budget") {
				b.Fatalf("%d problems (%v…)", len(problems), problems[:min(len(problems), 1)])
			}
			i := 0
			for b.Loop() {
				cc.Compile(snaps[i%2])
				i++
			}
		})
	}
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
	cfg.Limits = admit.Limits{MaxSourceRangesPerService: 499}
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80")
	rs, problems := Compile(snapshot(append(rangesService(3, 500), web)...), cfg, NewSlots())
	checkProblems(t, problems, []string{"Service default/fenced: 500 loadBalancerSourceRanges, more than --max-source-ranges-per-service=499: the Service is not programmed"})
	if got := elements(t, rs, MapServiceIPs); len(got) != 1 || got["10.96.0.20 . 6 . 80"] == "" {
		t.Errorf("service-ips %v, want only shop/web", got)
	}
	cfg.Limits.MaxSourceRangesPerService = 500
	if _, problems := Compile(snapshot(rangesService(3, 500)...), cfg, NewSlots()); len(problems) > 0 {
		t.Errorf("at the cap: %v", problems)
	}
}
