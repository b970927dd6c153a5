package compile

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
)

// ---- invariants every compiled ruleset must satisfy ------------------------------------

// compileChecked compiles snap and asserts the invariants that hold for every input:
// no duplicate keys in any set, every reference resolves, and every service chain's DNAT
// draws from exactly its usable endpoints.
func compileChecked(t *testing.T, snap *model.Snapshot, cfg Config, slots *Slots) (*nft.Ruleset, []model.Problem) {
	t.Helper()
	rs, problems := Compile(snap, cfg, slots)
	checkUniqueKeys(t, rs)
	checkReferences(t, rs)
	checkEndpointSlots(t, rs, snap, cfg.Family)
	return rs, problems
}

// checkUniqueKeys fails if any set of rs holds two elements with the same key: the kernel
// rejects the whole transaction for that.
func checkUniqueKeys(t *testing.T, rs *nft.Ruleset) {
	t.Helper()
	for _, s := range rs.Sets {
		seen := map[string]bool{}
		for _, e := range s.Elements {
			k := valuesString(e.Key)
			if seen[k] {
				t.Errorf("set %s: duplicate key %s", s.Name, k)
			}
			seen[k] = true
		}
	}
}

// checkReferences fails on a jump/goto to a missing chain, a lookup of a missing set, a
// key or value of the wrong arity, or a duplicate object name.
func checkReferences(t *testing.T, rs *nft.Ruleset) {
	t.Helper()
	chains := map[string]bool{}
	for _, c := range rs.Chains {
		if chains[c.Name] {
			t.Errorf("duplicate chain %s", c.Name)
		}
		chains[c.Name] = true
	}
	sets := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		if sets[s.Name] != nil {
			t.Errorf("duplicate set %s", s.Name)
		}
		sets[s.Name] = s
	}
	verdict := func(where string, v nft.Verdict) {
		if (v.Kind == nft.Jump || v.Kind == nft.Goto) && !chains[v.Chain] {
			t.Errorf("%s: %s to missing chain %q", where, verdictString(v), v.Chain)
		}
	}
	lookup := func(where, name string, fields int, isMap bool) {
		s := sets[name]
		switch {
		case s == nil:
			t.Errorf("%s: missing set %q", where, name)
		case fields >= 0 && len(s.Key) != fields:
			t.Errorf("%s: %d fields for the %d-field key of %s", where, fields, len(s.Key), name)
		case s.IsMap() != isMap:
			t.Errorf("%s: %s is used as map=%v", where, name, isMap)
		}
	}
	for _, c := range rs.Chains {
		for i, r := range c.Rules {
			where := fmt.Sprintf("chain %s rule %d", c.Name, i)
			for _, st := range r.Stmts {
				switch st := st.(type) {
				case nft.Verdict:
					verdict(where, st)
				case nft.Lookup:
					lookup(where, st.Set, len(st.Fields), false)
				case nft.VMap:
					lookup(where, st.Map, len(st.Fields), true)
				case nft.DNATNumgenMap:
					lookup(where, st.Map, -1, true)
				case nft.DNATKeyMap:
					lookup(where, st.Map, len(st.Fields)+1, true)
				}
			}
		}
	}
	for _, s := range rs.Sets {
		for _, e := range s.Elements {
			where := fmt.Sprintf("set %s element %s", s.Name, valuesString(e.Key))
			if len(e.Key) != len(s.Key) {
				t.Errorf("%s: key has %d fields, set has %d", where, len(e.Key), len(s.Key))
			}
			switch {
			case s.IsMap() && slices.Equal(s.Data, []nft.Datatype{nft.TypeVerdict}):
				if e.Verdict == nil {
					t.Errorf("%s: no verdict", where)
				} else {
					verdict(where, *e.Verdict)
				}
			case s.IsMap():
				if len(e.Data) != len(s.Data) {
					t.Errorf("%s: value has %d fields, map has %d", where, len(e.Data), len(s.Data))
				}
			case s.Interval:
				if len(e.Data) != 1 || e.Data[0].Addr().Less(e.Key[0].Addr()) {
					t.Errorf("%s: not a range", where)
				}
			case e.Verdict != nil || e.Data != nil:
				t.Errorf("%s: value in a plain set", where)
			}
		}
	}
}

// checkEndpointSlots: a service port has a svc chain exactly when it has a cluster IP and
// cluster-policy endpoints in the family (model.Categorize), and a local chain exactly
// when it uses local endpoints and has some; each chain picks among exactly those
// endpoints — through its DNAT's Mod consecutive slots from Offset (which stay within one
// page), or, with session affinity, through one endpoint chain per endpoint; no endpoint
// map holds anything else.
func checkEndpointSlots(t *testing.T, rs *nft.Ruleset, snap *model.Snapshot, fam nft.Family) {
	t.Helper()
	v6 := fam == nft.IPv6
	used := map[string]int{} // endpoint map → keys accounted for
	clusterIPs := map[netip.Addr]bool{}
	for _, sp := range snap.Services {
		for _, a := range sp.ClusterIPs {
			clusterIPs[a] = true
		}
	}
	for _, sp := range snap.Services {
		var eps []model.Endpoint
		for _, e := range sp.Endpoints {
			if e.Addr.Is6() == v6 && !clusterIPs[e.Addr] { // endpoints at a cluster IP are skipped
				eps = append(eps, e)
			}
		}
		cat := model.Categorize(sp, eps, snap.Node)
		hasIP := len(model.AddrsOf(sp.ClusterIPs, v6)) > 0
		if isFlat(rs, sp.Name) {
			internal := cat.Cluster
			if sp.InternalPolicyLocal {
				internal = cat.Local
			}
			checkFlatPicks(t, rs, sp.Name, internal, cat.Cluster)
			continue
		}
		checkPicks(t, rs, ChainName("svc", sp.Name), hasIP, cat.Cluster, sp.AffinityTimeout > 0, used)
		checkPicks(t, rs, ChainName("local", sp.Name), hasIP && sp.UsesLocalEndpoints(), cat.Local, sp.AffinityTimeout > 0, used)
	}
	for _, s := range rs.Sets {
		if s.IsMap() && slices.Equal(s.Key, []nft.Datatype{nft.TypeNumgen}) && len(s.Elements) != used[s.Name] {
			t.Errorf("endpoint map %s: %d elements, but service chains use %d", s.Name, len(s.Elements), used[s.Name])
		}
	}
	checkFlatEntries(t, rs)
}

// isFlat reports whether a service port is on the flat path: it has no chain of its own.
func isFlat(rs *nft.Ruleset, sp model.ServicePortName) bool {
	for _, kind := range []string{"svc", "local", "ext"} {
		if chainNamed(rs, ChainName(kind, sp)) != nil {
			return false
		}
	}
	return true
}

