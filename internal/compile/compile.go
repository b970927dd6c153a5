// Package compile turns a model snapshot into the nftables ruleset of one address family.
// Which service ports it programs, and with which frontends, internal/admit decides. A
// Compiler is incremental: it keeps the previous call's parts (its admit.Admission the
// claims and counts) and compiles again only the service ports that changed, and its
// result is the ruleset a fresh compile of the same inputs (the snapshot, the
// configuration and the endpoint slot allocator) would give, which TestCompilerIncremental checks along random
// sequences of changes. docs/architecture.md describes the layout it produces.
package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"unicode/utf8"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/maglev"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/par"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
)

// TableName is the name of nftproxy's table in each family.
const TableName = "nftproxy"

// Object names in the table. layout.go describes each one (and the names built per
// service port, endpoint, slot page and count bit); nothing outside this package spells
// them.
const (
	SetClusterIPs          = "cluster-ips"
	SetNodePortIPs         = "nodeport-ips"
	MapServiceIPs          = "service-ips"
	MapServiceNodePorts    = "service-nodeports"
	SetNoEndpointServices  = "no-endpoint-services"
	SetNoEndpointNodePorts = "no-endpoint-nodeports"
	SetNoLocalServices     = "no-local-endpoint-services"
	SetNoLocalNodePorts    = "no-local-endpoint-nodeports"
	// The flat path (flat.go): frontends dispatched through data only.
	SetClusterFrontends  = "cluster-frontends"
	SetExternalFrontends = "external-frontends"
	SetNodePortFrontends = "nodeport-frontends"
	MapEndpoints         = "endpoints"
	MapNodePortEndpoints = "nodeport-endpoints"
	mapEndpointsPrefix   = "endpoints-" // + page number
	SetHairpin           = "hairpin"
	MapFirewallIPs       = "firewall-ips"
	// SetServiceCounters and SetNodePortCounters count packets and bytes per service
	// address and node port; their elements' comments name the service port.
	SetServiceCounters  = "service-counters"
	SetNodePortCounters = "nodeport-counters"

	ChainServices        = "services"
	ChainMarkMasq        = "mark-for-masquerade"
	ChainMasquerading    = "masquerading"
	ChainEndpointsCheck  = "service-endpoints-check"
	ChainClusterIPsCheck = "cluster-ips-check"
	// ChainReject rejects traffic to services without endpoints; its rule counts it.
	ChainReject        = "reject-chain"
	ChainFirewallCheck = "firewall-check"
	ChainClusterFront  = "cluster-frontend"
	ChainExternalFront = "external-frontend"
	ChainNodePortFront = "nodeport-frontend"

	// The base chains, on netfilter's hooks.
	ChainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	ChainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	ChainFilterInput             = "filter-input"
	ChainFilterForward           = "filter-forward"
	ChainFilterOutput            = "filter-output"
	ChainNATPrerouting           = "nat-prerouting"
	ChainNATOutput               = "nat-output"
	ChainNATPostrouting          = "nat-postrouting"

	// A service port's own objects are named by ChainName with one of these kinds.
	kindService  = "svc"   // its chain (and, + "/" + index, its endpoints' chains)
	kindLocal    = "local" // its chain of the endpoints on this node
	kindExternal = "ext"   // its chain for external traffic
	kindFirewall = "fw"    // its source-range chain and set
	// affinityPrefix + a service chain's endpoint chain without "svc-": the clients
	// an endpoint served recently
	affinityPrefix = "affinity-"
)

// Config holds the settings that shape a family's ruleset, each defined here (or in
// admit.Policy) once: the proxy's configuration carries the Config whole
// (pipeline.Config.Compile), and a new setting is one field.
type Config struct {
	Family nft.Family
	// DetectLocal tells traffic from the cluster's pods from other traffic
	// (--detect-local-mode): traffic to a cluster IP that is not local is masqueraded.
	DetectLocal   DetectLocal
	MasqueradeAll bool
	MasqueradeBit uint32 // mark bit index, kube-proxy's default is 14
	// NodePortAddrs are fixed local addresses node ports answer on, besides the
	// snapshot's NodePortAddrs (the proxy resolves --nodeport-addresses into those; a
	// fixed list is for compiling without it). When NodePortAllLocal is set, node ports
	// answer on every local address instead ("fib daddr type local").
	NodePortAddrs    []netip.Addr
	NodePortAllLocal bool
	// NoMasquerade are destination ranges (endpoints, after DNAT) whose traffic is never
	// masqueraded, whatever marked it (--no-masquerade-cidrs): node → service → pod
	// traffic keeps the node's address, off-cluster clients keep theirs. Hairpin
	// traffic (an endpoint reaching itself) is still masqueraded. Empty: kube-proxy's
	// behaviour.
	NoMasquerade []netip.Prefix
	// MasqueradeToNodeIP source-NATs masqueraded traffic to the node's primary IP of the
	// family (the Node's InternalIP, else ExternalIP) instead of the address of the
	// interface it leaves by (--masquerade-to-node-ip); while the Node has none,
	// traffic is masqueraded. Hairpin traffic is masqueraded either way.
	MasqueradeToNodeIP bool
	// DefaultBalancing is how service ports without a LoadBalancingAnnotation pick a new
	// flow's endpoint (--load-balancing): BalancingDefault or BalancingRandom is
	// kube-proxy's random choice, BalancingMaglev consistent hashing.
	DefaultBalancing model.Balancing
	// Policy decides which service ports are programmed, and which external frontends
	// they may take (internal/admit).
	admit.Policy
	// FastPath offloads established service flows to a flowtable (fastpath.go).
	FastPath FastPath
}

// maglev reports whether sp picks endpoints by consistent hashing. ClientIP affinity
// wins: a port with affinity picks a new client's endpoint at random.
func (c Config) maglev(sp *model.ServicePort) bool {
	if sp.AffinityTimeout > 0 {
		return false
	}
	return sp.Balancing == model.BalancingMaglev || (sp.Balancing == model.BalancingDefault && c.DefaultBalancing == model.BalancingMaglev)
}

