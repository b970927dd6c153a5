// Package compile turns a model snapshot into the nftables ruleset of one address family.
// A Compiler is incremental: it keeps the previous call's parts, claims and counts and
// compiles again only the service ports that changed, and its result is the ruleset a
// fresh compile of the same inputs (the snapshot, the configuration and the endpoint
// slot allocator) would give, which TestCompilerIncremental checks along random
// sequences of changes. docs/architecture.md describes the layout it produces.
package compile

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math"
	"net/netip"
	"slices"
	"unicode/utf8"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/par"
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

// Config holds the flags that shape the ruleset.
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
	// NoExternalIPs is the feature gate AllowServiceExternalIPs=false: no externalIP is
	// programmed at all (load-balancer IPs still are), as kube-proxy.
	NoExternalIPs bool
	// ServedPorts are the TCP ports nftproxy itself serves on this node (the health and
	// metrics servers): an externalIP or load-balancer IP that is one of the node's own
	// addresses never takes them.
	ServedPorts []uint16
	// OwnAddrs are addresses of this node besides Node.IPs and NodePortAddrs that
	// ServedPorts are protected on (the servers' bind addresses).
	OwnAddrs []netip.Addr
	// ClusterCIDRs are the pods' ranges (--cluster-cidr, whatever --detect-local-mode
	// is): no externalIP or load-balancer IP in them is programmed, nor in the node's
	// podCIDRs.
	ClusterCIDRs []netip.Prefix
	// ExternalIPCIDRs, when not empty, are the only ranges externalIPs are programmed
	// in (--external-ip-cidrs); load-balancer IPs are not affected.
	ExternalIPCIDRs []netip.Prefix
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
	// Limits bound what one Service, and the whole table, may cost.
	Limits Limits
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

// Limits bound what one object may make every node program. A zero field is no limit.
// A Service over a limit is set aside (not programmed, reported as a problem); all other
// Services are programmed.
type Limits struct {
	// MaxFrontendsPerService caps a Service's frontends: its ports times its cluster,
	// external and load-balancer IPs, all families counted.
	MaxFrontendsPerService int
	// MaxEndpointsPerServicePort caps the endpoints of any one port of a Service.
	MaxEndpointsPerServicePort int
	// MaxEndpointsPerService caps a Service's endpoints summed over its ports.
	MaxEndpointsPerService int
	// MaxSourceRangesPerService caps a Service's loadBalancerSourceRanges (each is an
	// element of every port's source-range set).
	MaxSourceRangesPerService int
	// MaxElements is the table's element budget, checked against an estimate (see
	// ElementCost) before compiling. Over it the budget is shared between namespaces
	// (budget.go): one within its fair share keeps every Service, and one over it
	// loses its newest.
	MaxElements int

	// defaultMaglev: the compiler's DefaultBalancing is Maglev (set by NewCompiler), so
	// a port without the annotation costs its lookup tables too.
	defaultMaglev bool
}

// cost is ElementCost with the compiler's default balancing.
func (lim Limits) cost(sp *model.ServicePort) int {
	n := ElementCost(sp)
	if lim.defaultMaglev && sp.AffinityTimeout == 0 && sp.Balancing == model.BalancingDefault {
		n += maglevCost(sp)
	}
	return n
}

// Default limits (flags --max-frontends-per-service, --max-endpoints-per-service-port,
// --max-endpoints-per-service, --max-source-ranges-per-service, --max-table-elements).
// docs/security.md gives their
// reasons and costs.
const (
	DefaultMaxFrontendsPerService     = 1000
	DefaultMaxEndpointsPerServicePort = 10000
	DefaultMaxEndpointsPerService     = 100000
	DefaultMaxSourceRangesPerService  = 10000
	DefaultMaxElements                = 2000000
)

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{
		MaxFrontendsPerService:     DefaultMaxFrontendsPerService,
		MaxEndpointsPerServicePort: DefaultMaxEndpointsPerServicePort,
		MaxEndpointsPerService:     DefaultMaxEndpointsPerService,
		MaxSourceRangesPerService:  DefaultMaxSourceRangesPerService,
		MaxElements:                DefaultMaxElements,
	}
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
// per endpoint: per family with endpoints a table of maglevSize entries, two when the
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
			n += chains * (maglevSize(k) - k)
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