// flatTargets returns, for each flat frontend of sp (its key in a frontend set), the
// endpoints its entries hold, by index, and its endpoint count as the bit sets say.
func flatTargets(t *testing.T, rs *nft.Ruleset, sp model.ServicePortName) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, k := range []struct{ front, bits, entries string }{
		{SetClusterFrontends, setEndpointCountBit, MapEndpoints},
		{SetExternalFrontends, setEndpointCountBit, MapEndpoints},
		{SetNodePortFrontends, setNodePortEndpointCountBit, MapNodePortEndpoints},
	} {
		for _, e := range setNamed(rs, k.front).Elements {
			if p, ok := purpose.ServicePortOf(e.Tag); !ok || p != sp {
				continue
			}
			key := valuesString(e.Key)
			n := 0
			for b := range countBits {
				if _, ok := setElements(rs, k.bits+strconv.Itoa(b))[key]; ok {
					n |= 1 << b
				}
			}
			entries := elements(t, rs, k.entries)
			var got []string
			for i := range n {
				v, ok := entries[key+" . "+strconv.Itoa(i)]
				if !ok {
					t.Errorf("%s: frontend %s: entry %d of %d missing from %s", sp, key, i, n, k.entries)
				}
				got = append(got, v)
			}
			if _, extra := entries[key+" . "+strconv.Itoa(n)]; extra {
				t.Errorf("%s: frontend %s: entry %d beyond its count %d in %s", sp, key, n, n, k.entries)
			}
			out[k.front+" "+key] = got
		}
	}
	return out
}

// checkFlatPicks: every flat frontend of sp picks among exactly the endpoints its traffic
// goes to (internal for cluster IPs, cluster-wide for external IPs and node ports), and
// it has a frontend only if there are some.
func checkFlatPicks(t *testing.T, rs *nft.Ruleset, sp model.ServicePortName, internal, cluster []model.Endpoint) {
	t.Helper()
	want := func(eps []model.Endpoint) []string {
		var w []string
		for _, e := range eps {
			w = append(w, e.Addr.String()+" . "+strconv.Itoa(int(e.Port)))
		}
		sort.Strings(w)
		return w
	}
	for front, got := range flatTargets(t, rs, sp) {
		w := want(cluster)
		if strings.HasPrefix(front, SetClusterFrontends+" ") {
			w = want(internal)
		}
		got = slices.Clone(got)
		sort.Strings(got)
		if len(w) == 0 || !slices.Equal(got, w) {
			t.Errorf("%s: %s picks %v, want %v", sp, front, got, w)
		}
	}
}

// checkFlatEntries: every entry of the flat endpoint maps belongs to a frontend of a
// frontend set, with an index below its count, and each endpoint count bit to one.
func checkFlatEntries(t *testing.T, rs *nft.Ruleset) {
	t.Helper()
	fronts := map[string]bool{}
	for _, set := range []string{SetClusterFrontends, SetExternalFrontends, SetNodePortFrontends} {
		for k := range elements(t, rs, set) {
			fronts[k] = true
		}
	}
	for _, m := range []string{MapEndpoints, MapNodePortEndpoints} {
		for k := range elements(t, rs, m) {
			front := k[:strings.LastIndex(k, " . ")]
			if !fronts[front] {
				t.Errorf("%s: entry %s of no frontend", m, k)
			}
		}
	}
	for _, bits := range []string{setEndpointCountBit, setNodePortEndpointCountBit} {
		for b := range countBits {
			for k := range setElements(rs, bits+strconv.Itoa(b)) {
				if !fronts[k] {
					t.Errorf("%s%d: %s is no frontend", bits, b, k)
				}
			}
		}
	}
}

// setElements returns the keys of a set's elements; none if there is no such set (the
// trees have only as many bit sets as they are deep).
func setElements(rs *nft.Ruleset, name string) map[string]bool {
	out := map[string]bool{}
	for _, e := range setNamed(rs, name).Elements {
		out[valuesString(e.Key)] = true
	}
	return out
}

func setNamed(rs *nft.Ruleset, name string) *nft.Set {
	for _, s := range rs.Sets {
		if s.Name == name {
			return s
		}
	}
	return &nft.Set{Name: name}
}

// checkPicks checks one endpoint-choosing chain against the endpoints it must choose from.
func checkPicks(t *testing.T, rs *nft.Ruleset, name string, applies bool, eps []model.Endpoint, affinity bool, used map[string]int) {
	t.Helper()
	var want []string
	for _, e := range eps {
		want = append(want, e.AddrPort().String())
	}
	ch := chainNamed(rs, name)
	if (ch != nil) != (applies && len(want) > 0) {
		t.Errorf("%s: chain present = %v, with %d endpoints to choose from", name, ch != nil, len(want))
	}
	if ch == nil {
		return
	}
	var got []string
	if affinity {
		for i := range want {
			epChain := chainNamed(rs, fmt.Sprintf("%s/%d", name, i))
			if epChain == nil {
				t.Errorf("%s: endpoint chain %d missing", name, i)
				continue
			}
			for _, r := range epChain.Rules {
				for _, st := range r.Stmts {
					if d, ok := st.(nft.DNATTo); ok {
						got = append(got, netip.AddrPortFrom(d.Addr, d.Port).String())
					}
				}
			}
		}
	} else {
		got = slotTargets(t, rs, ch, used)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: picks %v, want %v", name, got, want)
	}
}

// slotTargets returns the endpoints a chain's single numgen DNAT can choose.
func slotTargets(t *testing.T, rs *nft.Ruleset, ch *nft.Chain, used map[string]int) []string {
	t.Helper()
	var dnats []nft.DNATNumgenMap
	maglev := false
	for _, r := range ch.Rules {
		for _, st := range r.Stmts {
			if d, ok := st.(nft.DNATNumgenMap); ok {
				dnats = append(dnats, d)
			}
			if d, ok := st.(nft.DNATHashMap); ok { // a Maglev table: the distinct endpoints count
				dnats = append(dnats, nft.DNATNumgenMap{Mod: d.Mod, Offset: d.Offset, Map: d.Map})
				maglev = true
			}
		}
	}
	if len(dnats) != 1 {
		t.Errorf("%s: %d DNAT statements, want 1", ch.Name, len(dnats))
		return nil
	}
	d := dnats[0]
	if d.Mod <= PageSlots && d.Offset/PageSlots != (d.Offset+d.Mod-1)/PageSlots {
		t.Errorf("%s: slots [%d, %d) straddle a page", ch.Name, d.Offset, d.Offset+d.Mod)
	}
	var m *nft.Set
	for _, s := range rs.Sets {
		if s.Name == d.Map {
			m = s
		}
	}
	if m == nil {
		return nil // reported by checkReferences
	}
	byKey := map[uint32]nft.Element{}
	for _, e := range m.Elements {
		byKey[e.Key[0].Num()] = e
	}
	var got []string
	for k := d.Offset; k < d.Offset+d.Mod; k++ {
		e, ok := byKey[k]
		if !ok {
			t.Errorf("%s: slot %d missing from %s", ch.Name, k, d.Map)
			continue
		}
		got = append(got, netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num())).String())
	}
	used[d.Map] += int(d.Mod)
	if maglev {
		slices.Sort(got)
		got = slices.Compact(got)
	}
	return got
}

// ---- readable views of ruleset values ------------------------------------------------

func valueString(v nft.Value) string {
	if v.Addr().IsValid() {
		return v.Addr().String()
	}
	return strconv.FormatUint(uint64(v.Num()), 10)
}

func valuesString(vs []nft.Value) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = valueString(v)
	}
	return strings.Join(s, " . ")
}

