package model_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftproxy/nftproxy/internal/model"
)

func problemSet(ps []model.Problem) map[model.Problem]bool {
	out := map[model.Problem]bool{}
	for _, p := range ps {
		out[p] = true
	}
	return out
}

// Everything the compiler needs is in the snapshot when it is built: service CIDRs and
// node port addresses come in as inputs (copies: the caller's slices may change), the
// same through Build and the Cache.
func TestBuildFromInputs(t *testing.T) {
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	in := model.Inputs{Services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(svcPort("http", v1.ProtocolTCP, 80, 0)))}, ServiceCIDRs: cidrs, NodePortAddrs: addrs}
	built, _ := model.BuildFrom(in)
	cached, _ := model.NewCache().BuildFrom(in)
	for name, snap := range map[string]*model.Snapshot{"BuildFrom": built, "Cache.BuildFrom": cached} {
		if !slices.Equal(snap.ServiceCIDRs, cidrs) || !slices.Equal(snap.NodePortAddrs, addrs) || len(snap.Services) != 1 {
			t.Errorf("%s: service CIDRs %v, node port addresses %v, %d service ports", name, snap.ServiceCIDRs, snap.NodePortAddrs, len(snap.Services))
		}
	}
	cidrs[0], addrs[0] = netip.MustParsePrefix("10.0.0.0/8"), netip.MustParseAddr("192.0.2.99")
	if built.ServiceCIDRs[0].String() != "10.96.0.0/16" || built.NodePortAddrs[0].String() != "192.0.2.10" {
		t.Errorf("the snapshot shares the caller's slices: %v %v", built.ServiceCIDRs, built.NodePortAddrs)
	}
	if got := model.NodeOf(nil); got.Name != "" || got.IPs != nil {
		t.Errorf("NodeOf(nil) = %+v", got)
	}
}

// Many Services at once (a first build, or a burst) are ordered by one sort, a few by
// insertion; both give Build's order, also after some leave and others come.
func TestCacheOrderManyAndFew(t *testing.T) {
	mk := func(i int) *v1.Service {
		return service(fmt.Sprintf("s%03d", (i*37)%200), []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250)})
	}
	cache := model.NewCache()
	var sl []*v1.Service
	for _, step := range []struct{ from, to int }{{0, 100}, {100, 103}, {103, 160}, {160, 161}} {
		if len(sl) > 10 {
			sl = append(sl[:3], sl[13:]...) // ten leave
		}
		for i := step.from; i < step.to; i++ {
			sl = append(sl, mk(i))
		}
		want, _ := model.Build(sl, nil, nil)
		got, _ := cache.Build(sl, nil, nil)
		if len(want.Services) < len(sl) || len(got.Services) != len(want.Services) {
			t.Fatalf("adding %d..%d: %d service ports, want %d (of %d Services)", step.from, step.to, len(got.Services), len(want.Services), len(sl))
		}
		for i := range want.Services {
			if got.Services[i].Name != want.Services[i].Name {
				t.Fatalf("adding %d..%d: service port %d is %v, want %v", step.from, step.to, i, got.Services[i].Name, want.Services[i].Name)
			}
		}
	}
}