// ElementCost estimates the set elements a service port adds to the tables of both
// families: per frontend a counter and a dispatch element, per endpoint an endpoint
// entry and a hairpin element, two for a node port, and on the flat path (flat.go) a
// copy of the endpoint entries for every further frontend. The flat path's copies are
// bounded by maxFlatElements per service port.
//
// Kernel objects that are not elements are counted in elements of about the same
// memory: with ClientIP affinity each endpoint has its own set, chain and rules
// (affinityCost), and with loadBalancerSourceRanges each load-balancer IP a
// firewall-ips entry and each range two interval elements (its start and its end).
func ElementCost(sp *model.ServicePort) int {
	fronts, eps := frontends(sp), len(sp.Endpoints)
	if sp.NodePort != 0 {
		fronts++
	}
	n := 2 * (fronts + eps)
	if fronts > 1 && eps <= maxFlatEndpoints && fronts*eps <= maxFlatElements {
		n += (fronts - 1) * eps
	}
	if sp.AffinityTimeout > 0 {
		n += affinityCost * eps
	}
	if sp.AffinityTimeout == 0 && sp.Balancing == model.BalancingMaglev {
		n += maglevCost(sp)
	}
	if lbs := len(sp.LoadBalancerIPs); lbs > 0 && (len(sp.SourceRanges) > 0 || sp.SourceRangesBroken) {
		n += lbs + 2*len(sp.SourceRanges)
	}
	return n
}

// maglevCost is what a consistently hashed port's lookup tables cost beside one entry
// per endpoint: per family with endpoints a table of maglev.Size entries, two when the
// port has a node-local chain too (traffic policy Local).
func maglevCost(sp *model.ServicePort) int {
	n4 := 0
	for _, e := range sp.Endpoints {
		if e.Addr.Is4() {
			n4++
		}
	}
	chains := 1
	if sp.UsesLocalEndpoints() {
		chains = 2
	}
	n := 0
	for _, k := range []int{n4, len(sp.Endpoints) - n4} {
		if k > 0 {
			n += chains * (maglev.Size(k) - k)
		}
	}
	return n
}

// affinityCost is what an endpoint under ClientIP affinity costs beside its entries, in
// elements: its set (a small hash table that grows with the clients it records), its
// chain and three rules take about as much kernel memory as this many map elements
// (measured by TestKernelMemoryAffinity).
const affinityCost = 24

// frontends is the number of frontends a service port has (all families).
func frontends(sp *model.ServicePort) int {
	return len(sp.ClusterIPs) + len(sp.ExternalIPs) + len(sp.LoadBalancerIPs)
}

// cost is what the budget counts for sp: ElementCost, with the lookup tables of the
// Maglev default (DefaultBalancing) for a port without the annotation.
func (c Config) cost(sp *model.ServicePort) int {
	n := ElementCost(sp)
	if sp.Balancing == model.BalancingDefault && c.maglev(sp) {
		n += maglevCost(sp)
	}
	return n
}

func (c Config) masqMark() uint32 { return 1 << c.MasqueradeBit }

// Compile returns the complete ruleset for cfg.Family, and the problems it found:
// conflicts it resolved (two services claiming the same address, protocol and port:
// cluster IPs win, then the older Service), refused addresses, and Services set aside
// by cfg.Limits, as internal/admit decides. slots keeps endpoint slot ranges stable
// between calls; pass the same allocator every time for one family. The ruleset has no parts (see nft.Part): it is what a fresh
// Compiler produces, flattened.
func Compile(snap *model.Snapshot, cfg Config, slots *Slots) (*nft.Ruleset, []model.Problem) {
	rs, problems := NewCompiler(cfg, slots).Compile(snap)
	return rs.Flatten(), problems
}

// Compiler compiles snapshots of one family incrementally: each service port becomes one
// nft.Part, and a service port whose input, won addresses and environment (node,
// configuration) are unchanged since the previous call gets its previous Part back, the
// same pointer. Which inputs changed comes from the snapshot's model.Changes when the
// snapshot follows the one compiled last (the model cache's change set); otherwise each
// service port is compared with its previous input. The output equals Compile's, but a
// sync costs in proportion to the services that changed (plus a cheap pass over all of
// them). A Compiler must be used by one goroutine at a time.
type Compiler struct {
	cfg           Config
	slots         *Slots
	node          model.Node
	nodePortAddrs []netip.Addr    // the snapshot's, of the previous call
	changes       model.Changes   // the previous call's snapshot's
	parts         []*compiledPart // of the previous call, in service port order
	spare         []*compiledPart // an array for the next call's parts
	last          *nft.Ruleset    // the previous call's ruleset (its Changes' Since)
	// which service ports are programmed, with which frontends
	admission *admit.Admission
	setAside  int     // the previous call's Services set aside
	scratch   scratch // per-call buffers, reused
}

// scratch holds the per-call buffers of Compile. Nothing in them outlives a call.
type scratch struct {
	matched []*compiledPart
}

// grow returns s[:n], cleared, reusing its array when large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		// room for more: services come one by one, and an exact size would make every
		// sync that adds one allocate again (a megabyte or two at 30k)
		return make([]T, n, n+n/8+16)
	}
	s = s[:n]
	clear(s)
	return s
}

// compiledPart is a service port's Part and what it was compiled from.
type compiledPart struct {
	in     *model.ServicePort // the snapshot's: service ports are never modified once built
	claims admit.Claims
	part   *nft.Part
	owners []model.ServicePortName // slot ranges it uses
	pages  []uint32                // endpoint map pages it adds elements to
	// problems found compiling it (endpoints skipped), reported on every call
	problems []model.Problem
	tags     []*purpose.Tag // one per purpose, shared by its rules and elements
	tagBlock []purpose.Tag  // where they are made
	flatMax  int            // the largest endpoint count of its flat frontends
}

// NewCompiler returns a Compiler for cfg.Family; slots is its endpoint slot allocator.
func NewCompiler(cfg Config, slots *Slots) *Compiler {
	return &Compiler{cfg: cfg, slots: slots, admission: admit.New(cfg.Family, cfg.Policy, cfg.cost, cfg.NodePortAddrs)}
}

// SetAside is the number of Services the last Compile set aside (left out of the
// ruleset) because they exceed cfg.Limits: a limit of their own or the table's element
// budget.
func (cc *Compiler) SetAside() int { return cc.setAside }