func verdictString(v nft.Verdict) string {
	kind := map[nft.VerdictKind]string{nft.Accept: "accept", nft.Drop: "drop", nft.Return: "return", nft.Jump: "jump", nft.Goto: "goto"}[v.Kind]
	if v.Chain != "" {
		return kind + " " + v.Chain
	}
	return kind
}

// elements returns a set's elements as key → value ("" for plain sets). Protocols are
// numbers: 6 TCP, 17 UDP, 132 SCTP.
//
// service-ips and service-nodeports are read as "where each frontend is dispatched":
// their own elements (chained service ports), and the flat frontends as the chain the
// old layout would have sent them to — "goto svc-<port>" for a cluster IP (internal
// traffic), "goto ext-<port>" for an external or load-balancer IP or a node port — from
// the service port their element is tagged with. checkFlatPicks checks what those
// frontends pick.
func elements(t *testing.T, rs *nft.Ruleset, name string) map[string]string {
	t.Helper()
	if name == MapServiceIPs || name == MapServiceNodePorts {
		out := rawElements(t, rs, name)
		fronts := [][2]string{{SetClusterFrontends, "svc"}, {SetExternalFrontends, "ext"}}
		if name == MapServiceNodePorts {
			fronts = [][2]string{{SetNodePortFrontends, "ext"}}
		}
		for _, f := range fronts {
			for _, e := range setNamed(rs, f[0]).Elements {
				sp, _ := purpose.ServicePortOf(e.Tag)
				out[valuesString(e.Key)] = "goto " + ChainName(f[1], sp)
			}
		}
		return out
	}
	return rawElements(t, rs, name)
}

func rawElements(t *testing.T, rs *nft.Ruleset, name string) map[string]string {
	t.Helper()
	for _, s := range rs.Sets {
		if s.Name != name {
			continue
		}
		out := map[string]string{}
		for _, e := range s.Elements {
			switch {
			case e.Verdict != nil:
				out[valuesString(e.Key)] = verdictString(*e.Verdict)
			default:
				out[valuesString(e.Key)] = valuesString(e.Data)
			}
		}
		return out
	}
	t.Fatalf("no set %q", name)
	return nil
}

func chainNamed(rs *nft.Ruleset, name string) *nft.Chain {
	for _, c := range rs.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// stmtsMatch compares statements; a wanted DNATNumgenMap with an empty Map only checks Mod
// (the slot offset and page map are checked by checkEndpointSlots).
func stmtsMatch(got, want []nft.Stmt) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range want {
		if w, ok := want[i].(nft.DNATNumgenMap); ok && w.Map == "" {
			g, ok := got[i].(nft.DNATNumgenMap)
			if !ok || g.Mod != w.Mod {
				return false
			}
			continue
		}
		if !reflect.DeepEqual(got[i], want[i]) {
			return false
		}
	}
	return true
}

func rulesString(fam nft.Family, rules [][]nft.Stmt) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString("\n\t\t" + nft.RenderRule(fam, nft.Rule{Stmts: r}))
	}
	return b.String()
}

// ---- inputs ----------------------------------------------------------------------------

const (
	tcp  = model.ProtoTCP
	udp  = model.ProtoUDP
	sctp = model.ProtoSCTP
)

func spn(name, port string, proto uint8) model.ServicePortName {
	return model.ServicePortName{Namespace: "default", Name: name, Port: port, Protocol: proto}
}

func ips(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = ip(s)
	}
	return out
}

func eps(port uint16, addrs ...string) []model.Endpoint {
	out := make([]model.Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = ep(a, port)
	}
	return out
}

func snapshot(sps ...model.ServicePort) *model.Snapshot {
	return &model.Snapshot{Node: model.Node{Name: "node-1", IPs: ips("192.0.2.10")}, Services: model.Ports(sps)}
}

// manyEndpoints returns n distinct IPv4 endpoints in 10.244.0.0/16.
func manyEndpoints(n int) []model.Endpoint {
	out := make([]model.Endpoint, n)
	for i := range out {
		out[i] = model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(1 + i%250)}), Port: 8080, Ready: true, Serving: true}
	}
	return out
}

// ---- behaviour -------------------------------------------------------------------------

const (
	markMasq = "mark-for-masquerade"
	reject   = "" // an element of a no-endpoint set, which service-endpoints-check rejects
	echoSvc  = "svc-default/echo/tcp/http"
	echoExt  = "ext-default/echo/tcp/http"
)

var (
	jumpMasq      = nft.Verdict{Kind: nft.Jump, Chain: markMasq}
	masqOffClustr = nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("10.244.0.0/16")}
	notLoopback4  = nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("127.0.0.0/8")}
)

var (
	toTree   = nft.Verdict{Kind: nft.Goto, Chain: "lb-0-15"} // the least tree: counts up to 15
	toNPTree = nft.Verdict{Kind: nft.Goto, Chain: "nodeport-lb-0-15"}
	frontKey = []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}
	portKey  = []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}
)