func (c Config) masqMark() uint32 { return 1 << c.MasqueradeBit }

// Compile returns the complete ruleset for cfg.Family, and the problems it found:
// conflicts it resolved (two services claiming the same address, protocol and port:
// cluster IPs win, then the older Service; see claims.go), refused addresses, and
// Services set aside by cfg.Limits. slots keeps endpoint slot ranges stable between calls; pass the same allocator
// every time for one family. The ruleset has no parts (see nft.Part): it is what a fresh
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
	// every service's cluster IPs (all families), each with the number of service ports
	// holding it, kept up to date from the difference between calls (services holds
	// the previous call's service ports: snapshots are immutable)
	clusterIPs map[netip.Addr]int
	// endpointAddrs counts the endpoints' addresses of services, in buckets: when an
	// address becomes or stops being a cluster IP, the services with an endpoint there
	// are compiled again, and a bucket at zero says no service has one, without a look
	// at the 300,000 endpoints of 30,000 services (see Compile; 4 MB of buckets there)
	endpointAddrs addrCounts
	services      []*model.ServicePort
	state         []uint8 // services' states
	budget        budget
	// who holds each frontend and node port (claims.go); made anew when the node,
	// its addresses, the service CIDRs or the Services set aside change
	claims       *claimTable
	serviceCIDRs []netip.Prefix
	aside        []serviceName // the previous call's, sorted
	scratch      scratch       // per-call buffers, reused
}

// portChange is a service port that came, went or was replaced since the previous
// call: old is the previous call's (nil: it came) with its state then, new this call's
// (nil: it went) at services[at].
type portChange struct {
	old, new *model.ServicePort
	oldState uint8
	at       int
}

// scratch holds the per-call buffers of Compile. Nothing in them outlives a call: a
// part that is compiled again copies its claims (claims.clone).
type scratch struct {
	matched            []*compiledPart
	state              []uint8 // stateHas, stateAside
	changes            []portChange
	internal, external []netip.Addr // claimed addresses (see claimTable.claimsOf)
}

const (
	stateHas   uint8 = 1 << iota // has a cluster IP in this family
	stateAside                   // set aside by a limit
)

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

// diff walks the previous call's service ports and services in step (both in name
// order) and returns the ports that came, went or were replaced, in name order; a
// replaced port (same name, another pointer) is one change. It sets each port's
// stateHas (a cluster IP in the family) in state: an unchanged port (the previous
// call's pointer) keeps its previous one, for the cost of a pointer comparison.
func (cc *Compiler) diff(services []*model.ServicePort, state []uint8) []portChange {
	v6 := cc.cfg.Family == nft.IPv6
	old, oldState := cc.services, cc.state
	changes := cc.scratch.changes[:0]
	if len(old) == 0 {
		changes = make([]portChange, 0, len(services)) // the first call: all of them
	}
	j := 0
	for i, sp := range services {
		for ; j < len(old) && old[j] != sp && old[j].Name.Less(sp.Name); j++ {
			changes = append(changes, portChange{old: old[j], oldState: oldState[j], at: -1})
		}
		if j < len(old) && old[j] == sp { // unchanged: no name to compare
			state[i] = oldState[j] & stateHas
			j++
			continue
		}
		ch := portChange{new: sp, at: i}
		if j < len(old) && old[j].Name == sp.Name {
			ch.old, ch.oldState = old[j], oldState[j]
			j++
		}
		if slices.ContainsFunc(sp.ClusterIPs, func(ip netip.Addr) bool { return ip.Is6() == v6 }) {
			state[i] = stateHas
		}
		changes = append(changes, ch)
	}
	for ; j < len(old); j++ {
		changes = append(changes, portChange{old: old[j], oldState: oldState[j], at: -1})
	}
	cc.scratch.changes = changes
	return changes
}