// Compile returns the ruleset of snap, with one Part per service port, and the conflicts
// it resolved, like the package's Compile.
func (cc *Compiler) Compile(snap *model.Snapshot) (*nft.Ruleset, []model.Problem) {
	prev := cc.parts
	if !cc.node.Equal(snap.Node) || !slices.Equal(cc.nodePortAddrs, snap.NodePortAddrs) {
		// topology and firewall rules depend on the node, the frontends a service may
		// claim on the node's addresses: compile everything
		prev = nil
		cc.node, cc.nodePortAddrs = snap.Node, snap.NodePortAddrs
	}
	// the model says which service ports may differ from the previous snapshot's when
	// that is the one this compiler saw last; otherwise every input is compared
	trusted := snap.Changes.Follows(cc.changes)
	cc.changes = snap.Changes
	c := &compiler{
		cfg: cc.cfg, slots: cc.slots, v6: cc.cfg.Family == nft.IPv6, node: snap.Node, serviceCIDRs: snap.ServiceCIDRs,
		local:         cc.cfg.DetectLocal.resolve(cc.cfg.Family == nft.IPv6, snap.Node),
		nodePortAddrs: cc.cfg.NodePortAddrs,
	}
	for _, a := range snap.NodePortAddrs {
		if !slices.Contains(c.nodePortAddrs, a) {
			c.nodePortAddrs = append(slices.Clip(c.nodePortAddrs), a)
		}
	}
	c.init()
	services := snap.Services
	sc := &cc.scratch
	var dropped []model.ServicePortName // slot owners no longer used
	// the parts that are not the previous call's (nft.PartChanges): owner → part, nil
	// when gone; kept only when prev holds every previous part
	changed := map[string]*nft.Part{}

	// the previous part of each service port (both lists are in name order)
	sc.matched = grow(sc.matched, len(services))
	matched := sc.matched
	j := 0
	for i := range services {
		if j < len(prev) && prev[j].in == services[i] { // unchanged: no name to compare
			matched[i] = prev[j]
			j++
			continue
		}
		for ; j < len(prev); j++ {
			if cmp := prev[j].in.Name.Compare(services[i].Name); cmp >= 0 {
				if cmp == 0 {
					matched[i] = prev[j]
					j++
				}
				break
			}
			dropped = append(dropped, prev[j].owners...)
			changed[prev[j].part.Owner] = nil
		}
	}
	for ; j < len(prev); j++ {
		dropped = append(dropped, prev[j].owners...)
		changed[prev[j].part.Owner] = nil
	}

	d := cc.admission.Admit(snap)
	c.admitted = d
	c.problems = append(c.problems, d.Problems...)
	cc.setAside = d.SetAside
	moved := d.Moved

	pages := map[uint32]bool{}
	flatMax := 0
	// room for the previous parts and every change (an IPv6 table of an IPv4 cluster has
	// none: 30,000 entries per sync for nothing)
	parts := make([]*nft.Part, 0, min(len(services), len(prev)+d.Changes+16))
	// the array of the call before the previous one: nothing refers to it any more (a
	// new one per call was a fifth of what a sync allocated at 30k)
	next := grow(cc.spare, len(services))[:0]
	flat := c.compileFlat(services, prev, d)
	for i := range services {
		sp := services[i]
		cp := matched[i]
		if !d.Programmed(i) {
			if cp != nil {
				dropped = append(dropped, cp.owners...)
				changed[cp.part.Owner] = nil
			}
			continue // set aside, or no address in this family
		}
		var w admit.Claims
		pre := flat != nil && flat[i] != nil // compiled in advance: a new port (no previous part)
		switch {
		case pre:
			cp = flat[i]
			changed[cp.part.Owner] = cp.part
		case cp != nil && cp.in == sp && !d.Renewed && !d.Affected[sp]:
			w = cp.claims // nothing it claims changed hands
		default:
			if w = d.Claims(sp); cp != nil && cp.claims.Equal(w) {
				w = cp.claims
			}
		}
		sameInput := cp != nil && (cp.in == sp || (trusted && !snap.Changes.MayDiffer(sp.Name)) || cp.in.Equal(sp))
		if !pre && (!sameInput || !cp.claims.Equal(w) || (len(moved) > 0 && endpointsAt(cp.in.Endpoints, moved))) {
			old := cp
			cp = c.servicePort(sp, w.Clone(), false)
			if old != nil {
				for _, o := range old.owners {
					if !slices.Contains(cp.owners, o) {
						dropped = append(dropped, o)
					}
				}
				if old.part.Owner != cp.part.Owner {
					changed[old.part.Owner] = nil
				}
			}
			changed[cp.part.Owner] = cp.part
		}
		c.problems = append(c.problems, cp.problems...)
		next = append(next, cp)
		for _, pg := range cp.pages {
			pages[pg] = true
		}
		flatMax = max(flatMax, cp.flatMax)
		parts = append(parts, cp.part)
	}
	cc.parts, cc.spare = next, prev[:cap(prev)]
	clear(cc.spare) // keep no dropped part alive
	clear(matched)  // keep no dropped part alive
	cc.slots.drop(dropped)
	if prev == nil {
		// after a node change, parts were compiled anew without the old ones' owners
		live := map[model.ServicePortName]bool{}
		for _, cp := range next {
			for _, o := range cp.owners {
				live[o] = true
			}
		}
		cc.slots.retain(live)
	}
	c.treeBits = cc.slots.growTree(flatMax)
	rs := c.finish(pages)
	rs.Parts = parts
	if prev != nil || cc.last == nil || len(cc.last.Parts) == 0 {
		// every previous part was matched, dropped or kept: the change set is complete
		rs.Changes = nft.ChangesSince(cc.last, rs.Parts, changed)
	}
	cc.last = rs
	return rs, c.problems
}

// Won calls f with every service port of protocol proto that holds a frontend in the
// ruleset compiled last (this family's): the cluster, external and load-balancer IPs
// it won (a new slice, f's to keep) and its node port (0: none).
func (cc *Compiler) Won(proto uint8, f func(name model.ServicePortName, ips []netip.Addr, nodePort uint16)) {
	for _, cp := range cc.parts {
		w := cp.claims
		if cp.in.Name.Protocol == proto && (len(w.Internal)+len(w.External) > 0 || w.NodePort != 0) {
			f(cp.in.Name, slices.Concat(w.Internal, w.External), w.NodePort)
		}
	}
}

// endpointsAt reports whether any endpoint has one of the addresses.
func endpointsAt(eps []model.Endpoint, addrs map[netip.Addr]bool) bool {
	for i := range eps {
		if addrs[eps[i].Addr] {
			return true
		}
	}
	return false
}

type compiler struct {
	cfg      Config
	slots    *Slots
	v6       bool
	treeBits int // depth of the endpoint-count trees

	// the shared sets, and the chains that are not any service port's
	clusterIPs, nodePortIPs, serviceIPs, serviceNodePorts *nft.Set
	noEndpointServices, noEndpointNodePorts               *nft.Set
	noLocalServices, noLocalNodePorts                     *nft.Set
	hairpin, firewallIPs                                  *nft.Set
	serviceCounters, nodePortCounters                     *nft.Set
	node                                                  model.Node
	serviceCIDRs                                          []netip.Prefix
	local                                                 localCheck   // DetectLocal for this family and node
	nodePortAddrs                                         []netip.Addr // the configuration's and the snapshot's

	problems []model.Problem
	admitted admit.Decisions // this call's
}

