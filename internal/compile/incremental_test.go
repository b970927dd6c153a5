package compile

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// pool is every service port of every scenario, renamed apart, plus conflicting copies:
// the material the random walk below draws snapshots from.
func pool() []model.ServicePort {
	var out []model.ServicePort
	names := make([]string, 0)
	for name := range scenarios() {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		for _, p := range scenarios()[name].Services {
			sp := *p
			sp.Name.Namespace = fmt.Sprintf("%s-%d", sp.Name.Namespace, i)
			out = append(out, sp)
		}
	}
	return out
}

// mutate returns a changed copy of sp: endpoints dropped, added or flipped, a node port,
// an address or a policy changed.
func mutate(r *rand.Rand, sp model.ServicePort) model.ServicePort {
	sp.Endpoints = slices.Clone(sp.Endpoints)
	switch r.IntN(9) {
	case 0:
		if n := len(sp.Endpoints); n > 0 {
			i := r.IntN(n)
			sp.Endpoints = slices.Delete(sp.Endpoints, i, i+1)
		}
	case 1:
		k := r.IntN(200)
		sp.Endpoints = append(sp.Endpoints, ep(fmt.Sprintf("10.244.9.%d", k), 8080), ep(fmt.Sprintf("fd00:10:244:9::%x", k), 8080))
	case 2:
		if n := len(sp.Endpoints); n > 0 {
			i := r.IntN(n)
			sp.Endpoints[i].Ready = !sp.Endpoints[i].Ready
		}
	case 3:
		sp.NodePort = uint16(30000 + r.IntN(4)) // clashes on purpose
	case 4:
		sp.ExternalIPs = []netip.Addr{ip(fmt.Sprintf("203.0.113.%d", r.IntN(3)))} // clashes on purpose
	case 5:
		sp.ExternalPolicyLocal = !sp.ExternalPolicyLocal
	case 6:
		sp.AffinityTimeout = uint32(r.IntN(2) * 100)
	case 7: // who is older decides external and node port conflicts
		sp.Created = time.Unix(int64(r.IntN(3)), 0)
	case 8: // a cluster IP that is another port's external IP: refused there, then not
		sp.ClusterIPs = []netip.Addr{ip(fmt.Sprintf("203.0.113.%d", r.IntN(3)))}
	}
	return sp
}

// randomChange adds a service port of all to cur, deletes it from cur or mutates it, and
// returns its name.
func randomChange(r *rand.Rand, all []model.ServicePort, cur map[model.ServicePortName]model.ServicePort) model.ServicePortName {
	sp := all[r.IntN(len(all))]
	switch old, ok := cur[sp.Name]; {
	case !ok:
		cur[sp.Name] = sp
	case r.IntN(3) == 0:
		delete(cur, sp.Name)
	default:
		cur[sp.Name] = mutate(r, old)
	}
	return sp.Name
}

// TestCompilerIncremental walks random snapshot sequences and checks that the
// incremental Compiler, fed each one, produces exactly what a fresh Compile produces
// with the same slot history, that unchanged service ports keep their Part, and that
// changed ones get a new one. Unchanged service ports keep their pointer from one
// snapshot to the next, as the model cache's do: the claims and the limits follow the
// changes only (internal/admit), and must agree with a fresh compile's. With
// limits, the Services set aside change along the walk.
func TestCompilerIncremental(t *testing.T) {
	for _, limited := range []bool{false, true} {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(fmt.Sprintf("%s/limits=%v", fam, limited), func(t *testing.T) {
				cfg := configFor(fam)
				if limited {
					cfg.Limits = admit.Limits{MaxFrontendsPerService: 4, MaxEndpointsPerServicePort: 6, MaxElements: 300}
				}
				walkIncremental(t, fam, cfg)
			})
		}
	}
}