// trackAddrs brings the cluster IP counts and the endpoint-address counts up to date
// with the changes since the previous call and returns the addresses that became or
// stopped being a cluster IP. A replaced port whose cluster IPs or endpoints are the
// same slices (the model reuses an unchanged service's) costs a slice comparison.
func (cc *Compiler) trackAddrs(changes []portChange, services []*model.ServicePort) map[netip.Addr]bool {
	if cc.clusterIPs == nil {
		cc.clusterIPs = make(map[netip.Addr]int, len(services))
	}
	var moved map[netip.Addr]bool
	change := func(ips []netip.Addr, d int) {
		for _, ip := range ips {
			n := cc.clusterIPs[ip] + d
			if n <= 0 {
				delete(cc.clusterIPs, ip)
			} else {
				cc.clusterIPs[ip] = n
			}
			if (n == 0 && d < 0) || (n == 1 && d > 0) {
				if moved == nil {
					moved = map[netip.Addr]bool{}
				}
				moved[ip] = true
			}
		}
	}
	eps := &cc.endpointAddrs
	for _, ch := range changes {
		switch {
		case ch.old != nil && ch.new != nil:
			if !same(ch.old.ClusterIPs, ch.new.ClusterIPs) && !slices.Equal(ch.old.ClusterIPs, ch.new.ClusterIPs) {
				change(ch.old.ClusterIPs, -1)
				change(ch.new.ClusterIPs, +1)
			}
			if !same(ch.old.Endpoints, ch.new.Endpoints) {
				eps.add(ch.old.Endpoints, -1)
				eps.add(ch.new.Endpoints, +1)
			}
		case ch.old != nil:
			change(ch.old.ClusterIPs, -1)
			eps.add(ch.old.Endpoints, -1)
		default:
			change(ch.new.ClusterIPs, +1)
			eps.add(ch.new.Endpoints, +1)
		}
	}
	eps.resize(services)
	return moved
}

// addrCounts counts addresses in buckets of saturating counters, at least eight buckets
// per address counted (the table doubles as the count grows). A bucket at zero holds
// none of the addresses; one above zero may (another address shares it, or its counter
// saturated and no longer goes down), which costs a look, never a wrong answer. With
// eight buckets per address, seven lookups in eight of an address not counted find
// zero (with as many buckets as addresses, one in three).
type addrCounts struct {
	seed    maphash.Seed
	buckets []uint8
	n       int  // addresses counted (added minus removed)
	v6      bool // the family counted: a table's parts hold only its family's endpoints
}

const minAddrBuckets = 1 << 12

func (a *addrCounts) bucket(addr netip.Addr) *uint8 {
	if a.buckets == nil {
		a.seed, a.buckets = maphash.MakeSeed(), make([]uint8, minAddrBuckets)
	}
	return &a.buckets[maphash.Comparable(a.seed, addr.As16())&uint64(len(a.buckets)-1)]
}

// add counts the addresses of the endpoints of the family d (+1 or -1) times.
func (a *addrCounts) add(eps []model.Endpoint, d int) {
	n := 0
	for i := range eps {
		if eps[i].Addr.Is6() != a.v6 {
			continue
		}
		n++
		b := a.bucket(eps[i].Addr)
		switch {
		case *b == math.MaxUint8: // saturated: stays
		case d > 0:
			*b++
		case *b > 0:
			*b--
		}
	}
	a.n += d * n
}

// resize makes the table eight buckets per address again, counting services' endpoints
// anew, when the count has outgrown it (or shrunk to a quarter of it).
func (a *addrCounts) resize(services []*model.ServicePort) {
	want := minAddrBuckets
	for want < 8*a.n {
		want *= 2
	}
	if len(a.buckets) == want || (len(a.buckets) > want && len(a.buckets) <= 4*want) {
		return
	}
	a.buckets, a.n = make([]uint8, want), 0
	for _, sp := range services {
		a.add(sp.Endpoints, +1)
	}
}