// tag returns the part's tag for purpose p, made once per part and shared by its rules
// and elements. Tags are made in blocks: one allocation serves a typical part.
func (cp *compiledPart) tag(p purpose.Purpose) *purpose.Tag {
	for _, t := range cp.tags {
		if t.Purpose == p {
			return t
		}
	}
	if len(cp.tagBlock) == cap(cp.tagBlock) {
		cp.tagBlock = make([]purpose.Tag, 0, 8) // tags already handed out keep the old block alive
	}
	cp.tagBlock = append(cp.tagBlock, purpose.Tag{Port: &cp.in.Name, Purpose: p})
	t := &cp.tagBlock[len(cp.tagBlock)-1]
	cp.tags = append(cp.tags, t)
	return t
}

// add appends elements of a shared set to the part.
func (cp *compiledPart) add(set string, es ...nft.Element) {
	p := cp.part
	if n := len(p.Elements); n > 0 && p.Elements[n-1].Set == set {
		p.Elements[n-1].Elements = append(p.Elements[n-1].Elements, es...)
		return
	}
	p.Elements = append(p.Elements, nft.SetElements{Set: set, Elements: es})
}

func (c *compiler) addrType() nft.Datatype {
	if c.v6 {
		return nft.TypeIPv6Addr
	}
	return nft.TypeIPv4Addr
}

func (c *compiler) init() {
	a := c.addrType()
	frontend := []nft.Datatype{a, nft.TypeInetProto, nft.TypeInetService}
	port := []nft.Datatype{nft.TypeInetProto, nft.TypeInetService}
	verdict := []nft.Datatype{nft.TypeVerdict}
	c.clusterIPs = &nft.Set{Name: SetClusterIPs, Key: []nft.Datatype{a}, Comment: "cluster IPs of all services"}
	c.nodePortIPs = &nft.Set{Name: SetNodePortIPs, Key: []nft.Datatype{a}, Comment: "addresses node ports answer on"}
	c.serviceIPs = &nft.Set{Name: MapServiceIPs, Key: frontend, Data: verdict, Comment: "frontends of service ports with their own chains"}
	c.serviceNodePorts = &nft.Set{Name: MapServiceNodePorts, Key: port, Data: verdict, Comment: "node ports of service ports with their own chains"}
	c.noEndpointServices = &nft.Set{Name: SetNoEndpointServices, Key: frontend, Comment: "service IPs without endpoints: rejected"}
	c.noEndpointNodePorts = &nft.Set{Name: SetNoEndpointNodePorts, Key: port, Comment: "node ports without endpoints: rejected"}
	c.noLocalServices = &nft.Set{Name: SetNoLocalServices, Key: frontend, Comment: "service IPs whose Local policy has no endpoint on this node: dropped"}
	c.noLocalNodePorts = &nft.Set{Name: SetNoLocalNodePorts, Key: port, Comment: "node ports whose Local policy has no endpoint on this node: dropped"}
	c.firewallIPs = &nft.Set{Name: MapFirewallIPs, Key: frontend, Data: verdict, Comment: "load-balancer IPs with source ranges"}
	c.serviceCounters = &nft.Set{Name: SetServiceCounters, Key: frontend, Counter: true, Comment: "packets and bytes sent to each service address"}
	c.nodePortCounters = &nft.Set{Name: SetNodePortCounters, Key: port, Counter: true, Comment: "packets and bytes sent to each node port"}
	c.hairpin = &nft.Set{Name: SetHairpin, Key: []nft.Datatype{a, a}, Comment: "endpoint . endpoint: hairpin traffic to masquerade"}
	for _, ip := range c.nodePortAddrs {
		if ip.Is6() == c.v6 && !ip.IsLoopback() {
			c.nodePortIPs.Elements = append(c.nodePortIPs.Elements, nft.Element{Key: []nft.Value{nft.Addr(ip)}})
		}
	}
}

// maxComment is the longest comment nft accepts in its input (the kernel would store
// more, but the rendered text must load with nft -f).
const maxComment = 128

