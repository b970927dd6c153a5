package compile

import (
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
)

// TestLayoutDescribesEveryObject compiles every scenario in both families and holds the
// layout to what the compiler emits: each chain and set is known by its name (ChainOf,
// SetOf) with the kind and ownership the layout gives its role, a service port's
// object names that port, and every role of the layout is emitted by some scenario.
func TestLayoutDescribesEveryObject(t *testing.T) {
	seen := map[Role]bool{}
	check := func(where, name string, o Object, ok bool, kind ObjectKind, owner *model.ServicePortName) {
		t.Helper()
		if !ok {
			t.Errorf("%s: %s %q is not in the layout", where, kind, name)
			return
		}
		d := o.Role.Describe()
		seen[o.Role] = true
		if d.Kind != kind {
			t.Errorf("%s: %q is a %s, the layout's %v says %s", where, name, kind, o.Role, d.Kind)
		}
		switch {
		case d.PerServicePort && owner == nil:
			t.Errorf("%s: %q (%v) is the table's own, the layout says it is a service port's", where, name, o.Role)
		case !d.PerServicePort && owner != nil:
			t.Errorf("%s: %q (%v) is in %s's part, the layout says it is the table's own", where, name, o.Role, *owner)
		case owner != nil && o.Port != *owner:
			t.Errorf("%s: %q parses as service port %s, it is %s's", where, name, o.Port, *owner)
		}
	}
	setKind := func(s *nft.Set) ObjectKind {
		if s.IsMap() {
			return KindMap
		}
		return KindSet
	}
	chainKind := func(c *nft.Chain) ObjectKind {
		if c.Hook != nil {
			return KindBaseChain
		}
		return KindChain
	}
	objects := 0
	for name, snap := range scenarios() {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			rs, _ := NewCompiler(configFor(fam), NewSlots()).Compile(snap) // parts kept apart
			where := name + " " + fam.String()
			for _, c := range rs.Chains {
				o, ok := ChainOf(c.Name)
				check(where, c.Name, o, ok, chainKind(c), nil)
				objects++
			}
			for _, s := range rs.Sets {
				o, ok := SetOf(s.Name)
				check(where, s.Name, o, ok, setKind(s), nil)
				objects++
			}
			for _, p := range rs.Parts {
				owner, ok := purpose.ServicePortOf(p.Tag)
				if !ok {
					t.Fatalf("%s: part %s has no service port", where, p.Owner)
				}
				for _, c := range p.Chains {
					o, ok := ChainOf(c.Name)
					check(where, c.Name, o, ok, chainKind(c), &owner)
					objects++
				}
				for _, s := range p.Sets {
					o, ok := SetOf(s.Name)
					check(where, s.Name, o, ok, setKind(s), &owner)
					objects++
				}
			}
		}
	}
	if objects < 100 {
		t.Fatalf("only %d objects compiled: the check saw little", objects)
	}
	for _, d := range Layout() {
		if !seen[d.Role] {
			t.Errorf("the layout's %v (%s) is emitted by no scenario: remove it, or add a scenario that emits it", d.Role, d.Purpose)
		}
	}
}

// Every role has a description; no two of the table's own objects of one kind share a
// name, and no fixed name is also read as another role's pattern.
func TestLayoutNamesAreUnambiguous(t *testing.T) {
	names := map[string]Role{}
	for _, d := range Layout() {
		if d.Kind == 0 || d.Name == "" || d.Purpose == "" {
			t.Errorf("%d: incomplete description %+v", d.Role, d)
		}
		if strings.Contains(d.Name, "<") {
			continue
		}
		key := d.Kind.String() + " " + d.Name
		if d.Kind == KindMap {
			key = "set " + d.Name // sets and maps share one namespace
		}
		if r, ok := names[key]; ok {
			t.Errorf("%v and %v share the name %q", r, d.Role, d.Name)
		}
		names[key] = d.Role
		var o Object
		var ok bool
		if d.Kind == KindSet || d.Kind == KindMap {
			o, ok = SetOf(d.Name)
		} else {
			o, ok = ChainOf(d.Name)
		}
		if !ok || o.Role != d.Role {
			t.Errorf("%q reads as %v, %v; want %v", d.Name, o.Role, ok, d.Role)
		}
	}
	for _, n := range hookChains {
		if o, ok := ChainOf(n); !ok || o.Role != RoleHook {
			t.Errorf("base chain %q reads as %v", n, o.Role)
		}
	}
}