// walkIncremental walks random snapshots drawn from pool (without the ports skip
// names, if any).
func walkIncremental(t *testing.T, fam nft.Family, cfg Config, skip ...func(model.ServicePort) bool) {
	r := rand.New(rand.NewPCG(1, uint64(fam)))
	all := pool()
	for _, s := range skip {
		all = slices.DeleteFunc(all, s)
	}
	node := model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10")}}
	incr := NewCompiler(cfg, NewSlots())
	freshSlots := NewSlots()
	cur := map[model.ServicePortName]model.ServicePort{}
	ptrs := map[model.ServicePortName]*model.ServicePort{} // kept while unchanged
	prevParts := map[string]*nft.Part{}
	prevInput := map[model.ServicePortName]model.ServicePort{}
	for step := range 300 {
		changed := map[model.ServicePortName]bool{}
		for range 1 + r.IntN(4) {
			changed[randomChange(r, all, cur)] = true
		}
		if step%50 == 49 { // the node moves to another zone: everything recompiles
			node.Zone = fmt.Sprintf("zone-%d", step)
		}
		snap := &model.Snapshot{Node: node}
		for name, sp := range cur {
			if p := ptrs[name]; p == nil || changed[name] {
				ptrs[name] = &sp
			}
			snap.Services = append(snap.Services, ptrs[name])
		}
		for name := range ptrs {
			if _, ok := cur[name]; !ok {
				delete(ptrs, name)
			}
		}
		sort.Slice(snap.Services, func(i, j int) bool { return snap.Services[i].Name.Less(snap.Services[j].Name) })

		got, gotProblems := incr.Compile(snap)
		want, wantProblems := Compile(snap, cfg, freshSlots)
		if flat := got.Flatten(); !reflect.DeepEqual(flat, want) {
			t.Fatalf("step %d: incremental ruleset differs from a fresh compile:\n%s\nwant:\n%s", step, nft.Render(flat), nft.Render(want))
		}
		if !reflect.DeepEqual(gotProblems, wantProblems) {
			t.Fatalf("step %d: problems %v, want %v", step, gotProblems, wantProblems)
		}
		checkReferences(t, got.Flatten())
		parts := map[string]*nft.Part{}
		for _, p := range got.Parts {
			parts[p.Owner] = p
		}
		reused := 0
		for _, sp := range snap.Services {
			owner := ChainName("port", sp.Name)
			p, prev := parts[owner], prevParts[owner]
			if p == nil || prev == nil {
				continue
			}
			old := prevInput[sp.Name]
			if p == prev {
				reused++
				if !old.Equal(sp) {
					t.Fatalf("step %d: %s changed but kept its part", step, sp.Name)
				}
			}
		}
		if len(snap.Services) > 8 && reused == 0 && step%50 != 49 {
			t.Fatalf("step %d: no part of %d service ports was reused", step, len(snap.Services))
		}
		prevParts, prevInput = parts, cur
		cur = maps.Clone(cur)
	}
}

// TestLongNamesFitComments: a service port name can be 63 + 63 + 15 characters; every
// comment in the ruleset must still fit nft's 128-character limit, or the rendered text
// does not load with nft -f (found by fuzzing).
func TestLongNamesFitComments(t *testing.T) {
	sp := model.ServicePort{
		Name:            model.ServicePortName{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("s", 63), Port: strings.Repeat("p", 15), Protocol: model.ProtoTCP},
		ClusterIPs:      []netip.Addr{ip("10.96.0.1")},
		Port:            80,
		NodePort:        30080,
		LoadBalancerIPs: []netip.Addr{ip("198.51.100.1")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		AffinityTimeout: 100,
		Endpoints:       []model.Endpoint{ep("10.244.1.2", 8080)},
	}
	rs, _ := Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{sp})}, configFor(nft.IPv4), NewSlots())
	n := 0
	check := func(where, c string) {
		n++
		if len(c) > maxComment {
			t.Errorf("%s: comment of %d bytes: %q", where, len(c), c)
		}
	}
	for _, s := range rs.Sets {
		check("set "+s.Name, s.Comment)
		for _, e := range s.Elements {
			check("element of "+s.Name, e.Comment)
		}
	}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			check("rule of "+c.Name, r.Comment)
		}
	}
	if n < 10 {
		t.Fatalf("checked only %d comments", n)
	}
}

// TestFirewallOnlyForWonAddresses: two LoadBalancer services with the same ingress IP
// and port and source ranges: only the first in name order gets the firewall-ips entry
// (found by fuzzing: both parts added the key, with different verdicts).
func TestFirewallOnlyForWonAddresses(t *testing.T) {
	mk := func(name, cip string) model.ServicePort {
		return model.ServicePort{
			Name:       model.ServicePortName{Namespace: "default", Name: name, Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip(cip)}, Port: 80,
			LoadBalancerIPs: []netip.Addr{ip("198.51.100.1")},
			SourceRanges:    []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		}
	}
	rs, _ := NewCompiler(configFor(nft.IPv4), NewSlots()).Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{mk("a", "10.96.0.1"), mk("b", "10.96.0.2")})})
	owners := map[string]string{}
	for _, p := range rs.Parts {
		for _, se := range p.Elements {
			if se.Set != MapFirewallIPs {
				continue
			}
			for _, e := range se.All() {
				k := valuesString(e.Key)
				if o, dup := owners[k]; dup {
					t.Fatalf("firewall-ips key %s added by %s and %s", k, o, p.Owner)
				}
				owners[k] = p.Owner
			}
		}
	}
	if len(owners) != 1 {
		t.Fatalf("firewall-ips entries: %v, want one (service a's)", owners)
	}
}