func TestCompile(t *testing.T) {
	echo := func(mut func(*model.ServicePort)) model.ServicePort {
		sp := model.ServicePort{
			Name: spn("echo", "http", tcp), ClusterIPs: ips("10.96.0.10"), Port: 80,
			Endpoints: eps(8080, "10.244.1.2", "10.244.1.3"),
		}
		if mut != nil {
			mut(&sp)
		}
		return sp
	}
	// a flat service port has no chain: the shared frontend chains mark, the tree picks
	// (checkFlatPicks, via compileChecked, checks what each frontend picks)
	flatCluster := map[string][][]nft.Stmt{ChainClusterFront: {{masqOffClustr, jumpMasq}, {toTree}}}
	extRules := [][]nft.Stmt{{jumpMasq}, {toTree}}
	empty := map[string]string{}

	for _, tc := range []struct {
		name string
		cfg  func(*Config) // changes to configFor(family)
		fam  nft.Family    // 0: IPv4
		snap *model.Snapshot
		// sets lists the exact elements of the named sets.
		sets map[string]map[string]string
		// chains lists the exact rules of the named chains; absent lists chains that must
		// not exist.
		chains map[string][][]nft.Stmt
		absent []string
		// problems are substrings of "Kind ns/name: reason", in order; ignoreProblems
		// skips the check.
		problems       []string
		ignoreProblems bool
	}{
		{
			name: "ClusterIP with endpoints: service-ips goto svc chain, DNAT over its endpoints",
			snap: snapshot(echo(nil)),
			sets: map[string]map[string]string{
				SetClusterIPs:          {"10.96.0.10": ""},
				MapServiceIPs:          {"10.96.0.10 . 6 . 80": "goto " + echoSvc},
				MapServiceNodePorts:    empty,
				SetNoEndpointServices:  empty,
				SetNoEndpointNodePorts: empty,
				SetHairpin:             {"10.244.1.2 . 10.244.1.2": "", "10.244.1.3 . 10.244.1.3": ""},
				SetNodePortIPs:         {"192.0.2.10": ""},
			},
			chains: flatCluster,
			absent: []string{echoSvc, echoExt},
		},
		{
			name: "no endpoints: cluster, external and LB IPs and the node port are rejected, no chains",
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.Endpoints, sp.NodePort = nil, 30080
				sp.ExternalIPs, sp.LoadBalancerIPs = ips("203.0.113.8"), ips("198.51.100.8")
			})),
			sets: map[string]map[string]string{
				SetClusterIPs: {"10.96.0.10": ""},
				MapServiceIPs: empty, MapServiceNodePorts: empty,
				SetNoEndpointServices: {
					"10.96.0.10 . 6 . 80":   reject,
					"203.0.113.8 . 6 . 80":  reject,
					"198.51.100.8 . 6 . 80": reject,
				},
				SetNoEndpointNodePorts: {"6 . 30080": reject},
				SetHairpin:             empty,
			},
			absent: []string{echoSvc, echoExt},
		},
		{
			name: "endpoints that are not serving count as none",
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.Endpoints = []model.Endpoint{
					conds(ep("10.244.1.2", 8080), false, false, true),
					conds(ep("10.244.1.3", 8080), false, false, false),
				}
			})),
			sets: map[string]map[string]string{
				MapServiceIPs:         empty,
				SetNoEndpointServices: {"10.96.0.10 . 6 . 80": reject},
			},
			absent: []string{echoSvc},
		},
		{
			name: "serving terminating endpoints are used when none is ready",
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.Endpoints = []model.Endpoint{
					conds(ep("10.244.1.2", 8080), false, true, true),
					conds(ep("10.244.1.3", 8080), false, false, true),
					conds(ep("10.244.1.4", 8080), false, true, true),
				}
			})),
			sets: map[string]map[string]string{
				MapServiceIPs:         {"10.96.0.10 . 6 . 80": "goto " + echoSvc},
				SetNoEndpointServices: empty,
				SetHairpin:            {"10.244.1.2 . 10.244.1.2": "", "10.244.1.4 . 10.244.1.4": ""},
			},
			chains: flatCluster,
			absent: []string{echoSvc},
		},
		{
			name: "only ready endpoints when some are ready",
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.Endpoints = []model.Endpoint{
					conds(ep("10.244.1.2", 8080), false, true, true),
					ep("10.244.1.3", 8080),
				}
			})),
			chains: flatCluster,
			absent: []string{echoSvc},
			sets:   map[string]map[string]string{SetHairpin: {"10.244.1.3 . 10.244.1.3": ""}},
		},
		{
			name: "node port goes through the ext chain: mark for masquerade, then the svc chain",
			snap: snapshot(echo(func(sp *model.ServicePort) { sp.NodePort = 30080 })),
			sets: map[string]map[string]string{
				MapServiceIPs:          {"10.96.0.10 . 6 . 80": "goto " + echoSvc},
				MapServiceNodePorts:    {"6 . 30080": "goto " + echoExt},
				SetNoEndpointNodePorts: empty,
			},
			chains: map[string][][]nft.Stmt{ChainNodePortFront: {{jumpMasq}, {toNPTree}}, ChainClusterFront: {{masqOffClustr, jumpMasq}, {toTree}}},
			absent: []string{echoSvc, echoExt},
		},
		{
			name: "externalIP and load-balancer IP go through the ext chain, the cluster IP does not",
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.ExternalIPs, sp.LoadBalancerIPs = ips("203.0.113.7"), ips("198.51.100.1")
			})),
			sets: map[string]map[string]string{
				SetClusterIPs: {"10.96.0.10": ""},
				MapServiceIPs: {
					"10.96.0.10 . 6 . 80":   "goto " + echoSvc,
					"203.0.113.7 . 6 . 80":  "goto " + echoExt,
					"198.51.100.1 . 6 . 80": "goto " + echoExt,
				},
				MapServiceNodePorts: empty,
			},
			chains: map[string][][]nft.Stmt{ChainExternalFront: extRules},
			absent: []string{echoExt},
		},
		{
			name:   "masquerade-all: every connection to the service is marked",
			cfg:    func(c *Config) { c.MasqueradeAll = true },
			snap:   snapshot(echo(nil)),
			chains: map[string][][]nft.Stmt{ChainClusterFront: {{jumpMasq}, {toTree}}},
		},
		{
			name:   "cluster CIDR: connections from outside it are marked",
			snap:   snapshot(echo(nil)),
			chains: flatCluster,
			absent: []string{echoSvc},
		},
		{
			name:   "neither masquerade-all nor cluster CIDR: nothing is marked in the svc chain",
			cfg:    func(c *Config) { c.DetectLocal = DetectLocal{} },
			snap:   snapshot(echo(nil)),
			chains: map[string][][]nft.Stmt{ChainClusterFront: {{toTree}}},
		},
		{
			name: "IPv6 cluster CIDR in the IPv6 ruleset",
			fam:  nft.IPv6,
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.ClusterIPs, sp.Endpoints = ips("fd00:96::10"), eps(8080, "fd00:244::2")
			})),
			sets: map[string]map[string]string{
				MapServiceIPs:  {"fd00:96::10 . 6 . 80": "goto " + echoSvc},
				SetNodePortIPs: {"2001:db8::10": ""},
			},
			chains: map[string][][]nft.Stmt{ChainClusterFront: {{
				nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("fd00:244::/56")}, jumpMasq,
			}, {toTree}}},
		},
		{
			name: "IPv6-only service is absent from the IPv4 ruleset",
			snap: snapshot(
				echo(nil),
				model.ServicePort{Name: spn("v6", "", tcp), ClusterIPs: ips("fd00:96::1"), Port: 80, NodePort: 30081,
					ExternalIPs: ips("2001:db8:1::1"), Endpoints: eps(8080, "fd00:244::1")},
				model.ServicePort{Name: spn("v6-empty", "", udp), ClusterIPs: ips("fd00:96::2"), Port: 53, NodePort: 30053},
			),
			sets: map[string]map[string]string{
				SetClusterIPs:          {"10.96.0.10": ""},
				MapServiceIPs:          {"10.96.0.10 . 6 . 80": "goto " + echoSvc},
				MapServiceNodePorts:    empty,
				SetNoEndpointServices:  empty,
				SetNoEndpointNodePorts: empty,
				SetHairpin:             {"10.244.1.2 . 10.244.1.2": "", "10.244.1.3 . 10.244.1.3": ""},
			},
			absent: []string{"svc-default/v6/tcp/-", "ext-default/v6/tcp/-"},
		},
		{
			name: "IPv4-only service is absent from the IPv6 ruleset",
			fam:  nft.IPv6,
			snap: snapshot(
				echo(func(sp *model.ServicePort) { sp.NodePort, sp.ExternalIPs = 30080, ips("203.0.113.7") }),
				model.ServicePort{Name: spn("v4-empty", "", udp), ClusterIPs: ips("10.96.0.53"), Port: 53, NodePort: 30053},
			),
			sets: map[string]map[string]string{
				SetClusterIPs: empty, MapServiceIPs: empty, MapServiceNodePorts: empty,
				SetNoEndpointServices: empty, SetNoEndpointNodePorts: empty, SetHairpin: empty,
			},
			absent: []string{echoSvc, echoExt},
		},
		{
			name: "dual-stack service: each family gets its own addresses and endpoints",
			fam:  nft.IPv6,
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.ClusterIPs = ips("10.96.0.10", "fd00:96::10")
				sp.ExternalIPs = ips("203.0.113.7", "2001:db8:1::7")
				sp.NodePort = 30080
				sp.Endpoints = append(sp.Endpoints, eps(8080, "fd00:244::2")...)
			})),
			sets: map[string]map[string]string{
				SetClusterIPs: {"fd00:96::10": ""},
				MapServiceIPs: {
					"fd00:96::10 . 6 . 80":   "goto " + echoSvc,
					"2001:db8:1::7 . 6 . 80": "goto " + echoExt,
				},
				MapServiceNodePorts: {"6 . 30080": "goto " + echoExt},
				SetHairpin:          {"fd00:244::2 . fd00:244::2": ""},
			},
		},
		{
			name: "dual-stack service with endpoints only in IPv4 is rejected in IPv6",
			fam:  nft.IPv6,
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.ClusterIPs, sp.NodePort = ips("10.96.0.10", "fd00:96::10"), 30080
			})),
			sets: map[string]map[string]string{
				MapServiceIPs:          empty,
				SetNoEndpointServices:  {"fd00:96::10 . 6 . 80": reject},
				SetNoEndpointNodePorts: {"6 . 30080": reject},
			},
			absent: []string{echoSvc, echoExt},
		},
		{
			name: "externalIP conflict between services created at the same time: the first by name keeps it",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, ExternalIPs: ips("203.0.113.9"), Endpoints: eps(8080, "10.244.1.1")},
				model.ServicePort{Name: spn("b", "http", tcp), ClusterIPs: ips("10.96.0.2"), Port: 80, ExternalIPs: ips("203.0.113.9"), Endpoints: eps(8080, "10.244.1.2")},
			),
			sets: map[string]map[string]string{
				MapServiceIPs: {
					"10.96.0.1 . 6 . 80":   "goto svc-default/a/tcp/http",
					"203.0.113.9 . 6 . 80": "goto ext-default/a/tcp/http",
					"10.96.0.2 . 6 . 80":   "goto svc-default/b/tcp/http",
				},
			},
			problems: []string{`Service default/b: port "http": TCP 203.0.113.9:80 is in use by another Service`},
		},
		{
			name: "externalIP conflict: a loser without endpoints does not reject the winner's address",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, ExternalIPs: ips("203.0.113.9"), Endpoints: eps(8080, "10.244.1.1")},
				model.ServicePort{Name: spn("b", "http", tcp), ClusterIPs: ips("10.96.0.2"), Port: 80, ExternalIPs: ips("203.0.113.9")},
			),
			sets: map[string]map[string]string{
				MapServiceIPs: {
					"10.96.0.1 . 6 . 80":   "goto svc-default/a/tcp/http",
					"203.0.113.9 . 6 . 80": "goto ext-default/a/tcp/http",
				},
				SetNoEndpointServices: {"10.96.0.2 . 6 . 80": reject},
			},
			problems: []string{`Service default/b: port "http": TCP 203.0.113.9:80 is in use by another Service`},
		},
		{
			name: "externalIP conflict: a winner without endpoints keeps rejecting it",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, LoadBalancerIPs: ips("198.51.100.9")},
				model.ServicePort{Name: spn("b", "http", tcp), ClusterIPs: ips("10.96.0.2"), Port: 80, LoadBalancerIPs: ips("198.51.100.9"), Endpoints: eps(8080, "10.244.1.2")},
			),
			sets: map[string]map[string]string{
				MapServiceIPs:         {"10.96.0.2 . 6 . 80": "goto svc-default/b/tcp/http"},
				SetNoEndpointServices: {"10.96.0.1 . 6 . 80": reject, "198.51.100.9 . 6 . 80": reject},
			},
			problems: []string{`Service default/b: port "http": TCP 198.51.100.9:80 is in use by another Service`},
		},
		{
			name: "same externalIP on another port or protocol is no conflict",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, ExternalIPs: ips("203.0.113.9"), Endpoints: eps(8080, "10.244.1.1")},
				model.ServicePort{Name: spn("b", "dns", udp), ClusterIPs: ips("10.96.0.2"), Port: 80, ExternalIPs: ips("203.0.113.9"), Endpoints: eps(8080, "10.244.1.2")},
				model.ServicePort{Name: spn("c", "https", tcp), ClusterIPs: ips("10.96.0.3"), Port: 443, ExternalIPs: ips("203.0.113.9"), Endpoints: eps(8443, "10.244.1.3")},
			),
			sets: map[string]map[string]string{
				MapServiceIPs: {
					"10.96.0.1 . 6 . 80":    "goto svc-default/a/tcp/http",
					"203.0.113.9 . 6 . 80":  "goto ext-default/a/tcp/http",
					"10.96.0.2 . 17 . 80":   "goto svc-default/b/udp/dns",
					"203.0.113.9 . 17 . 80": "goto ext-default/b/udp/dns",
					"10.96.0.3 . 6 . 443":   "goto svc-default/c/tcp/https",
					"203.0.113.9 . 6 . 443": "goto ext-default/c/tcp/https",
				},
			},
		},
		{
			name: "node port conflict between services created at the same time: the first by name keeps it",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, NodePort: 30080, Endpoints: eps(8080, "10.244.1.1")},
				model.ServicePort{Name: spn("b", "http", tcp), ClusterIPs: ips("10.96.0.2"), Port: 80, NodePort: 30080, Endpoints: eps(8080, "10.244.1.2")},
				model.ServicePort{Name: spn("c", "http", tcp), ClusterIPs: ips("10.96.0.3"), Port: 80, NodePort: 30080},
			),
			sets: map[string]map[string]string{
				MapServiceNodePorts:    {"6 . 30080": "goto ext-default/a/tcp/http"},
				SetNoEndpointNodePorts: empty,
				MapServiceIPs: {
					"10.96.0.1 . 6 . 80": "goto svc-default/a/tcp/http",
					"10.96.0.2 . 6 . 80": "goto svc-default/b/tcp/http",
				},
				SetNoEndpointServices: {"10.96.0.3 . 6 . 80": reject},
			},
			problems: []string{
				`Service default/b: port "http": node port TCP 30080 is in use by another Service`,
				`Service default/c: port "http": node port TCP 30080 is in use by another Service`,
			},
		},
		{
			name: "same node port number for TCP and UDP is no conflict",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "dns", udp), ClusterIPs: ips("10.96.0.1"), Port: 53, NodePort: 30053, Endpoints: eps(53, "10.244.1.1")},
				model.ServicePort{Name: spn("a", "dns-tcp", tcp), ClusterIPs: ips("10.96.0.1"), Port: 53, NodePort: 30053},
			),
			sets: map[string]map[string]string{
				MapServiceNodePorts:    {"17 . 30053": "goto ext-default/a/udp/dns"},
				SetNoEndpointNodePorts: {"6 . 30053": reject},
				SetClusterIPs:          {"10.96.0.1": ""},
			},
		},
		{
			name: "cluster IP and port claimed by two services: the first keeps it",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, Endpoints: eps(8080, "10.244.1.1")},
				model.ServicePort{Name: spn("b", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, Endpoints: eps(8080, "10.244.1.2")},
			),
			sets: map[string]map[string]string{
				SetClusterIPs: {"10.96.0.1": ""},
				MapServiceIPs: {"10.96.0.1 . 6 . 80": "goto svc-default/a/tcp/http"},
			},
			problems: []string{`Service default/b: port "http": TCP 10.96.0.1:80 is in use by another Service`},
		},
		{
			name: "a service's own duplicate external addresses give one element each",
			snap: snapshot(echo(func(sp *model.ServicePort) {
				sp.ExternalIPs, sp.LoadBalancerIPs = ips("203.0.113.7", "203.0.113.7"), ips("203.0.113.7", "10.96.0.10")
			})),
			sets: map[string]map[string]string{
				MapServiceIPs: {
					"10.96.0.10 . 6 . 80":  "goto " + echoSvc,
					"203.0.113.7 . 6 . 80": "goto " + echoExt,
				},
			},
			ignoreProblems: true, // see the report: currently "already used by" itself
		},
		{
			name: "cluster IPs are deduplicated across ports of a service",
			snap: snapshot(
				model.ServicePort{Name: spn("dns", "dns", udp), ClusterIPs: ips("10.96.0.53"), Port: 53, Endpoints: eps(5353, "10.244.1.2")},
				model.ServicePort{Name: spn("dns", "dns-tcp", tcp), ClusterIPs: ips("10.96.0.53"), Port: 53, Endpoints: eps(5353, "10.244.1.2")},
				model.ServicePort{Name: spn("dns", "metrics", tcp), ClusterIPs: ips("10.96.0.53"), Port: 9153},
			),
			sets: map[string]map[string]string{
				SetClusterIPs: {"10.96.0.53": ""},
				MapServiceIPs: {
					"10.96.0.53 . 17 . 53": "goto svc-default/dns/udp/dns",
					"10.96.0.53 . 6 . 53":  "goto svc-default/dns/tcp/dns-tcp",
				},
				SetNoEndpointServices: {"10.96.0.53 . 6 . 9153": reject},
			},
		},
		{
			name: "hairpin set has one element per unique endpoint IP",
			snap: snapshot(
				model.ServicePort{Name: spn("a", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, Endpoints: eps(8080, "10.244.1.1", "10.244.1.2")},
				model.ServicePort{Name: spn("a", "https", tcp), ClusterIPs: ips("10.96.0.1"), Port: 443, Endpoints: eps(8443, "10.244.1.1", "10.244.1.2")},
				model.ServicePort{Name: spn("b", "", sctp), ClusterIPs: ips("10.96.0.2"), Port: 3868, Endpoints: eps(3868, "10.244.1.2", "10.244.1.3")},
			),
			sets: map[string]map[string]string{
				SetHairpin: {"10.244.1.1 . 10.244.1.1": "", "10.244.1.2 . 10.244.1.2": "", "10.244.1.3 . 10.244.1.3": ""},
				MapServiceIPs: {
					"10.96.0.1 . 6 . 80":     "goto svc-default/a/tcp/http",
					"10.96.0.1 . 6 . 443":    "goto svc-default/a/tcp/https",
					"10.96.0.2 . 132 . 3868": "goto svc-default/b/sctp/-",
				},
			},
			absent: []string{"svc-default/b/sctp/-"},
		},
		{
			name: "node port addresses: only the family's",
			cfg:  func(c *Config) { c.NodePortAddrs = ips("192.0.2.10", "2001:db8::10", "192.0.2.11") },
			snap: snapshot(),
			sets: map[string]map[string]string{SetNodePortIPs: {"192.0.2.10": "", "192.0.2.11": ""}},
		},
		{
			name: "node ports on every local address: fib instead of the nodeport-ips set, never loopback",
			cfg:  func(c *Config) { c.NodePortAddrs, c.NodePortAllLocal = nil, true },
			snap: snapshot(echo(func(sp *model.ServicePort) { sp.NodePort = 30080 })),
			sets: map[string]map[string]string{SetNodePortIPs: empty},
			chains: map[string][][]nft.Stmt{
				ChainServices: {
					{nft.VMap{Fields: frontKey, Map: MapServiceIPs}},
					{nft.Lookup{Fields: frontKey, Set: SetClusterFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainClusterFront}},
					{nft.Lookup{Fields: frontKey, Set: SetExternalFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainExternalFront}},
					{nft.MatchFibDaddrLocal{}, notLoopback4, nft.VMap{Fields: portKey, Map: MapServiceNodePorts}},
					{nft.MatchFibDaddrLocal{}, notLoopback4, nft.Lookup{Fields: portKey, Set: SetNodePortFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainNodePortFront}},
				},
				ChainEndpointsCheck: {
					{nft.Lookup{Fields: frontKey, Set: SetNoEndpointServices}, nft.Verdict{Kind: nft.Goto, Chain: ChainReject}},
					{nft.Lookup{Fields: frontKey, Set: SetNoLocalServices}, nft.Verdict{Kind: nft.Drop}},
					{nft.MatchFibDaddrLocal{}, notLoopback4, nft.Lookup{Fields: portKey, Set: SetNoEndpointNodePorts}, nft.Verdict{Kind: nft.Goto, Chain: ChainReject}},
					{nft.MatchFibDaddrLocal{}, notLoopback4, nft.Lookup{Fields: portKey, Set: SetNoLocalNodePorts}, nft.Verdict{Kind: nft.Drop}},
				},
			},
		},
		{
			name: "node ports on the configured addresses",
			snap: snapshot(echo(func(sp *model.ServicePort) { sp.NodePort = 30080 })),
			chains: map[string][][]nft.Stmt{
				ChainServices: {
					{nft.VMap{Fields: frontKey, Map: MapServiceIPs}},
					{nft.Lookup{Fields: frontKey, Set: SetClusterFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainClusterFront}},
					{nft.Lookup{Fields: frontKey, Set: SetExternalFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainExternalFront}},
					{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: SetNodePortIPs}, nft.VMap{Fields: portKey, Map: MapServiceNodePorts}},
					{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: SetNodePortIPs}, nft.Lookup{Fields: portKey, Set: SetNodePortFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainNodePortFront}},
				},
			},
		},
		{
			name: "masquerade bit sets the mark",
			cfg:  func(c *Config) { c.MasqueradeBit = 5 },
			snap: snapshot(),
			chains: map[string][][]nft.Stmt{
				ChainMarkMasq: {{nft.SetMarkBits{Bits: 1 << 5}}},
				ChainMasquerading: {
					{nft.MatchCtStatusDNAT{}, nft.Lookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: SetHairpin}, nft.Masquerade{FullyRandom: true}},
					{nft.MatchMarkUnset{Bits: 1 << 5}, nft.Verdict{Kind: nft.Return}},
					{nft.SetMarkBits{Bits: 1 << 5, Xor: true}},
					{nft.Masquerade{FullyRandom: true}},
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fam := tc.fam
			if fam == 0 {
				fam = nft.IPv4
			}
			cfg := configFor(fam)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			rs, problems := compileChecked(t, tc.snap, cfg, NewSlots())
			if rs.Family != fam || rs.Table != TableName {
				t.Errorf("table %s %s, want %s %s", rs.Family, rs.Table, fam, TableName)
			}
			for name, want := range tc.sets {
				if got := elements(t, rs, name); !reflect.DeepEqual(got, want) {
					t.Errorf("set %s:\n got  %v\n want %v", name, got, want)
				}
			}
			for name, want := range tc.chains {
				ch := chainNamed(rs, name)
				if ch == nil {
					t.Errorf("no chain %s", name)
					continue
				}
				got := make([][]nft.Stmt, len(ch.Rules))
				for i, r := range ch.Rules {
					got[i] = r.Stmts
				}
				ok := len(got) == len(want)
				for i := 0; ok && i < len(want); i++ {
					ok = stmtsMatch(got[i], want[i])
				}
				if !ok {
					t.Errorf("chain %s:\n got %s\n want %s", name, rulesString(fam, got), rulesString(fam, want))
				}
			}
			for _, name := range tc.absent {
				if chainNamed(rs, name) != nil {
					t.Errorf("chain %s exists, want none", name)
				}
			}
			if !tc.ignoreProblems {
				checkProblems(t, problems, tc.problems)
			}
		})
	}
}