// truncateComment shortens s to maxComment bytes without splitting a character. Service
// port names can be longer (63 + 63 + 15 characters).
func truncateComment(s string) string {
	if len(s) <= maxComment {
		return s
	}
	n := maxComment
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// endpoints returns sp's endpoints of the compiler's family, less those at a cluster IP
// (reported as problems of cp). That is sp.Endpoints itself when it is all of them, as
// it usually is: a compiled part keeps its endpoints (the flat path's entries are built
// from them), and a copy per service port would add their size again.
func (c *compiler) endpoints(cp *compiledPart, sp *model.ServicePort) []model.Endpoint {
	keep := func(e *model.Endpoint) bool { return e.Addr.Is6() == c.v6 && !c.admitted.ClusterIP(e.Addr) }
	n := 0
	for i := range sp.Endpoints {
		if keep(&sp.Endpoints[i]) {
			n++
		}
	}
	if n == len(sp.Endpoints) {
		return sp.Endpoints
	}
	eps := make([]model.Endpoint, 0, n)
	for i := range sp.Endpoints {
		switch e := &sp.Endpoints[i]; {
		case keep(e):
			eps = append(eps, *e)
		case e.Addr.Is6() == c.v6: // of this family, so at a cluster IP
			cp.problems = append(cp.problems, model.Problem{Kind: model.KindService, Namespace: sp.Name.Namespace, Name: sp.Name.Name,
				Reason: fmt.Sprintf("port %q: endpoint address %s is a service's cluster IP, skipped", sp.Name.Port, e.Addr)})
		}
	}
	return eps
}

// parallelCompileMin is the number of service ports from which a compilation without
// previous parts (a cold start, a node change) compiles the flat ones in advance, on
// every core (compileFlat). A variable for the test that compares with one core.
var parallelCompileMin = 2048

// compileFlat compiles, when there is no previous part (prev is nil) and there are at
// least parallelCompileMin service ports, every flat one that has addresses in this
// family, in parallel: out[i] is services[i]'s part, nil when it is not flat or not
// compiled here (the caller's loop compiles those, in order). A flat port's compilation
// reads the compiler and writes only its own part: it takes no endpoint slots (chained
// ports do, in order, so that their ranges do not depend on timing). The claims are
// taken in order first (Decisions.Claims appends to per-call buffers).
func (c *compiler) compileFlat(services []*model.ServicePort, prev []*compiledPart, d admit.Decisions) []*compiledPart {
	if prev != nil || len(services) < parallelCompileMin {
		return nil
	}
	won := make([]admit.Claims, len(services))
	for i, sp := range services {
		if d.Programmed(i) {
			won[i] = d.Claims(sp).Clone()
		}
	}
	out := make([]*compiledPart, len(services))
	par.Each(len(services), 256, func(i int) {
		if d.Programmed(i) {
			out[i] = c.servicePort(services[i], won[i], true)
		}
	})
	return out
}

// servicePort compiles one service port, given the frontends and node port it won. With
// flatOnly it returns nil, having written nothing but its own part, unless the port is
// flat.
func (c *compiler) servicePort(sp *model.ServicePort, won admit.Claims, flatOnly bool) *compiledPart {
	cp := &compiledPart{in: sp, claims: won, part: &nft.Part{Owner: ChainName("port", sp.Name)}}
	cp.part.Tag = cp.tag(purpose.ServicePort)
	comment := truncateComment(sp.Name.String())
	lbIPs := model.AddrsOf(sp.LoadBalancerIPs, c.v6)
	clusterIPs := model.AddrsOf(sp.ClusterIPs, c.v6)
	for _, ip := range clusterIPs {
		cp.add(SetClusterIPs, nft.Element{Key: []nft.Value{nft.Addr(ip)}, Tag: cp.tag(purpose.ClusterIP)})
	}
	internal, external, nodePort := won.Internal, won.External, won.NodePort

	cat := model.Categorize(sp, c.endpoints(cp, sp), c.node)
	p := policy{
		svcChain: ChainName(kindService, sp.Name), localChain: ChainName(kindLocal, sp.Name), extChain: ChainName(kindExternal, sp.Name),
		hasInternal: cat.HasAny, hasExternal: cat.HasAny,
	}
	p.internalChain, p.externalChain = p.svcChain, p.svcChain
	if sp.InternalPolicyLocal {
		p.internalChain, p.hasInternal = p.localChain, len(cat.Local) > 0
	}
	if sp.ExternalPolicyLocal {
		p.externalChain, p.hasExternal = p.localChain, len(cat.Local) > 0
	}
	accessible := len(external) > 0 || nodePort != 0

	internalEps := cat.Cluster
	if sp.InternalPolicyLocal {
		internalEps = cat.Local
	}
	flat := c.flat(sp, len(internal), len(external), nodePort, internalEps, cat.Cluster)
	if flatOnly && !flat {
		return nil
	}
	switch {
	case flat:
		c.flatService(cp, sp, p, won, internalEps, cat.Cluster, comment)
	default:
		if len(cat.Cluster) > 0 {
			c.endpointChain(cp, p.svcChain, sp, sp.Name, cat.Cluster, p.internalChain == p.svcChain, internal, comment)
		}
		if sp.UsesLocalEndpoints() && len(cat.Local) > 0 {
			c.endpointChain(cp, p.localChain, sp, localSlotOwner(sp.Name), cat.Local, p.internalChain == p.localChain, internal, comment)
		}
		if cat.HasAny && accessible {
			cp.part.Chains = append(cp.part.Chains, c.externalChain(cp, sp, p))
		}
	}
	c.frontendElements(cp, sp, p, cat.HasAny, flat, internal, external, nodePort, comment)
	// only the load-balancer IPs this port won: another service's source ranges guard
	// the ones it lost
	var wonLB []netip.Addr
	for _, ip := range lbIPs {
		if slices.Contains(external, ip) {
			wonLB = append(wonLB, ip)
		}
	}
	c.firewall(cp, sp, wonLB, comment)
	return cp
}

// policy holds the chains a service port's traffic goes to, and whether each kind of
// traffic has endpoints.
type policy struct {
	svcChain, localChain, extChain string
	internalChain, externalChain   string
	hasInternal, hasExternal       bool
}

// localSlotOwner names the slot range of a service port's local-policy chain ("/" never
// occurs in a port name).
func localSlotOwner(sp model.ServicePortName) model.ServicePortName {
	sp.Port += "/local"
	return sp
}

// frontendElements counts each frontend and, for a chained service port (not flat),
// routes it to its chain; a frontend without endpoints goes to the reject set (no
// endpoints at all) or the drop set (a Local policy without local endpoints), which the
// filter checks look up.
func (c *compiler) frontendElements(cp *compiledPart, sp *model.ServicePort, p policy, hasAny, flat bool, internal, external []netip.Addr, nodePort uint16, comment string) {
	proto, port := nft.Num(uint32(sp.Name.Protocol)), nft.Num(uint32(sp.Port))
	count, dispatch := cp.tag(purpose.Count), cp.tag(purpose.Dispatch)
	// where a frontend without endpoints goes: rejected without any endpoint, dropped
	// when its Local policy has none on this node
	noEndpoints := func(services bool) (string, *purpose.Tag) {
		switch {
		case !hasAny && services:
			return SetNoEndpointServices, cp.tag(purpose.RejectNoEndpoints)
		case !hasAny:
			return SetNoEndpointNodePorts, cp.tag(purpose.RejectNoEndpoints)
		case services:
			return SetNoLocalServices, cp.tag(purpose.DropNoLocalEndpoints)
		}
		return SetNoLocalNodePorts, cp.tag(purpose.DropNoLocalEndpoints)
	}
	for _, ip := range append(internal, external...) {
		cp.add(SetServiceCounters, nft.Element{Key: []nft.Value{nft.Addr(ip), proto, port}, Comment: comment, Tag: count})
	}
	if nodePort != 0 {
		cp.add(SetNodePortCounters, nft.Element{Key: []nft.Value{proto, nft.Num(uint32(nodePort))}, Comment: comment, Tag: count})
	}
	for _, ip := range internal {
		key := []nft.Value{nft.Addr(ip), proto, port}
		switch {
		case !p.hasInternal:
			set, tag := noEndpoints(true)
			cp.add(set, nft.Element{Key: key, Comment: comment, Tag: tag})
		case !flat:
			cp.add(MapServiceIPs, nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: p.internalChain}, Comment: comment, Tag: dispatch})
		}
	}
	for _, ip := range external {
		key := []nft.Value{nft.Addr(ip), proto, port}
		if hasAny && !flat {
			cp.add(MapServiceIPs, nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: p.extChain}, Comment: comment, Tag: dispatch})
		}
		if !p.hasExternal {
			set, tag := noEndpoints(true)
			cp.add(set, nft.Element{Key: key, Comment: comment, Tag: tag})
		}
	}
	if nodePort != 0 {
		key := []nft.Value{proto, nft.Num(uint32(nodePort))}
		if hasAny && !flat {
			cp.add(MapServiceNodePorts, nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: p.extChain}, Comment: comment, Tag: dispatch})
		}
		if !p.hasExternal {
			set, tag := noEndpoints(false)
			cp.add(set, nft.Element{Key: key, Comment: comment, Tag: tag})
		}
	}
}

