package compile

import (
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// Every part, its rules and its elements carry the compiler's tag naming their service
// port, whatever its comment says (comments are cut at 128 bytes); the table's own rules
// carry a purpose and no service port.
func TestTags(t *testing.T) {
	for name, snap := range scenarios() {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			rs, _ := NewCompiler(configFor(fam), NewSlots()).Compile(snap)
			for _, c := range rs.Chains {
				for _, r := range c.Rules {
					if _, ok := ServicePortOf(r.Tag); ok || PurposeOf(r.Tag) == PurposeNone {
						t.Errorf("%s %s: table rule %s %v: tag %v, want a purpose without a service port", name, fam, c.Name, r.Stmts, r.Tag)
					}
				}
			}
			for _, p := range rs.Parts {
				sp, ok := ServicePortOf(p.Tag)
				if !ok || PurposeOf(p.Tag) != PurposeServicePort || p.Owner != ChainName("port", sp) {
					t.Errorf("%s %s: part %s: tag %v", name, fam, p.Owner, p.Tag)
					continue
				}
				for _, c := range p.Chains {
					for _, r := range c.Rules {
						if got, ok := ServicePortOf(r.Tag); !ok || got != sp || PurposeOf(r.Tag) == PurposeServicePort {
							t.Errorf("%s %s: rule %v of %s: tag %v", name, fam, r.Stmts, c.Name, r.Tag)
						}
					}
				}
				for _, se := range p.Elements {
					for _, e := range se.All() {
						if got, ok := ServicePortOf(e.Tag); !ok || got != sp || PurposeOf(e.Tag) == PurposeServicePort {
							t.Errorf("%s %s: element %v of %s: tag %v", name, fam, e.Key, se.Set, e.Tag)
						}
					}
				}
			}
		}
	}
}

// purposesOf counts the purposes of one service port's rules and elements.
func purposesOf(rs *nft.Ruleset, sp model.ServicePortName) map[Purpose]int {
	out := map[Purpose]int{}
	for _, p := range rs.Parts {
		if got, _ := ServicePortOf(p.Tag); got != sp {
			continue
		}
		for _, c := range p.Chains {
			for _, r := range c.Rules {
				out[PurposeOf(r.Tag)]++
			}
		}
		for _, se := range p.Elements {
			for _, e := range se.All() {
				out[PurposeOf(e.Tag)]++
			}
		}
	}
	return out
}

func TestTagPurposes(t *testing.T) {
	snap := policiesScenario()
	rs, _ := NewCompiler(testConfig(), NewSlots()).Compile(snap)
	etpLocal := snap.Services[1].Name
	got := purposesOf(rs, etpLocal)
	// a cluster IP, a load-balancer IP and a node port; one local and one remote endpoint
	want := map[Purpose]int{
		PurposeClusterIP: 1, PurposeDispatch: 3, PurposeCount: 3, PurposeSourceRanges: 1,
		PurposeSourceRangeAllow: 3 /* the lookup rule; the range, and the node via the VIP, in its set */, PurposeSourceRangeDrop: 1, PurposeMarkOffCluster: 1,
		PurposeShortCircuitPods: 1, PurposeMarkLocalSource: 1, PurposeShortCircuitLocal: 1, PurposeToEndpoints: 1,
		PurposeEndpointDNAT: 2, PurposeEndpointSlot: 3, PurposeHairpin: 3,
	}
	for p, n := range want {
		if got[p] != n {
			t.Errorf("%s: %d objects with purpose %q, want %d (all: %v)", etpLocal, got[p], p, n, got)
		}
	}
	// no local endpoint: its external frontends drop, tagged so, not by the verdict
	remoteOnly := purposesOf(rs, snap.Services[2].Name)
	if remoteOnly[PurposeDropNoLocalEndpoints] != 1 || remoteOnly[PurposeRejectNoEndpoints] != 0 {
		t.Errorf("%s: purposes %v, want one drop for the node port", snap.Services[2].Name, remoteOnly)
	}
	affinity := purposesOf(rs, snap.Services[0].Name)
	if affinity[PurposeAffinityLookup] != 3 || affinity[PurposeAffinityPick] != 3 || affinity[PurposeAffinityRecord] != 3 || affinity[PurposeEndpointDNAT] != 3 {
		t.Errorf("%s: purposes %v, want 3 affinity lookups, picks, records and DNATs", snap.Services[0].Name, affinity)
	}
}

// Two service ports whose names only differ beyond the 128 bytes a comment holds have the
// same comments but their own tags.
func TestTagsLongNames(t *testing.T) {
	ns, name := strings.Repeat("n", 63), strings.Repeat("s", 63)
	a := model.ServicePortName{Namespace: ns, Name: name, Port: "port-a", Protocol: model.ProtoTCP}
	b := model.ServicePortName{Namespace: ns, Name: name, Port: "port-b", Protocol: model.ProtoTCP}
	snap := snapshot(
		model.ServicePort{Name: a, ClusterIPs: ips("10.96.0.1"), Port: 80, Endpoints: eps(8080, "10.244.1.1")},
		model.ServicePort{Name: b, ClusterIPs: ips("10.96.0.1"), Port: 81, Endpoints: eps(8080, "10.244.1.1")},
	)
	rs, _ := NewCompiler(testConfig(), NewSlots()).Compile(snap)
	byKey := map[uint32]model.ServicePortName{}
	comments := map[string]bool{}
	for _, p := range rs.Parts {
		for _, se := range p.Elements {
			if se.Set != SetServiceCounters {
				continue
			}
			for _, e := range se.All() {
				sp, _ := ServicePortOf(e.Tag)
				byKey[e.Key[2].Num()] = sp
				comments[e.Comment] = true
			}
		}
	}
	if len(comments) != 1 {
		t.Fatalf("comments %v: want one (cut at 128 bytes)", comments)
	}
	if byKey[80] != a || byKey[81] != b {
		t.Errorf("counter elements' service ports %v, want 80 → %v, 81 → %v", byKey, a, b)
	}
}