func checkProblems(t *testing.T, got []model.Problem, want []string) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = strings.Contains(got[i].String(), want[i])
	}
	if !ok {
		gs := make([]string, len(got))
		for i, p := range got {
			gs[i] = p.String()
		}
		t.Errorf("problems:\n got  %q\n want %q", gs, want)
	}
}

// TestCompileScenarios runs the invariants over every golden scenario in both families.
func TestCompileScenarios(t *testing.T) {
	for name, snap := range scenarios() {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(name+"/"+fam.String(), func(t *testing.T) { compileChecked(t, snap, configFor(fam), NewSlots()) })
		}
	}
}

func TestCompileLarge(t *testing.T) {
	t.Run("5000 endpoints", func(t *testing.T) {
		snap := snapshot(model.ServicePort{Name: spn("big", "http", tcp), ClusterIPs: ips("10.96.0.1"), Port: 80, Endpoints: manyEndpoints(5000)})
		rs, problems := compileChecked(t, snap, testConfig(), NewSlots())
		checkProblems(t, problems, nil)
		if n := len(elements(t, rs, SetHairpin)); n != 5000 {
			t.Errorf("hairpin has %d elements, want 5000", n)
		}
		// checkEndpointSlots has verified the 5000 slots; the chain must use all of them.
		if d := dnatOf(t, rs, spn("big", "http", tcp)); d.Mod != 5000 {
			t.Errorf("mod %d, want 5000", d.Mod)
		}
	})
	t.Run("100-port service", func(t *testing.T) {
		var sps []model.ServicePort
		for i := range 100 {
			sps = append(sps, model.ServicePort{
				Name: spn("wide", fmt.Sprintf("p%03d", i), tcp), ClusterIPs: ips("10.96.0.1"), Port: uint16(1000 + i),
				NodePort: uint16(30000 + i), Endpoints: eps(uint16(2000+i), "10.244.1.1", "10.244.1.2"),
			})
		}
		rs, problems := compileChecked(t, snapshot(sps...), testConfig(), NewSlots())
		checkProblems(t, problems, nil)
		if n := len(elements(t, rs, MapServiceIPs)); n != 100 {
			t.Errorf("service-ips has %d elements, want 100", n)
		}
		if n := len(elements(t, rs, MapServiceNodePorts)); n != 100 {
			t.Errorf("service-nodeports has %d elements, want 100", n)
		}
		if n := len(elements(t, rs, SetClusterIPs)); n != 1 {
			t.Errorf("cluster-ips has %d elements, want 1", n)
		}
		if n := len(elements(t, rs, SetHairpin)); n != 2 {
			t.Errorf("hairpin has %d elements, want 2", n)
		}
	})
}

