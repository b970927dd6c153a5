package compile

import (
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
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
					if _, ok := purpose.ServicePortOf(r.Tag); ok || purpose.Of(r.Tag) == purpose.None {
						t.Errorf("%s %s: table rule %s %v: tag %v, want a purpose without a service port", name, fam, c.Name, r.Stmts, r.Tag)
					}
				}
			}
			for _, p := range rs.Parts {
				sp, ok := purpose.ServicePortOf(p.Tag)
				if !ok || purpose.Of(p.Tag) != purpose.ServicePort || p.Owner != ChainName("port", sp) {
					t.Errorf("%s %s: part %s: tag %v", name, fam, p.Owner, p.Tag)
					continue
				}
				for _, c := range p.Chains {
					for _, r := range c.Rules {
						if got, ok := purpose.ServicePortOf(r.Tag); !ok || got != sp || purpose.Of(r.Tag) == purpose.ServicePort {
							t.Errorf("%s %s: rule %v of %s: tag %v", name, fam, r.Stmts, c.Name, r.Tag)
						}
					}
				}
				for _, se := range p.Elements {
					for _, e := range se.All() {
						if got, ok := purpose.ServicePortOf(e.Tag); !ok || got != sp || purpose.Of(e.Tag) == purpose.ServicePort {
							t.Errorf("%s %s: element %v of %s: tag %v", name, fam, e.Key, se.Set, e.Tag)
						}
					}
				}
			}
		}
	}
}

// purposesOf counts the purposes of one service port's rules and elements.
func purposesOf(rs *nft.Ruleset, sp model.ServicePortName) map[purpose.Purpose]int {
	out := map[purpose.Purpose]int{}
	for _, p := range rs.Parts {
		if got, _ := purpose.ServicePortOf(p.Tag); got != sp {
			continue
		}
		for _, c := range p.Chains {
			for _, r := range c.Rules {
				out[purpose.Of(r.Tag)]++
			}
		}
		for _, se := range p.Elements {
			for _, e := range se.All() {
				out[purpose.Of(e.Tag)]++
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
	want := map[purpose.Purpose]int{
		purpose.ClusterIP: 1, purpose.Dispatch: 3, purpose.Count: 3, purpose.SourceRanges: 1,
		purpose.SourceRangeAllow: 3 /* the lookup rule; the range, and the node via the VIP, in its set */, purpose.SourceRangeDrop: 1, purpose.MarkOffCluster: 1,
		purpose.ShortCircuitPods: 1, purpose.MarkLocalSource: 1, purpose.ShortCircuitLocal: 1, purpose.ToEndpoints: 1,
		purpose.EndpointDNAT: 2, purpose.EndpointSlot: 3, purpose.Hairpin: 3,
	}
	for p, n := range want {
		if got[p] != n {
			t.Errorf("%s: %d objects with purpose %q, want %d (all: %v)", etpLocal, got[p], p, n, got)
		}
	}
	// no local endpoint: its external frontends drop, tagged so, not by the verdict
	remoteOnly := purposesOf(rs, snap.Services[2].Name)
	if remoteOnly[purpose.DropNoLocalEndpoints] != 1 || remoteOnly[purpose.RejectNoEndpoints] != 0 {
		t.Errorf("%s: purposes %v, want one drop for the node port", snap.Services[2].Name, remoteOnly)
	}
	affinity := purposesOf(rs, snap.Services[0].Name)
	if affinity[purpose.AffinityLookup] != 3 || affinity[purpose.AffinityPick] != 3 || affinity[purpose.AffinityRecord] != 3 || affinity[purpose.EndpointDNAT] != 3 {
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
				sp, _ := purpose.ServicePortOf(e.Tag)
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