// TestCacheChangesEqualBuild walks random changes of Services and EndpointSlices in two
// namespaces, handed to the Cache as informer events are: by namespace and name, each
// with the object as it is now or nil. Slices move between services (their service
// label changes), change address type, arrive before their Service; Services are
// deleted and created again, sometimes within one delta. Now and then a build takes the
// full lists instead (BuildFrom), as the controller does after a failure. After every
// step the snapshot must be Build's of the full lists, the problems the same set, the
// change set must name every service whose ports are not the previous snapshot's, and
// no service whose objects stayed the same may be built again.
func TestCacheChangesEqualBuild(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	namespaces := []string{"default", "other"}
	type key = types.NamespacedName
	svcs := map[key]*v1.Service{}
	slcs := map[key]*discovery.EndpointSlice{}
	newService := func(k key) *v1.Service {
		ip := fmt.Sprintf("10.96.0.%d", r.IntN(30))
		if r.IntN(12) == 0 {
			ip = "not-an-ip"
		}
		opts := []svcOpt{withPorts(svcPort("http", v1.ProtocolTCP, 80, int32(30000+r.IntN(5))), svcPort("dns", v1.ProtocolUDP, 53, 0))}
		switch r.IntN(6) {
		case 0:
			opts = append(opts, withType(v1.ServiceTypeNodePort))
		case 1:
			opts = append(opts, withType(v1.ServiceTypeExternalName))
		case 2:
			opts = append(opts, withPorts(svcPort("http", v1.ProtocolTCP, 80, 0)))
		}
		s := service(k.Name, []string{ip}, opts...)
		s.Namespace = k.Namespace
		return s
	}
	addressTypes := []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv4, discovery.AddressTypeIPv6, discovery.AddressTypeFQDN}
	newSlice := func(k key, svc string, at discovery.AddressType, eps []discovery.Endpoint) *discovery.EndpointSlice {
		s := slice(k.Name, svc, at, ports(tcp("http", 8080), udp("dns", 5353)), eps...)
		s.Namespace = k.Namespace
		if svc == "" {
			s.Labels = nil
		}
		return s
	}
	randomEndpoints := func() []discovery.Endpoint {
		var eps []discovery.Endpoint
		for range r.IntN(4) {
			a := fmt.Sprintf("10.0.0.%d", r.IntN(10))
			switch r.IntN(12) {
			case 0:
				a = "10.0.0.999"
			case 1:
				a = fmt.Sprintf("2001:db8::%d", r.IntN(10))
			}
			eps = append(eps, endpoint(a))
		}
		return eps
	}
	randomService := func() string { return fmt.Sprintf("s%d", r.IntN(6)) }
	randomKey := func(prefix string, n int) key {
		return key{Namespace: namespaces[r.IntN(len(namespaces))], Name: fmt.Sprintf("%s%d", prefix, r.IntN(n))}
	}
	// members is the oracle's view of which slices a service proxies: labelled with it
	// and of an IP address type
	members := func(k key) []*discovery.EndpointSlice {
		var out []*discovery.EndpointSlice
		for _, s := range slcs {
			if s.Namespace == k.Namespace && s.Labels[discovery.LabelServiceName] == k.Name &&
				(s.AddressType == discovery.AddressTypeIPv4 || s.AddressType == discovery.AddressTypeIPv6) {
				out = append(out, s)
			}
		}
		slices.SortFunc(out, func(a, b *discovery.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
		return out
	}
	allServiceKeys := func() []key {
		var out []key
		for _, ns := range namespaces {
			for i := range 6 {
				out = append(out, key{Namespace: ns, Name: fmt.Sprintf("s%d", i)})
			}
		}
		return out
	}

	cache := model.NewCache()
	var prev *model.Snapshot
	fullBuilds := 0
	for step := range 1500 {
		before := map[key][]*discovery.EndpointSlice{}
		beforeSvc := map[key]*v1.Service{}
		for _, k := range allServiceKeys() {
			before[k], beforeSvc[k] = members(k), svcs[k]
		}
		d := model.Delta{Services: map[key]*v1.Service{}, Slices: map[key]*discovery.EndpointSlice{}}
		for range r.IntN(5) {
			switch r.IntN(9) {
			case 0, 1: // a slice created or replaced, anything about it may change
				k := randomKey("e", 10)
				slcs[k] = newSlice(k, randomService(), addressTypes[r.IntN(len(addressTypes))], randomEndpoints())
				d.Slices[k] = slcs[k]
			case 2: // a slice moves to another service, or loses its label
				k := randomKey("e", 10)
				if s := slcs[k]; s != nil {
					svc := randomService()
					if r.IntN(5) == 0 {
						svc = ""
					}
					slcs[k] = newSlice(k, svc, s.AddressType, s.Endpoints)
					d.Slices[k] = slcs[k]
				}
			case 3: // a slice's address type changes
				k := randomKey("e", 10)
				if s := slcs[k]; s != nil {
					slcs[k] = newSlice(k, s.Labels[discovery.LabelServiceName], addressTypes[r.IntN(len(addressTypes))], s.Endpoints)
					d.Slices[k] = slcs[k]
				}
			case 4: // a slice deleted (or an event for one that never was)
				k := randomKey("e", 10)
				delete(slcs, k)
				d.Slices[k] = nil
			case 5, 6: // a Service created or replaced
				k := randomKey("s", 6)
				svcs[k] = newService(k)
				d.Services[k] = svcs[k]
			case 7: // a Service deleted, in some steps created again at once
				k := randomKey("s", 6)
				delete(svcs, k)
				d.Services[k] = nil
				if r.IntN(3) == 0 {
					svcs[k] = newService(k)
					d.Services[k] = svcs[k]
				}
			case 8: // an event whose object is the one the cache has
				k := randomKey("s", 6)
				d.Services[k] = svcs[k]
			}
		}
		var sl []*v1.Service
		for _, s := range svcs {
			sl = append(sl, s)
		}
		var es []*discovery.EndpointSlice
		for _, s := range slcs {
			es = append(es, s)
		}
		want, wantProblems := model.Build(sl, es, nil)
		var got *model.Snapshot
		var gotProblems []model.Problem
		if r.IntN(10) == 0 {
			fullBuilds++
			got, gotProblems = cache.BuildFrom(model.Inputs{Services: sl, Slices: es})
		} else {
			got, gotProblems = cache.BuildChanges(d, model.Inputs{})
		}

		withoutChanges := *got
		withoutChanges.Changes = model.Changes{}
		if !reflect.DeepEqual(&withoutChanges, want) {
			t.Fatalf("step %d: cache snapshot differs from Build:\n got  %v\n want %v", step, dumpSnapshot(got), dumpSnapshot(want))
		}
		if !reflect.DeepEqual(problemSet(gotProblems), problemSet(wantProblems)) || len(gotProblems) != len(wantProblems) {
			t.Fatalf("step %d: cache problems %v, Build's %v", step, gotProblems, wantProblems)
		}
		if prev != nil && !got.Changes.Follows(prev.Changes) {
			t.Fatalf("step %d: the snapshot does not follow the one before", step)
		}
		if prev == nil {
			prev = got
			continue
		}
		changed := map[key]bool{}
		for _, k := range allServiceKeys() {
			changed[k] = beforeSvc[k] != svcs[k] || !slices.Equal(before[k], members(k))
		}
		for _, sp := range got.Services {
			k := key{Namespace: sp.Name.Namespace, Name: sp.Name.Name}
			i := slices.IndexFunc(prev.Services, func(p *model.ServicePort) bool { return p.Name == sp.Name })
			if !got.Changes.MayDiffer(sp.Name) {
				// the change set's contract: a port it does not name is the previous one
				if i < 0 || !prev.Services[i].Equal(sp) {
					t.Fatalf("step %d: %s is not in the change set but differs from the previous snapshot", step, sp.Name)
				}
			}
			if changed[k] {
				continue
			}
			// nothing of the service changed: not built again, the very same port
			if got.Changes.MayDiffer(sp.Name) || i < 0 || prev.Services[i] != sp {
				t.Fatalf("step %d: %s did not change but was built again", step, sp.Name)
			}
		}
		prev = got
	}
	if fullBuilds < 50 {
		t.Fatalf("only %d builds from full lists: the walk did not mix them in", fullBuilds)
	}
}

// A cold start's build (thousands of services: the Cache builds them in parallel) is
// Build's, problems included, and so is a later build of a few changes.
func TestCacheManyEqualBuild(t *testing.T) {
	const n = 5000 // above the Cache's parallelBuildMin
	var svcs []*v1.Service
	var slcs []*discovery.EndpointSlice
	for i := range n {
		name := fmt.Sprintf("s%05d", (i*7919)%n) // not in name order
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250)
		if i%97 == 0 {
			ip = "not-an-ip" // a problem
		}
		svcs = append(svcs, service(name, []string{ip}, withPorts(svcPort("http", v1.ProtocolTCP, 80, 0), svcPort("dns", v1.ProtocolUDP, 53, 0))))
		for j := range 1 + i%3 {
			addr := fmt.Sprintf("10.%d.%d.%d", 1+j, i/250, i%250)
			if i%89 == 0 && j == 0 {
				addr = "10.0.0.999" // a problem
			}
			slcs = append(slcs, slice(fmt.Sprintf("%s-%d", name, j), name, discovery.AddressTypeIPv4, ports(tcp("http", 8080), udp("dns", 5353)), endpoint(addr)))
		}
	}
	check := func(what string, got *model.Snapshot, gotProblems []model.Problem) {
		t.Helper()
		want, wantProblems := model.BuildFrom(model.Inputs{Services: svcs, Slices: slcs})
		if len(want.Services) < n {
			t.Fatalf("%s: Build made %d service ports of %d Services", what, len(want.Services), n)
		}
		withoutChanges := *got
		withoutChanges.Changes = model.Changes{}
		if !reflect.DeepEqual(&withoutChanges, want) {
			t.Fatalf("%s: cache snapshot (%d service ports) differs from Build's (%d)", what, len(got.Services), len(want.Services))
		}
		if len(wantProblems) == 0 || !reflect.DeepEqual(problemSet(gotProblems), problemSet(wantProblems)) || len(gotProblems) != len(wantProblems) {
			t.Fatalf("%s: %d cache problems, %d of Build's", what, len(gotProblems), len(wantProblems))
		}
	}
	cache := model.NewCache()
	got, problems := cache.BuildFrom(model.Inputs{Services: svcs, Slices: slcs})
	check("first build", got, problems)
	svcs[10] = service(svcs[10].Name, []string{"10.97.0.1"}, withPorts(svcPort("http", v1.ProtocolTCP, 8080, 0)))
	slcs = slcs[1:]
	got, problems = cache.BuildFrom(model.Inputs{Services: svcs, Slices: slcs})
	check("after a change", got, problems)
}