// TestCompileDeterministic: the same input gives the same ruleset, and Compile does not
// modify its snapshot.
func TestCompileDeterministic(t *testing.T) {
	for name := range scenarios() {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(name+"/"+fam.String(), func(t *testing.T) {
				snap, pristine := scenarios()[name], scenarios()[name]
				a, pa := Compile(snap, configFor(fam), NewSlots())
				b, pb := Compile(snap, configFor(fam), NewSlots())
				if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(pa, pb) {
					t.Errorf("two compiles differ:\n%s\n%s", nft.Render(a), nft.Render(b))
				}
				if !reflect.DeepEqual(snap, pristine) {
					t.Errorf("Compile modified its snapshot")
				}
			})
		}
	}
}

// ---- slots -----------------------------------------------------------------------------

func dnatOf(t *testing.T, rs *nft.Ruleset, sp model.ServicePortName) nft.DNATNumgenMap {
	t.Helper()
	ch := chainNamed(rs, ChainName("svc", sp))
	if ch == nil {
		t.Fatalf("no chain for %s", sp)
	}
	for _, r := range ch.Rules {
		for _, st := range r.Stmts {
			if d, ok := st.(nft.DNATNumgenMap); ok {
				return d
			}
		}
	}
	t.Fatalf("no DNAT in %s", ch.Name)
	return nft.DNATNumgenMap{}
}