// externalChain handles traffic to node ports, external and load-balancer IPs. Under
// the Cluster policy it is masqueraded (it may leave the node); under the Local policy
// the client address is kept, except that pods and the node itself short-circuit to
// the cluster-wide endpoints, as if they had gone out to a load balancer and back.
func (c *compiler) externalChain(cp *compiledPart, sp *model.ServicePort, p policy) *nft.Chain {
	jump := func(ch string) nft.Stmt { return nft.Verdict{Kind: nft.Jump, Chain: ch} }
	goTo := func(ch string) nft.Stmt { return nft.Verdict{Kind: nft.Goto, Chain: ch} }
	ch := &nft.Chain{Name: p.extChain}
	if !sp.ExternalPolicyLocal {
		ch.Rules = []nft.Rule{
			{Stmts: []nft.Stmt{jump(ChainMarkMasq)}, Tag: cp.tag(purpose.MarkExternal)},
			{Stmts: []nft.Stmt{goTo(p.svcChain)}, Tag: cp.tag(purpose.ToEndpoints)},
		}
		return ch
	}
	if c.local.ok() {
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{
			c.local.match(true), goTo(p.svcChain),
		}, Comment: "short-circuit pod traffic", Tag: cp.tag(purpose.ShortCircuitPods)})
	}
	ch.Rules = append(ch.Rules,
		nft.Rule{Stmts: []nft.Stmt{nft.MatchFibSaddrLocal{}, jump(ChainMarkMasq)}, Comment: "masquerade local traffic", Tag: cp.tag(purpose.MarkLocalSource)},
		nft.Rule{Stmts: []nft.Stmt{nft.MatchFibSaddrLocal{}, goTo(p.svcChain)}, Comment: "short-circuit local traffic", Tag: cp.tag(purpose.ShortCircuitLocal)},
	)
	if p.hasExternal {
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{goTo(p.localChain)}, Tag: cp.tag(purpose.ToEndpoints)})
	}
	return ch
}

// endpointChain builds a chain that picks one of eps: masquerading off-cluster traffic to
// the cluster IP first when the chain serves internal traffic. owner names its slot range
// (none with session affinity, which picks through endpoint chains).
func (c *compiler) endpointChain(cp *compiledPart, name string, sp *model.ServicePort, owner model.ServicePortName, eps []model.Endpoint, internalEntry bool, clusterIPs []netip.Addr, comment string) {
	ch := &nft.Chain{Name: name}
	if internalEntry {
		for _, ip := range clusterIPs {
			match := []nft.Stmt{nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpEq, Prefix: netip.PrefixFrom(ip, ip.BitLen())}}
			why := purpose.MarkAll
			switch {
			case c.cfg.MasqueradeAll:
			case c.local.ok():
				match = append(match, c.local.match(false))
				why = purpose.MarkOffCluster
			default:
				continue
			}
			ch.Rules = append(ch.Rules, nft.Rule{Stmts: append(match, nft.Verdict{Kind: nft.Jump, Chain: ChainMarkMasq}), Tag: cp.tag(why)})
		}
	}
	c.hairpinElements(cp, eps)
	cp.part.Chains = append(cp.part.Chains, ch)
	proto := nft.MatchL4Proto{Proto: sp.Name.Protocol}
	if sp.AffinityTimeout > 0 {
		c.affinity(cp, ch, sp, eps, comment)
		return
	}
	// slot i serves endpoint pick[i]: each endpoint once (random choice), or a Maglev
	// table of the endpoints (consistent hashing)
	hashed := c.cfg.maglev(sp)
	slots := len(eps)
	var pick []int
	if hashed {
		keys := make([]string, len(eps))
		for i, e := range eps {
			keys[i] = e.AddrPort().String()
		}
		slots = maglev.Size(len(eps))
		pick = maglev.Table(keys, slots)
	}
	base := c.slots.base(owner, slots)
	page := base / PageSlots
	epMap := endpointMapName(page)
	elems := make([]nft.Element, slots)
	vals := make([]nft.Value, 3*slots)
	slotTag := cp.tag(purpose.EndpointSlot)
	for i := range slots {
		e := eps[i%len(eps)]
		if pick != nil {
			e = eps[pick[i]]
		}
		v := vals[3*i : 3*i+3 : 3*i+3]
		v[0], v[1], v[2] = nft.Num(base+uint32(i)), nft.Addr(e.Addr), nft.Num(uint32(e.Port))
		elems[i] = nft.Element{Key: v[0:1:1], Data: v[1:3:3], Tag: slotTag}
	}
	cp.add(epMap, elems...)
	cp.owners = append(cp.owners, owner)
	cp.pages = append(cp.pages, page)
	var dnat nft.Stmt = nft.DNATNumgenMap{Mod: uint32(slots), Offset: base, Map: epMap}
	if hashed {
		dnat = nft.DNATHashMap{Mod: uint32(slots), Seed: maglev.Seed, Offset: base, Map: epMap}
	}
	ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{proto, dnat}, Comment: comment, Tag: cp.tag(purpose.EndpointDNAT)})
}

// affinity makes ch sticky per client address: each endpoint has a dynamic set of the
// clients it served recently; a client found in one goes back to that endpoint, a new
// client draws an endpoint uniformly (numgen draws with probability 1/n, 1/(n-1), …)
// whose chain records it. Only services with affinity pay for these sets.
func (c *compiler) affinity(cp *compiledPart, ch *nft.Chain, sp *model.ServicePort, eps []model.Endpoint, comment string) {
	proto := nft.MatchL4Proto{Proto: sp.Name.Protocol}
	var picks []nft.Rule
	for i, e := range eps {
		epChain := endpointChainName(ch.Name, i)
		set := &nft.Set{
			Name: affinitySetName(epChain), Key: []nft.Datatype{c.addrType()},
			Dynamic: true, Timeout: sp.AffinityTimeout,
			Comment: "ClientIP affinity to " + e.AddrPort().String(),
			Epoch:   e.AddrPort().String(), // clients learned for another endpoint are dropped
		}
		cp.part.Sets = append(cp.part.Sets, set)
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{
			nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: set.Name}, nft.Verdict{Kind: nft.Goto, Chain: epChain},
		}, Tag: cp.tag(purpose.AffinityLookup)})
		pick := []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: epChain}}
		if n := len(eps) - i; n > 1 {
			pick = append([]nft.Stmt{nft.MatchNumgen{Mod: uint32(n)}}, pick...)
		}
		picks = append(picks, nft.Rule{Stmts: pick, Tag: cp.tag(purpose.AffinityPick)})
		cp.part.Chains = append(cp.part.Chains, &nft.Chain{Name: epChain, Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.UpdateSaddr{Set: set.Name}}, Tag: cp.tag(purpose.AffinityRecord)},
			{Stmts: []nft.Stmt{proto, nft.DNATTo{Addr: e.Addr, Port: e.Port}}, Comment: comment, Tag: cp.tag(purpose.EndpointDNAT)},
		}})
	}
	ch.Rules = append(ch.Rules, picks...)
}