// anyOf reports whether any of the addresses may be counted.
func (a *addrCounts) anyOf(addrs map[netip.Addr]bool) bool {
	for addr := range addrs {
		if *a.bucket(addr) > 0 {
			return true
		}
	}
	return false
}

// same reports whether a and b are the same slice (equal without a look at the elements).
func same[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// compiledPart is a service port's Part and what it was compiled from.
type compiledPart struct {
	in     *model.ServicePort // the snapshot's: service ports are never modified once built
	claims claims
	part   *nft.Part
	owners []model.ServicePortName // slot ranges it uses
	pages  []uint32                // endpoint map pages it adds elements to
	// problems found compiling it (endpoints skipped), reported on every call
	problems []model.Problem
	tags     []*Tag // one per purpose, shared by its rules and elements
	tagBlock []Tag  // where they are made
	flatMax  int    // the largest endpoint count of its flat frontends
}

// claims are the frontends and node port a service port won.
type claims struct {
	internal, external []netip.Addr
	nodePort           uint16
}

// clone copies the claims out of the per-call buffers claimAll fills.
func (a claims) clone() claims {
	return claims{internal: slices.Clip(slices.Clone(a.internal)), external: slices.Clip(slices.Clone(a.external)), nodePort: a.nodePort}
}

func (a claims) equal(b claims) bool {
	return slices.Equal(a.internal, b.internal) && slices.Equal(a.external, b.external) && a.nodePort == b.nodePort
}

// NewCompiler returns a Compiler for cfg.Family; slots is its endpoint slot allocator.
func NewCompiler(cfg Config, slots *Slots) *Compiler {
	cfg.Limits.defaultMaglev = cfg.DefaultBalancing == model.BalancingMaglev
	return &Compiler{cfg: cfg, slots: slots, endpointAddrs: addrCounts{v6: cfg.Family == nft.IPv6}}
}

// SetAside is the number of Services the last Compile set aside (left out of the
// ruleset) because they exceed cfg.Limits: a limit of their own or the table's element
// budget.
func (cc *Compiler) SetAside() int { return len(cc.aside) }

// Compile returns the ruleset of snap, with one Part per service port, and the conflicts
// it resolved, like the package's Compile.
func (cc *Compiler) Compile(snap *model.Snapshot) (*nft.Ruleset, []model.Problem) {
	prev := cc.parts
	if !sameNode(cc.node, snap.Node) || !slices.Equal(cc.nodePortAddrs, snap.NodePortAddrs) {
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

	sc.state = grow(sc.state, len(services))
	state := sc.state
	changes := cc.diff(services, state)
	moved := cc.trackAddrs(changes, services)
	c.clusterIPSet = cc.clusterIPs
	aside := cc.setAside(c, services, changes, state)

	// the claims: the table follows the changes, unless what decides them all changed
	table := cc.claims
	renew := prev == nil || table == nil || !slices.Equal(cc.serviceCIDRs, snap.ServiceCIDRs) || !slices.Equal(cc.aside, aside)
	if renew {
		table = newClaimTable(bytes.Count(state, []byte{stateHas})) // its claimants
		sc.internal, sc.external = make([]netip.Addr, 0, len(services)), nil
		table.fill(c, services, state, &cc.endpointAddrs)
		cc.claims, cc.serviceCIDRs, cc.aside = table, snap.ServiceCIDRs, aside
	} else {
		table.update(c, changes, state, moved, services, &cc.endpointAddrs)
	}
	c.problems = append(c.problems, table.problems(c)...)
	sc.internal, sc.external = sc.internal[:0], sc.external[:0]

	// endpoints at an address that became or stopped being a cluster IP are compiled again
	if !cc.endpointAddrs.anyOf(moved) {
		moved = nil // no endpoint is at an address that moved: none to look for
	}

	pages := map[uint32]bool{}
	flatMax := 0
	// room for the previous parts and every change (an IPv6 table of an IPv4 cluster has
	// none: 30,000 entries per sync for nothing)
	parts := make([]*nft.Part, 0, min(len(services), len(prev)+len(changes)+16))
	// the array of the call before the previous one: nothing refers to it any more (a
	// new one per call was a fifth of what a sync allocated at 30k)
	next := grow(cc.spare, len(services))[:0]
	flat := c.compileFlat(services, state, prev, table, sc)
	for i := range services {
		sp := services[i]
		cp := matched[i]
		if state[i] != stateHas {
			if cp != nil {
				dropped = append(dropped, cp.owners...)
				changed[cp.part.Owner] = nil
			}
			continue // set aside, or no address in this family
		}
		var w claims
		pre := flat != nil && flat[i] != nil // compiled in advance: a new port (no previous part)
		switch {
		case pre:
			cp = flat[i]
			changed[cp.part.Owner] = cp.part
		case cp != nil && cp.in == sp && !renew && !table.affected[sp]:
			w = cp.claims // nothing it claims changed hands
		default:
			if w = table.claimsOf(c, sp, sc); cp != nil && cp.claims.equal(w) {
				w = cp.claims
			}
		}
		sameInput := cp != nil && (cp.in == sp || (trusted && !snap.Changes.MayDiffer(sp.Name)) || cp.in.Equal(sp))
		if !pre && (!sameInput || !cp.claims.equal(w) || (len(moved) > 0 && endpointsAt(cp.in.Endpoints, moved))) {
			old := cp
			cp = c.servicePort(sp, w.clone(), false)
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
	cc.services, cc.state, sc.state = services, state, cc.state
	if renew {
		// the claimed addresses of every service port: not worth keeping their room for
		// the few a later call claims again (parts hold copies)
		sc.internal, sc.external = nil, nil
	}
	clear(changes) // no old port kept alive
	if cap(changes) > 1024 {
		sc.changes = nil // the first call's, or a large change's: a megabyte at 30k
	}
	clear(matched) // keep no dropped part alive
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

// endpointsAt reports whether any endpoint has one of the addresses.
func endpointsAt(eps []model.Endpoint, addrs map[netip.Addr]bool) bool {
	for i := range eps {
		if addrs[eps[i].Addr] {
			return true
		}
	}
	return false
}

// ownAddr reports whether ip is one of this node's addresses that nftproxy knows.
func (c *compiler) ownAddr(ip netip.Addr) bool {
	return slices.Contains(c.node.IPs, ip) || slices.Contains(c.nodePortAddrs, ip) || slices.Contains(c.cfg.OwnAddrs, ip)
}

func sameNode(a, b model.Node) bool {
	return a.Name == b.Name && a.Zone == b.Zone && slices.Equal(a.IPs, b.IPs) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}

// frontendKey is an address, protocol and port; the address is kept as 16 bytes so that
// the claim map holds no pointer for the collector to scan (one compiler serves one
// family, so an IPv4 address and its IPv4-mapped IPv6 form never meet).
type frontendKey struct {
	addr  [16]byte
	proto uint8
	port  uint16
}

type nodePortKey struct {
	proto uint8
	port  uint16
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
	// every service's cluster IPs, all families (the Compiler's counts)
	clusterIPSet map[netip.Addr]int
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
	keep := func(e *model.Endpoint) bool { return e.Addr.Is6() == c.v6 && c.clusterIPSet[e.Addr] == 0 }
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
// taken in order first (claimsOf uses the scratch).
func (c *compiler) compileFlat(services []*model.ServicePort, state []uint8, prev []*compiledPart, table *claimTable, sc *scratch) []*compiledPart {
	if prev != nil || len(services) < parallelCompileMin {
		return nil
	}
	won := make([]claims, len(services))
	for i, sp := range services {
		if state[i] == stateHas {
			won[i] = table.claimsOf(c, sp, sc).clone()
		}
	}
	out := make([]*compiledPart, len(services))
	par.Each(len(services), 256, func(i int) {
		if state[i] == stateHas {
			out[i] = c.servicePort(services[i], won[i], true)
		}
	})
	return out
}

// servicePort compiles one service port, given the frontends and node port it won. With
// flatOnly it returns nil, having written nothing but its own part, unless the port is
// flat.
func (c *compiler) servicePort(sp *model.ServicePort, won claims, flatOnly bool) *compiledPart {
	cp := &compiledPart{in: sp, claims: won, part: &nft.Part{Owner: ChainName("port", sp.Name)}}
	cp.part.Tag = cp.tag(PurposeServicePort)
	comment := truncateComment(sp.Name.String())
	lbIPs := model.AddrsOf(sp.LoadBalancerIPs, c.v6)
	clusterIPs := model.AddrsOf(sp.ClusterIPs, c.v6)
	for _, ip := range clusterIPs {
		cp.add(SetClusterIPs, nft.Element{Key: []nft.Value{nft.Addr(ip)}, Tag: cp.tag(PurposeClusterIP)})
	}
	internal, external, nodePort := won.internal, won.external, won.nodePort

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
	count, dispatch := cp.tag(PurposeCount), cp.tag(PurposeDispatch)
	// where a frontend without endpoints goes: rejected without any endpoint, dropped
	// when its Local policy has none on this node
	noEndpoints := func(services bool) (string, *Tag) {
		switch {
		case !hasAny && services:
			return SetNoEndpointServices, cp.tag(PurposeRejectNoEndpoints)
		case !hasAny:
			return SetNoEndpointNodePorts, cp.tag(PurposeRejectNoEndpoints)
		case services:
			return SetNoLocalServices, cp.tag(PurposeDropNoLocalEndpoints)
		}
		return SetNoLocalNodePorts, cp.tag(PurposeDropNoLocalEndpoints)
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
			{Stmts: []nft.Stmt{jump(ChainMarkMasq)}, Tag: cp.tag(PurposeMarkExternal)},
			{Stmts: []nft.Stmt{goTo(p.svcChain)}, Tag: cp.tag(PurposeToEndpoints)},
		}
		return ch
	}
	if c.local.ok() {
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{
			c.local.match(true), goTo(p.svcChain),
		}, Comment: "short-circuit pod traffic", Tag: cp.tag(PurposeShortCircuitPods)})
	}
	ch.Rules = append(ch.Rules,
		nft.Rule{Stmts: []nft.Stmt{nft.MatchFibSaddrLocal{}, jump(ChainMarkMasq)}, Comment: "masquerade local traffic", Tag: cp.tag(PurposeMarkLocalSource)},
		nft.Rule{Stmts: []nft.Stmt{nft.MatchFibSaddrLocal{}, goTo(p.svcChain)}, Comment: "short-circuit local traffic", Tag: cp.tag(PurposeShortCircuitLocal)},
	)
	if p.hasExternal {
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{goTo(p.localChain)}, Tag: cp.tag(PurposeToEndpoints)})
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
			purpose := PurposeMarkAll
			switch {
			case c.cfg.MasqueradeAll:
			case c.local.ok():
				match = append(match, c.local.match(false))
				purpose = PurposeMarkOffCluster
			default:
				continue
			}
			ch.Rules = append(ch.Rules, nft.Rule{Stmts: append(match, nft.Verdict{Kind: nft.Jump, Chain: ChainMarkMasq}), Tag: cp.tag(purpose)})
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
	maglev := c.cfg.maglev(sp)
	slots := len(eps)
	var pick []int
	if maglev {
		keys := make([]string, len(eps))
		for i, e := range eps {
			keys[i] = e.AddrPort().String()
		}
		slots = maglevSize(len(eps))
		pick = maglevTable(keys, slots)
	}
	base := c.slots.base(owner, slots)
	page := base / PageSlots
	epMap := endpointMapName(page)
	elems := make([]nft.Element, slots)
	vals := make([]nft.Value, 3*slots)
	slotTag := cp.tag(PurposeEndpointSlot)
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
	if maglev {
		dnat = nft.DNATHashMap{Mod: uint32(slots), Seed: MaglevSeed, Offset: base, Map: epMap}
	}
	ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{proto, dnat}, Comment: comment, Tag: cp.tag(PurposeEndpointDNAT)})
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
		}, Tag: cp.tag(PurposeAffinityLookup)})
		pick := []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: epChain}}
		if n := len(eps) - i; n > 1 {
			pick = append([]nft.Stmt{nft.MatchNumgen{Mod: uint32(n)}}, pick...)
		}
		picks = append(picks, nft.Rule{Stmts: pick, Tag: cp.tag(PurposeAffinityPick)})
		cp.part.Chains = append(cp.part.Chains, &nft.Chain{Name: epChain, Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.UpdateSaddr{Set: set.Name}}, Tag: cp.tag(PurposeAffinityRecord)},
			{Stmts: []nft.Stmt{proto, nft.DNATTo{Addr: e.Addr, Port: e.Port}}, Comment: comment, Tag: cp.tag(PurposeEndpointDNAT)},
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
		tag := cp.tag(PurposeSourceRangeAllow)
		for i := range elems {
			elems[i].Tag = tag
		}
		cp.add(set.Name, elems...)
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: set.Name}, nft.Verdict{Kind: nft.Return}}, Tag: cp.tag(PurposeSourceRangeAllow)})
	}
	ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Drop}}, Comment: truncateComment(comment + " source ranges"), Tag: cp.tag(PurposeSourceRangeDrop)})
	cp.part.Chains = append(cp.part.Chains, ch)
	for _, ip := range lbIPs {
		cp.add(MapFirewallIPs, nft.Element{
			Key:     []nft.Value{nft.Addr(ip), nft.Num(uint32(sp.Name.Protocol)), nft.Num(uint32(sp.Port))},
			Verdict: &nft.Verdict{Kind: nft.Goto, Chain: name}, Comment: comment, Tag: cp.tag(PurposeSourceRanges),
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
	rules := []nft.Rule{{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: SetClusterIPs}, nft.Reject{}}, Comment: "cluster IP port that no service defines", Tag: own(PurposeUndefinedPort)}}
	for _, cidr := range c.serviceCIDRs {
		if cidr.Addr().Is6() == c.v6 {
			rules = append(rules, nft.Rule{Stmts: []nft.Stmt{nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpEq, Prefix: cidr}, nft.Verdict{Kind: nft.Drop}}, Comment: "unallocated service IP", Tag: own(PurposeUnallocatedServiceIP)})
		}
	}
	return rules
}