// slotsWorld is a mutable set of services with n endpoints each, compiled with one
// allocator as a sync loop would.
type slotsWorld struct {
	t     *testing.T
	slots *Slots
	n     map[string]int
}

func newSlotsWorld(t *testing.T) *slotsWorld {
	return &slotsWorld{t: t, slots: NewSlots(), n: map[string]int{}}
}

func (w *slotsWorld) compile() map[string]uint32 {
	w.t.Helper()
	names := make([]string, 0, len(w.n))
	for name := range w.n {
		names = append(names, name)
	}
	sort.Strings(names)
	var sps []model.ServicePort
	for i, name := range names {
		// an external Local policy with a node port keeps a service port chained, and
		// endpoint slots are the chained path's
		sps = append(sps, model.ServicePort{
			Name: spn(name, "http", tcp), ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(1 + i%250)})},
			Port: 80, Endpoints: manyEndpoints(w.n[name]), NodePort: uint16(30000 + i), ExternalPolicyLocal: true,
		})
	}
	snap := snapshot(sps...)
	rs, problems := compileChecked(w.t, snap, testConfig(), w.slots)
	checkProblems(w.t, problems, nil)
	checkSlotsState(w.t, w.slots)
	offsets := map[string]uint32{}
	for _, name := range names {
		if w.n[name] > 0 {
			offsets[name] = dnatOf(w.t, rs, spn(name, "http", tcp)).Offset
		}
	}
	if len(w.slots.owned) != len(offsets) {
		w.t.Errorf("allocator owns %d ranges for %d services with endpoints", len(w.slots.owned), len(offsets))
	}
	return offsets
}

