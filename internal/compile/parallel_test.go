package compile

import (
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// manyKinds is a snapshot of n service ports of every kind: flat ones with 0 to 20
// endpoints, session affinity, Local policies with node ports, external and
// load-balancer IPs with source ranges, more endpoints than the flat path takes, a
// cluster IP two ports claim, and dual-stack addresses.
func manyKinds(n int) *model.Snapshot {
	node := model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10"), ip("2001:db8::10")}}
	var ports []model.ServicePort
	for i := range n {
		sp := model.ServicePort{
			Name:       model.ServicePortName{Namespace: fmt.Sprintf("ns%d", i%7), Name: fmt.Sprintf("svc%05d", i), Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Port:       80,
		}
		for j := range i % 21 {
			e := ep(fmt.Sprintf("10.244.%d.%d", j, i%250), 8080)
			e.NodeName = []string{"node-1", "node-2"}[j%2]
			sp.Endpoints = append(sp.Endpoints, e)
		}
		switch {
		case i%7 == 0:
			sp.AffinityTimeout = 10800
		case i%11 == 0:
			sp.NodePort, sp.ExternalPolicyLocal = uint16(30000+i%2000), true
		case i%13 == 0:
			sp.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)})}
			sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)})}
			sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
		case i%17 == 0:
			sp.Endpoints = numbered(250)
			sp.Endpoints = append(sp.Endpoints, numbered(10)...) // 260: chained
		case i%19 == 0:
			sp.ClusterIPs = []netip.Addr{ip("10.96.255.1")} // claimed by several
		case i%23 == 0:
			sp.ClusterIPs = append(sp.ClusterIPs, netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x96, 14: byte(i >> 8), 15: byte(i)}))
			sp.Endpoints = append(sp.Endpoints, ep("fd00:244::5", 8080))
		case i%29 == 0:
			sp.InternalPolicyLocal = true
		}
		ports = append(ports, sp)
	}
	return &model.Snapshot{Node: node, Services: model.Ports(ports)}
}

// A compilation without previous parts compiles the flat ports on every core
// (compileFlat); the rulesets and problems are the ones of compiling in turn, and so are
// those of a later compilation that changes some ports.
func TestCompileFlatInParallel(t *testing.T) {
	const n = 3000
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		cfg := configFor(fam)
		par, seq := NewCompiler(cfg, NewSlots()), NewCompiler(cfg, NewSlots())
		compileBoth := func(step string, snap *model.Snapshot) {
			t.Helper()
			gotRS, gotProblems := par.Compile(snap)
			saved := parallelCompileMin
			parallelCompileMin = math.MaxInt
			wantRS, wantProblems := seq.Compile(snap)
			parallelCompileMin = saved
			if got, want := nft.Render(gotRS), nft.Render(wantRS); got != want {
				t.Fatalf("%s %s: the parallel compilation's ruleset differs (%d against %d bytes)", fam, step, len(got), len(want))
			}
			if !reflect.DeepEqual(gotProblems, wantProblems) {
				t.Fatalf("%s %s: problems %v, want %v", fam, step, gotProblems, wantProblems)
			}
			if min := map[nft.Family]int{nft.IPv4: n / 2, nft.IPv6: n / 50}[fam]; len(gotRS.Parts) < min {
				t.Fatalf("%s %s: %d parts", fam, step, len(gotRS.Parts))
			}
		}
		snap := manyKinds(n)
		compileBoth("first", snap)
		next := manyKinds(n)
		for i := 0; i < n; i += 97 {
			next.Services[i].Endpoints = numbered(3)
		}
		compileBoth("changed", next)
	}
}