// finish returns the ruleset without parts: the shared sets (endpoint maps for the given
// pages) and the chains that are not any service port's.
func (c *compiler) finish(used map[uint32]bool) *nft.Ruleset {
	mark := c.cfg.masqMark()
	rule := func(p Purpose, s ...nft.Stmt) nft.Rule { return nft.Rule{Stmts: s, Tag: own(p)} }
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
	withNodePort := func(p Purpose, s ...nft.Stmt) nft.Rule { return rule(p, append(slices.Clip(nodePortMatch), s...)...) }
	frontend := []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}
	portKey := []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}

	chains := []*nft.Chain{
		{Name: ChainServices, Rules: []nft.Rule{
			rule(PurposeDispatch, nft.VMap{Fields: frontend, Map: MapServiceIPs}),
			rule(PurposeFrontend, nft.Lookup{Fields: frontend, Set: SetClusterFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainClusterFront}),
			rule(PurposeFrontend, nft.Lookup{Fields: frontend, Set: SetExternalFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainExternalFront}),
			withNodePort(PurposeDispatch, nft.VMap{Fields: portKey, Map: MapServiceNodePorts}),
			withNodePort(PurposeFrontend, nft.Lookup{Fields: portKey, Set: SetNodePortFrontends}, nft.Verdict{Kind: nft.Goto, Chain: ChainNodePortFront}),
		}},
		{Name: ChainMarkMasq, Rules: []nft.Rule{rule(PurposeMarkBit, nft.SetMarkBits{Bits: mark})}},
		{Name: ChainMasquerading, Rules: append(append([]nft.Rule{
			rule(PurposeHairpin, nft.MatchCtStatusDNAT{}, nft.Lookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: SetHairpin}, nft.Masquerade{FullyRandom: true}),
			rule(PurposeMasquerade, nft.MatchMarkUnset{Bits: mark}, nft.Verdict{Kind: nft.Return}),
			rule(PurposeMasquerade, nft.SetMarkBits{Bits: mark, Xor: true}),
		}, c.noMasquerade()...), rule(PurposeMasquerade, c.masquerade()))},
		{Name: ChainEndpointsCheck, Rules: []nft.Rule{
			rule(PurposeRejectNoEndpoints, nft.Lookup{Fields: frontend, Set: SetNoEndpointServices}, nft.Verdict{Kind: nft.Goto, Chain: ChainReject}),
			rule(PurposeDropNoLocalEndpoints, nft.Lookup{Fields: frontend, Set: SetNoLocalServices}, nft.Verdict{Kind: nft.Drop}),
			withNodePort(PurposeRejectNoEndpoints, nft.Lookup{Fields: portKey, Set: SetNoEndpointNodePorts}, nft.Verdict{Kind: nft.Goto, Chain: ChainReject}),
			withNodePort(PurposeDropNoLocalEndpoints, nft.Lookup{Fields: portKey, Set: SetNoLocalNodePorts}, nft.Verdict{Kind: nft.Drop}),
		}},
		{Name: ChainClusterIPsCheck, Rules: c.clusterIPsCheck()},
		{Name: ChainFirewallCheck, Rules: []nft.Rule{rule(PurposeSourceRanges, nft.VMap{Fields: frontend, Map: MapFirewallIPs})}},
		{Name: ChainReject, Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Counter{}, nft.Reject{}}, Comment: "services without endpoints", Tag: own(PurposeRejectNoEndpoints)}}},
	}
	chains = append(chains, c.flatChains()...)
	// Every packet sent to a service address or node port updates its element's
	// counters (kernel only; read for the per-service metrics).
	counting := []nft.Rule{
		rule(PurposeCount, nft.Lookup{Fields: frontend, Set: SetServiceCounters}),
		withNodePort(PurposeCount, nft.Lookup{Fields: portKey, Set: SetNodePortCounters}),
	}
	base := func(name string, t nft.ChainType, h nft.HookPoint, prio int32, rules ...nft.Rule) *nft.Chain {
		return &nft.Chain{Name: name, Hook: &nft.Hook{Type: t, Hook: h, Priority: prio}, Rules: rules}
	}
	chains = append(chains,
		// Source ranges are checked before DNAT, on the load-balancer IP.
		base(ChainFilterPreroutingPreDNAT, nft.TypeFilter, nft.Prerouting, -110, append(counting, rule(PurposeHook, ctNew, jump(ChainFirewallCheck)))...),
		base(ChainFilterOutputPreDNAT, nft.TypeFilter, nft.Output, -110, append(counting, rule(PurposeHook, ctNew, jump(ChainFirewallCheck)))...),
		// The checks run after DNAT (filter priority 0): a packet that still has a
		// service address as destination was not sent to an endpoint.
		base(ChainFilterInput, nft.TypeFilter, nft.Input, 0, rule(PurposeHook, ctNew, jump(ChainEndpointsCheck))),
		base(ChainFilterForward, nft.TypeFilter, nft.Forward, 0, rule(PurposeHook, ctNew, jump(ChainEndpointsCheck)), rule(PurposeHook, ctNew, jump(ChainClusterIPsCheck))),
		base(ChainFilterOutput, nft.TypeFilter, nft.Output, 0, rule(PurposeHook, ctNew, jump(ChainEndpointsCheck)), rule(PurposeHook, ctNew, jump(ChainClusterIPsCheck))),
		base(ChainNATPrerouting, nft.TypeNAT, nft.Prerouting, -100, rule(PurposeHook, jump(ChainServices))),
		base(ChainNATOutput, nft.TypeNAT, nft.Output, -100, rule(PurposeHook, jump(ChainServices))),
		base(ChainNATPostrouting, nft.TypeNAT, nft.Postrouting, 100, rule(PurposeHook, jump(ChainMasquerading))),
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
				Comment: "destination keeps the source address", Tag: own(PurposeNoMasquerade)})
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