func TestSlotsStable(t *testing.T) {
	w := newSlotsWorld(t)
	w.n = map[string]int{"a": 3, "b": 3, "c": 3}
	first := w.compile()
	if first["a"] != 0 || first["b"] != slotBlock || first["c"] != 2*slotBlock {
		t.Fatalf("fresh offsets %v, want a=0 b=%d c=%d", first, slotBlock, 2*slotBlock)
	}
	expect := func(step string, got map[string]uint32, want map[string]uint32) {
		t.Helper()
		for name, off := range want {
			if got[name] != off {
				t.Errorf("%s: offset of %s = %d, want %d (all: %v)", step, name, got[name], off, got)
			}
		}
	}

	delete(w.n, "b")
	expect("b removed", w.compile(), map[string]uint32{"a": 0, "c": 2 * slotBlock})

	w.n["d"] = 5
	expect("d added", w.compile(), map[string]uint32{"a": 0, "c": 2 * slotBlock, "d": slotBlock}) // d reuses b's freed block

	w.n["a"] = 16
	expect("a grows within its block", w.compile(), map[string]uint32{"a": 0, "c": 2 * slotBlock, "d": slotBlock})

	w.n["a"] = 17
	got := w.compile()
	expect("a grows past its block", got, map[string]uint32{"c": 2 * slotBlock, "d": slotBlock})
	if got["a"] == 0 {
		t.Errorf("a grew to 2 blocks but kept offset 0, which overlaps d")
	}
	moved := got["a"]

	w.n["a"] = 9 // 2 blocks for 1 needed: within the shrink hysteresis
	expect("a shrinks a little", w.compile(), map[string]uint32{"a": moved, "c": 2 * slotBlock, "d": slotBlock})

	w.n["a"] = 5 * slotBlock
	grown := w.compile()["a"]
	w.n["a"] = 1 // 5 blocks for 1 needed: released and reallocated
	if got := w.compile()["a"]; got == grown {
		t.Errorf("a shrank from 5 blocks to 1 endpoint and kept its 5-block range at %d", got)
	}

	w.n["a"] = 0 // no endpoints: its range is freed, the others stay
	expect("a loses its endpoints", w.compile(), map[string]uint32{"c": 2 * slotBlock, "d": slotBlock})
	if _, ok := w.slots.owned[spn("a", "http", tcp)]; ok {
		t.Errorf("a has no endpoints but still owns a range")
	}
}

func TestSlotsPages(t *testing.T) {
	w := newSlotsWorld(t)
	w.n = map[string]int{"a": 5 * slotBlock, "b": 13 * slotBlock} // 5 + 13 blocks > one page
	got := w.compile()
	if got["a"] != 0 || got["b"] != PageSlots {
		t.Errorf("offsets %v, want a=0 and b on the next page (%d)", got, PageSlots)
	}
	w.n["c"] = 11 * slotBlock // fits in the rest of page 0
	if got := w.compile(); got["c"] != 5*slotBlock {
		t.Errorf("c at %d, want the hole left in page 0 (%d)", got["c"], 5*slotBlock)
	}
	w.n["d"] = PageSlots + 1 // more than a page: starts on a page boundary
	if got := w.compile(); got["d"]%PageSlots != 0 {
		t.Errorf("d (more than a page) at %d, not page-aligned", got["d"])
	}
}

// TestSlotsBounded: a thousand add/remove cycles, with another service growing and
// shrinking meanwhile, never push the slot space beyond what the live services need.
func TestSlotsBounded(t *testing.T) {
	w := newSlotsWorld(t)
	for i := range 10 {
		w.n[fmt.Sprintf("stable-%d", i)] = 1 + 7*i // up to 64 endpoints: 4 blocks
	}
	maxKey := uint32(0)
	for i := range 1000 {
		w.n[fmt.Sprintf("tmp-%04d", i)] = 1 + i%50
		w.n["breathing"] = 1 + (i*37)%90
		for name, off := range w.compile() {
			if end := off + uint32(w.n[name]); end > maxKey {
				maxKey = end
			}
		}
		delete(w.n, fmt.Sprintf("tmp-%04d", i))
		w.compile()
	}
	// Live at once: 10 stable services (22 blocks), one of up to 4 blocks, one of up to
	// 6 blocks. Fragmentation and page alignment may waste some, but a leak of even one
	// block per cycle would reach 1000 blocks.
	if limit := uint32(3 * PageSlots); maxKey > limit {
		t.Errorf("slot keys reached %d over 1000 cycles, want at most %d", maxKey, limit)
	}
	if w.slots.next > 3*pageBlocks || len(w.slots.free) > 20 {
		t.Errorf("allocator grew: next block %d, %d free ranges", w.slots.next, len(w.slots.free))
	}
}

// checkSlotsState asserts the allocator's internal invariants: owned and free ranges
// partition [0, next) exactly, free ranges are sorted and never adjacent (or touching
// next), and the page rule holds.
func checkSlotsState(t *testing.T, s *Slots) {
	t.Helper()
	type span struct {
		slotRange
		owner string
	}
	var all []span
	for sp, r := range s.owned {
		if r.blocks == 0 {
			t.Errorf("%s owns an empty range", sp)
		}
		if r.blocks <= pageBlocks && r.start/pageBlocks != (r.start+r.blocks-1)/pageBlocks {
			t.Errorf("%s: range %v straddles a page", sp, r)
		}
		if r.blocks > pageBlocks && r.start%pageBlocks != 0 {
			t.Errorf("%s: multi-page range %v is not page-aligned", sp, r)
		}
		all = append(all, span{r, sp.String()})
	}
	for i, f := range s.free {
		if f.blocks == 0 {
			t.Errorf("empty free range at %d", f.start)
		}
		if i > 0 && s.free[i-1].start+s.free[i-1].blocks >= f.start {
			t.Errorf("free ranges %v and %v are unsorted, overlapping or adjacent", s.free[i-1], f)
		}
		all = append(all, span{f, "free"})
	}
	if n := len(s.free); n > 0 && s.free[n-1].start+s.free[n-1].blocks == s.next {
		t.Errorf("free range %v ends at next (%d): not given back", s.free[n-1], s.next)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].start < all[j].start })
	at := uint32(0)
	for _, sp := range all {
		if sp.start != at {
			t.Errorf("blocks [%d, %d) are neither owned nor free, or overlap (%s at %d)", at, sp.start, sp.owner, sp.start)
		}
		at = sp.start + sp.blocks
	}
	if at != s.next {
		t.Errorf("ranges end at block %d, next is %d", at, s.next)
	}
}

// TestSlotsRandom drives the allocator directly with random grow/shrink/remove steps
// (fixed seed) and checks its invariants after each.
func TestSlotsRandom(t *testing.T) {
	s := NewSlots()
	state := uint32(1)
	rnd := func(n uint32) uint32 { // xorshift: deterministic, no global rand
		state ^= state << 13
		state ^= state >> 17
		state ^= state << 5
		return state % n
	}
	live := map[model.ServicePortName]int{}
	for step := range 3000 {
		sp := spn(fmt.Sprintf("s%02d", rnd(40)), "", tcp)
		if rnd(4) == 0 {
			delete(live, sp)
		} else {
			live[sp] = 1 + int(rnd(20*slotBlock)) // up to 20 blocks: sometimes over a page
		}
		names := make([]model.ServicePortName, 0, len(live))
		for sp := range live {
			names = append(names, sp)
		}
		sort.Slice(names, func(i, j int) bool { return names[i].Less(names[j]) })
		keep := map[model.ServicePortName]bool{}
		for _, sp := range names { // in name order, as Compile does
			s.base(sp, live[sp])
			keep[sp] = true
		}
		s.retain(keep)
		checkSlotsState(t, s)
		if len(s.owned) != len(live) {
			t.Fatalf("step %d: %d ranges owned for %d live", step, len(s.owned), len(live))
		}
		for sp, n := range live {
			if r := s.owned[sp]; r.blocks*slotBlock < uint32(n) {
				t.Fatalf("step %d: %s has %d blocks for %d endpoints", step, sp, r.blocks, n)
			}
		}
		if t.Failed() {
			t.Fatalf("step %d: allocator invariants broken", step)
		}
	}
}
