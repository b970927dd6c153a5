package compile

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// treePick follows the endpoint-count tree from root as the kernel would for a key whose
// count is n (in bit set b exactly when bit b of n is 1) and returns the modulus of the
// DNAT it reaches, or an error.
func treePick(rs *nft.Ruleset, root, bitSet string, n uint32) (uint32, error) {
	chain, steps := root, 0
	for ; steps < 32; steps++ {
		ch := chainNamed(rs, chain)
		if ch == nil {
			return 0, fmt.Errorf("chain %s missing", chain)
		}
		next := ""
	rules:
		for _, r := range ch.Rules {
			for _, st := range r.Stmts {
				switch st := st.(type) {
				case nft.Lookup:
					b, err := strconv.Atoi(strings.TrimPrefix(st.Set, bitSet))
					if !strings.HasPrefix(st.Set, bitSet) || err != nil {
						return 0, fmt.Errorf("%s: lookup in %s", chain, st.Set)
					}
					if n>>b&1 == 0 {
						continue rules // no match: next rule
					}
				case nft.DNATKeyMap:
					return st.Mod, nil
				case nft.Verdict:
					if st.Kind != nft.Goto {
						return 0, fmt.Errorf("%s: verdict %v", chain, st)
					}
					next = st.Chain
					break rules
				default:
					return 0, fmt.Errorf("%s: unexpected %T", chain, st)
				}
			}
		}
		if next == "" {
			return 0, fmt.Errorf("count %d falls off the end of %s", n, chain)
		}
		chain = next
	}
	return 0, fmt.Errorf("count %d: no DNAT within %d chains", n, steps)
}

// TestTreeReachesEveryCount: for every depth and every count the tree expresses, the
// chains reading the bit sets end in a DNAT drawing among exactly that many entries, for
// both kinds of key, within the kernel's jump depth.
func TestTreeReachesEveryCount(t *testing.T) {
	for depth := minTreeBits; depth <= countBits; depth++ {
		for _, k := range []struct{ prefix, bits string }{{chainLB, setEndpointCountBit}, {chainNodePortLB, setNodePortEndpointCountBit}} {
			rs := &nft.Ruleset{Chains: appendTree(nil, depth, k.prefix, k.bits, MapEndpoints, frontendFields)}
			if want := 1<<depth - 1; len(rs.Chains) != want {
				t.Errorf("depth %d: %d chains, want %d", depth, len(rs.Chains), want)
			}
			for n := uint32(1); n < 1<<depth; n++ {
				mod, err := treePick(rs, treeNode(k.prefix, 0, 1<<depth), k.bits, n)
				if err != nil || mod != n {
					t.Fatalf("depth %d %s: count %d draws mod %d (%v)", depth, k.prefix, n, mod, err)
				}
			}
		}
	}
}

// TestFlatOrChained: which service ports keep a chain of their own, and that the trees
// grow with the largest count and never shrink.
func TestFlatOrChained(t *testing.T) {
	base := func(n int, mut func(*model.ServicePort)) model.ServicePort {
		sp := model.ServicePort{Name: spn("s", "p", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, Endpoints: manyEndpoints(n)}
		if mut != nil {
			mut(&sp)
		}
		return sp
	}
	for _, tc := range []struct {
		name string
		sp   model.ServicePort
		flat bool
	}{
		{"plain ClusterIP", base(3, nil), true},
		{"255 endpoints", base(255, nil), true},
		{"256 endpoints", base(256, nil), false},
		{"session affinity", base(3, func(sp *model.ServicePort) { sp.AffinityTimeout = 10800 }), false},
		{"node port, Cluster policy", base(3, func(sp *model.ServicePort) { sp.NodePort = 30080 }), true},
		{"node port, Local policy", base(3, func(sp *model.ServicePort) { sp.NodePort, sp.ExternalPolicyLocal = 30080, true }), false},
		{"Local external policy, no external frontend", base(3, func(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }), true},
		{"internal Local policy", base(3, func(sp *model.ServicePort) { sp.InternalPolicyLocal = true }), true},
		{"16 frontends × 255 endpoints (4080 entries)", base(255, func(sp *model.ServicePort) {
			for i := range 15 {
				sp.ExternalIPs = append(sp.ExternalIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)}))
			}
		}), true},
		{"17 frontends × 255 endpoints (4335 entries)", base(255, func(sp *model.ServicePort) {
			for i := range 16 {
				sp.ExternalIPs = append(sp.ExternalIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)}))
			}
		}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := snapshot(tc.sp)
			snap.Node = model.Node{Name: "node-1"}
			rs, problems := compileChecked(t, snap, testConfig(), NewSlots())
			checkProblems(t, problems, nil)
			if got := isFlat(rs, tc.sp.Name); got != tc.flat {
				t.Errorf("flat = %v, want %v", got, tc.flat)
			}
		})
	}

	slots := NewSlots()
	cc := NewCompiler(testConfig(), slots)
	root := func(n int) string {
		rs, _ := cc.Compile(snapshot(base(n, nil)))
		return chainNamed(rs, ChainClusterFront).Rules[1].Stmts[0].(nft.Verdict).Chain
	}
	for _, step := range []struct {
		n    int
		root string
	}{{3, "lb-0-15"}, {15, "lb-0-15"}, {16, "lb-0-31"}, {3, "lb-0-31"}, {200, "lb-0-255"}, {1, "lb-0-255"}} {
		if got := root(step.n); got != step.root {
			t.Errorf("%d endpoints: tree root %s, want %s (the trees never shrink)", step.n, got, step.root)
		}
	}
}