// firewall restricts who may use a service's load-balancer IPs (loadBalancerSourceRanges):
// other sources are dropped before DNAT. The admitted sources are one interval set per
// service port, so that a packet costs one lookup (logarithmic in the ranges) however
// many ranges the Service lists; kube-proxy does the same with an anonymous set.
func (c *compiler) firewall(cp *compiledPart, sp *model.ServicePort, lbIPs []netip.Addr, comment string) {
	var ranges []netip.Prefix
	for _, r := range sp.SourceRanges {
		if r.Addr().Is6() != c.v6 {
			continue
		}
		if r.Bits() == 0 {
			return // everyone of this family is allowed
		}
		ranges = append(ranges, r)
	}
	if len(lbIPs) == 0 || (len(ranges) == 0 && !sp.SourceRangesBroken) {
		return // no ranges for this family: no restriction in it, as upstream
	}
	// ranges set but none of them usable in this family, and some entry unparsable: it
	// may have been this family's, so the load balancer is closed (the chain below has
	// no allowing rule), never open to everyone
	name := ChainName(kindFirewall, sp.Name)
	ch := &nft.Chain{Name: name}
	allowNode := false
	for _, r := range ranges {
		for _, n := range c.node.IPs {
			allowNode = allowNode || r.Contains(n)
		}
	}
	if allowNode { // the node reaching a VIP it holds locally uses the VIP as source
		for _, ip := range lbIPs {
			ranges = append(ranges, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	if len(ranges) > 0 {
		set := &nft.Set{Name: name, Key: []nft.Datatype{c.addrType()}, Interval: true,
			Comment: truncateComment(comment + " source ranges")}
		cp.part.Sets = append(cp.part.Sets, set)
		elems := nft.MergeRanges(ranges)
		tag := cp.tag(purpose.SourceRangeAllow)
		for i := range elems {
			elems[i].Tag = tag
		}
		cp.add(set.Name, elems...)
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: set.Name}, nft.Verdict{Kind: nft.Return}}, Tag: cp.tag(purpose.SourceRangeAllow)})
	}
	ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Drop}}, Comment: truncateComment(comment + " source ranges"), Tag: cp.tag(purpose.SourceRangeDrop)})
	cp.part.Chains = append(cp.part.Chains, ch)
	for _, ip := range lbIPs {
		cp.add(MapFirewallIPs, nft.Element{
			Key:     []nft.Value{nft.Addr(ip), nft.Num(uint32(sp.Name.Protocol)), nft.Num(uint32(sp.Port))},
			Verdict: &nft.Verdict{Kind: nft.Goto, Chain: name}, Comment: comment, Tag: cp.tag(purpose.SourceRanges),
		})
	}
}

// endpointMap returns the (empty) endpoints map of a slot page; parts add its elements.
func (c *compiler) endpointMap(page uint32) *nft.Set {
	return &nft.Set{
		Name:    endpointMapName(page),
		Key:     []nft.Datatype{nft.TypeNumgen},
		Data:    []nft.Datatype{c.addrType(), nft.TypeInetService},
		Comment: "endpoint slots: a service's slot base + random index → endpoint",
	}
}

// clusterIPsCheck rejects new connections still addressed to a cluster IP after DNAT (a
// port no service defines) and drops those to unallocated addresses of the service
// CIDRs, which must never be forwarded.
func (c *compiler) clusterIPsCheck() []nft.Rule {
	rules := []nft.Rule{{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: SetClusterIPs}, nft.Reject{}}, Comment: "cluster IP port that no service defines", Tag: purpose.Table(purpose.UndefinedPort)}}
	for _, cidr := range c.serviceCIDRs {
		if cidr.Addr().Is6() == c.v6 {
			rules = append(rules, nft.Rule{Stmts: []nft.Stmt{nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpEq, Prefix: cidr}, nft.Verdict{Kind: nft.Drop}}, Comment: "unallocated service IP", Tag: purpose.Table(purpose.UnallocatedServiceIP)})
		}
	}
	return rules
}