// The names built per service port, endpoint, page, bit and tree node read back as
// what they were built from, and names the compiler never writes are not read as its.
func TestLayoutParsesBuiltNames(t *testing.T) {
	for _, sp := range []model.ServicePortName{
		{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp", Protocol: model.ProtoTCP},
		{Namespace: "default", Name: "svc", Protocol: model.ProtoUDP},
		{Namespace: "local", Name: "fw", Port: "ext", Protocol: model.ProtoSCTP},
	} {
		for kind, want := range map[string]Role{kindService: RoleServiceChain, kindLocal: RoleLocalChain, kindExternal: RoleExternalChain, kindFirewall: RoleSourceRangeChain} {
			name := ChainName(kind, sp)
			if o, ok := ChainOf(name); !ok || o != (Object{Role: want, Port: sp}) {
				t.Errorf("ChainOf(%q) = %+v, %v; want %v of %s", name, o, ok, want, sp)
			}
		}
		ep := endpointChainName(ChainName(kindService, sp), 12)
		if o, ok := ChainOf(ep); !ok || o != (Object{Role: RoleEndpointChain, Port: sp, Index: 12}) {
			t.Errorf("ChainOf(%q) = %+v, %v", ep, o, ok)
		}
		if o, ok := SetOf(affinitySetName(ep)); !ok || o != (Object{Role: RoleAffinity, Port: sp, Index: 12}) {
			t.Errorf("SetOf(%q) = %+v, %v", affinitySetName(ep), o, ok)
		}
		if o, ok := SetOf(ChainName(kindFirewall, sp)); !ok || o != (Object{Role: RoleSourceRanges, Port: sp}) {
			t.Errorf("SetOf(%q) = %+v, %v", ChainName(kindFirewall, sp), o, ok)
		}
	}
	for name, want := range map[string]Object{
		endpointMapName(3):                              {Role: RoleEndpointSlots, Index: 3},
		countBitSetName(setEndpointCountBit, 7):         {Role: RoleEndpointCountBit, Index: 7},
		countBitSetName(setNodePortEndpointCountBit, 0): {Role: RoleNodePortEndpointCountBit},
	} {
		if o, ok := SetOf(name); !ok || o != want {
			t.Errorf("SetOf(%q) = %+v, %v; want %+v", name, o, ok, want)
		}
	}
	for name, want := range map[string]Object{
		treeNode(chainLB, 0, 16):        {Role: RoleLBTree, Index: 0, Last: 15},
		treeNode(chainNodePortLB, 4, 2): {Role: RoleNodePortLBTree, Index: 4, Last: 5},
	} {
		if o, ok := ChainOf(name); !ok || o != want {
			t.Errorf("ChainOf(%q) = %+v, %v; want %+v", name, o, ok, want)
		}
	}
	for _, name := range []string{"", "intruder", "svc-", "svc-a/b/tcp", "svc-a/b/icmp/x", "port-a/b/tcp/x", "local-a/b/tcp/x/1",
		"lb-1", "lb-3-1", "lb-01-2", "fw-a//tcp/x", "svc-a/b/tcp/x/-1"} {
		if o, ok := ChainOf(name); ok {
			t.Errorf("ChainOf(%q) = %+v: not a chain the compiler writes", name, o)
		}
	}
	for _, name := range []string{"", "endpoints-", "endpoints-x", "endpoint-count-bit", "affinity-a/b/tcp/x", "svc-a/b/tcp/x", "cluster-frontend"} {
		if o, ok := SetOf(name); ok {
			t.Errorf("SetOf(%q) = %+v: not a set the compiler writes", name, o)
		}
	}
	if !slices.Contains(Layout(), RoleHook.Describe()) || Role(200).Describe().Kind != 0 {
		t.Error("Describe and Layout disagree")
	}
}