// finish returns the ruleset without parts: the shared sets (endpoint maps for the given
// pages) and the chains that are not any service port's.
func (c *compiler) finish(used map[uint32]bool) *nft.Ruleset {
	mark := c.cfg.masqMark()
	rule := func(p purpose.Purpose, s ...nft.Stmt) nft.Rule { return nft.Rule{Stmts: s, Tag: purpose.Table(p)} }
	jump := func(ch string) nft.Verdict { return nft.Verdict{Kind: nft.Jump, Chain: ch} }
	ctNew := nft.MatchCtStateNew{}

	// node ports never answer on loopback addresses (as kube-proxy): a local process
	// reaching 127.0.0.1:<node port> would otherwise get an endpoint chosen by a
	// Service's owner
	nodePortMatch := []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: SetNodePortIPs}}
	if c.cfg.NodePortAllLocal {
		loopback := netip.MustParsePrefix("127.0.0.0/8")
		if c.v6 {
			loopback = netip.MustParsePrefix("::1/128")
		}
		nodePortMatch = []nft.Stmt{nft.MatchFibDaddrLocal{}, nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpNeq, Prefix: loopback}}
	}
	withNodePort := func(p purpose.Purpose, s ...nft.Stmt) nft.Rule {
		return rule(p, append(slices.Clip(nodePortMatch), s...)...)
	}
	frontend := []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}
	portKey := []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}

	chains := []*nft.Chain{
		{Name: ChainServices, Rules: []nft.Rule{
			rule(purpose.Dispatch, nft.VMap{Fields: frontend, Map: MapServiceIPs}),
			rule(purpose.Frontend, nft.Lookup{Fields: frontend, Set: SetClusterFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainClusterFront}),
			rule(purpose.Frontend, nft.Lookup{Fields: frontend, Set: SetExternalFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainExternalFront}),
			withNodePort(purpose.Dispatch, nft.VMap{Fields: portKey, Map: MapServiceNodePorts}),
			withNodePort(purpose.Frontend, nft.Lookup{Fields: portKey, Set: SetNodePortFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainNodePortFront}),
		}},
		{Name: ChainMarkMasq, Rules: []nft.Rule{rule(purpose.MarkBit, nft.SetMarkBits{Bits: mark})}},
		{Name: ChainMasquerading, Rules: append(append([]nft.Rule{
			rule(purpose.Hairpin, nft.MatchCtStatusDNAT{}, nft.Lookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: SetHairpin}, nft.Masquerade{FullyRandom: true}),
			rule(purpose.Masquerade, nft.MatchMarkUnset{Bits: mark}, nft.Verdict{Kind: nft.Return}),
			rule(purpose.Masquerade, nft.SetMarkBits{Bits: mark, Xor: true}),
		}, c.noMasquerade()...), rule(purpose.Masquerade, c.masquerade()))},
		{Name: ChainEndpointsCheck, Rules: []nft.Rule{
			rule(purpose.RejectNoEndpoints, nft.Lookup{Fields: frontend, Set: SetNoEndpointServices}, nft.Verdict{Kind: nft.Goto, Chain: ChainReject}),
			rule(purpose.DropNoLocalEndpoints, nft.Lookup{Fields: frontend, Set: SetNoLocalServices}, nft.Verdict{Kind: nft.Drop}),
			withNodePort(purpose.RejectNoEndpoints, nft.Lookup{Fields: portKey, Set: SetNoEndpointNodePorts}, nft.Verdict{Kind: nft.Goto, Chain: ChainReject}),
			withNodePort(purpose.DropNoLocalEndpoints, nft.Lookup{Fields: portKey, Set: SetNoLocalNodePorts}, nft.Verdict{Kind: nft.Drop}),
		}},
		{Name: ChainClusterIPsCheck, Rules: c.clusterIPsCheck()},
		{Name: ChainFirewallCheck, Rules: []nft.Rule{rule(purpose.SourceRanges, nft.VMap{Fields: frontend, Map: MapFirewallIPs})}},
		{Name: ChainReject, Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Counter{}, nft.Reject{}}, Comment: "services without endpoints", Tag: purpose.Table(purpose.RejectNoEndpoints)}}},
	}
	chains = append(chains, c.flatChains()...)
	// Every packet sent to a service address or node port updates its element's
	// counters (kernel only; read for the per-service metrics).
	counting := []nft.Rule{
		rule(purpose.Count, nft.Lookup{Fields: frontend, Set: SetServiceCounters}),
		withNodePort(purpose.Count, nft.Lookup{Fields: portKey, Set: SetNodePortCounters}),
	}
	base := func(name string, t nft.ChainType, h nft.HookPoint, prio int32, rules ...nft.Rule) *nft.Chain {
		return &nft.Chain{Name: name, Hook: &nft.Hook{Type: t, Hook: h, Priority: prio}, Rules: rules}
	}
	chains = append(chains,
		// Source ranges are checked before DNAT, on the load-balancer IP.
		base(ChainFilterPreroutingPreDNAT, nft.TypeFilter, nft.Prerouting, -110, append(counting, rule(purpose.Hook, ctNew, jump(ChainFirewallCheck)))...),
		base(ChainFilterOutputPreDNAT, nft.TypeFilter, nft.Output, -110, append(counting, rule(purpose.Hook, ctNew, jump(ChainFirewallCheck)))...),
		// The checks run after DNAT (filter priority 0): a packet that still has a
		// service address as destination was not sent to an endpoint.
		base(ChainFilterInput, nft.TypeFilter, nft.Input, 0, rule(purpose.Hook, ctNew, jump(ChainEndpointsCheck))),
		base(ChainFilterForward, nft.TypeFilter, nft.Forward, 0, rule(purpose.Hook, ctNew, jump(ChainEndpointsCheck)), rule(purpose.Hook, ctNew, jump(ChainClusterIPsCheck))),
		base(ChainFilterOutput, nft.TypeFilter, nft.Output, 0, rule(purpose.Hook, ctNew, jump(ChainEndpointsCheck)), rule(purpose.Hook, ctNew, jump(ChainClusterIPsCheck))),
		base(ChainNATPrerouting, nft.TypeNAT, nft.Prerouting, -100, rule(purpose.Hook, jump(ChainServices))),
		base(ChainNATOutput, nft.TypeNAT, nft.Output, -100, rule(purpose.Hook, jump(ChainServices))),
		base(ChainNATPostrouting, nft.TypeNAT, nft.Postrouting, 100, rule(purpose.Hook, jump(ChainMasquerading))),
	)
	sets := []*nft.Set{c.clusterIPs, c.nodePortIPs, c.serviceIPs, c.serviceNodePorts,
		c.noEndpointServices, c.noLocalServices, c.noEndpointNodePorts, c.noLocalNodePorts,
		c.hairpin, c.firewallIPs, c.serviceCounters, c.nodePortCounters}
	sets = append(sets, c.flatSets()...)
	pages := make([]uint32, 0, len(used))
	for p := range used {
		pages = append(pages, p)
	}
	slices.Sort(pages)
	for _, p := range pages {
		sets = append(sets, c.endpointMap(p))
	}
	flowtables, fastChains := c.fastPath()
	return &nft.Ruleset{Family: c.cfg.Family, Table: TableName, Sets: sets, Chains: append(chains, fastChains...), Flowtables: flowtables}
}

// noMasquerade returns the rules that let traffic to Config.NoMasquerade (this family's
// ranges) leave with its source address: after the mark is cleared, before the
// masquerade.
func (c *compiler) noMasquerade() []nft.Rule {
	var out []nft.Rule
	for _, p := range c.cfg.NoMasquerade {
		if p.Addr().Is6() == c.v6 {
			out = append(out, nft.Rule{Stmts: []nft.Stmt{nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpEq, Prefix: p.Masked()}, nft.Verdict{Kind: nft.Return}},
				Comment: "destination keeps the source address", Tag: purpose.Table(purpose.NoMasquerade)})
		}
	}
	return out
}

// masquerade is the statement that translates marked traffic's source: to the
// interface's address (kube-proxy), or with MasqueradeToNodeIP to the node's primary IP.
func (c *compiler) masquerade() nft.Stmt {
	if c.cfg.MasqueradeToNodeIP {
		for _, ip := range c.node.IPs {
			if ip.Is6() == c.v6 {
				return nft.SNATTo{Addr: ip}
			}
		}
	}
	return nft.Masquerade{FullyRandom: true}
}
