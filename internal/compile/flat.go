package compile

import (
	"fmt"
	"math/bits"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
)

// The flat path: a service port's frontends are dispatched and load-balanced through
// data alone, so that adding, removing or changing it is set and map elements only — no
// chain, no rule, no verdict-map jump. nf_tables validates the whole table when a
// transaction adds a rule or a jump element, and every commit visits every chain; with
// no chain per service neither grows with the number of services.
//
// A frontend (cluster IP . protocol . port, an external or load-balancer IP the same
// way, or protocol . node port) is an element of cluster-frontends, external-frontends
// or nodeport-frontends, which the services chain looks up. Its endpoints are entries
// "frontend . i → endpoint" of the endpoints (or nodeport-endpoints) map, i = 0..N-1,
// and N is written in binary into the sets endpoint-count-bit0..7: the frontend is in
// set b when bit b of N is 1. A tree of shared chains reads those bits, most significant
// first (lb-0-255 → lb-128-255 or lb-0-127 → …), and its last level holds the rules
// "dnat to <frontend> . numgen random mod N map @endpoints" for N and N+1: as many set
// lookups (the trees' depth, 4 to 8) and one map lookup for every new connection, whatever
// the number of services.
// The trees are as deep as the largest endpoint count of a flat frontend needs, at least
// minTreeBits (2^d - 1 chains each for depth d: 15 by default, 255 at most), and they
// never shrink (Slots.growTree): a count crossing a power of two for the first time adds
// chains, once; nothing else ever changes them.
//
// Service ports the tree cannot express keep a chain of their own (chained, below): session
// affinity, an external Local policy with external frontends or a node port, more than
// maxFlatEndpoints endpoints, or more than maxFlatElements endpoint entries (frontends ×
// endpoints: each frontend has its own copy of the endpoints).

const (
	countBits = 8
	// minTreeBits is the trees' least depth (counts up to 15).
	minTreeBits = 4
	// maxFlatEndpoints is the largest endpoint count the trees express.
	maxFlatEndpoints = 1<<countBits - 1
	// maxFlatElements bounds a flat service port's endpoint entries (frontends ×
	// endpoints); a larger one is chained, whose endpoints are stored once.
	maxFlatElements = 4096

	setEndpointCountBit         = "endpoint-count-bit" // + bit
	setNodePortEndpointCountBit = "nodeport-endpoint-count-bit"
	chainLB                     = "lb" // + "-lo-hi"
	chainNodePortLB             = "nodeport-lb"
)

var (
	frontendFields = []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}
	nodePortFields = []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}
)

// flat reports whether a service port is compiled on the flat path: given the numbers
// of internal and external frontends it won, its node port, and the endpoints its
// internal and external traffic go to.
func (c *compiler) flat(sp *model.ServicePort, internal, external int, nodePort uint16, internalEps, clusterEps []model.Endpoint) bool {
	accessible := external > 0 || nodePort != 0
	if sp.AffinityTimeout > 0 || (sp.ExternalPolicyLocal && accessible) || c.cfg.maglev(sp) {
		return false
	}
	n, fronts := len(internalEps), internal+external
	if accessible {
		n = max(n, len(clusterEps))
	}
	if nodePort != 0 {
		fronts++
	}
	return n <= maxFlatEndpoints && fronts*n <= maxFlatElements
}

// flatService adds the elements of a flat service port: each frontend with endpoints in
// its frontend set, its endpoint count's bits and its endpoint entries.
func (c *compiler) flatService(cp *compiledPart, sp *model.ServicePort, p policy, won admit.Claims, internalEps, clusterEps []model.Endpoint, comment string) {
	proto, port := nft.Num(uint32(sp.Name.Protocol)), nft.Num(uint32(sp.Port))
	c.hairpinElements(cp, internalEps)
	if p.hasInternal && len(internalEps) > 0 {
		for _, ip := range won.Internal {
			c.flatFrontend(cp, SetClusterFrontends, setEndpointCountBit, MapEndpoints, []nft.Value{nft.Addr(ip), proto, port}, internalEps, comment)
		}
	}
	if p.hasExternal && len(clusterEps) > 0 && (len(won.External) > 0 || won.NodePort != 0) {
		for _, ip := range won.External {
			c.flatFrontend(cp, SetExternalFrontends, setEndpointCountBit, MapEndpoints, []nft.Value{nft.Addr(ip), proto, port}, clusterEps, comment)
		}
		if won.NodePort != 0 {
			c.flatFrontend(cp, SetNodePortFrontends, setNodePortEndpointCountBit, MapNodePortEndpoints, []nft.Value{proto, nft.Num(uint32(won.NodePort))}, clusterEps, comment)
		}
		if !same(clusterEps, internalEps) {
			c.hairpinElements(cp, clusterEps)
		}
	}
}

// flatFrontend adds one frontend (key) with endpoints eps: its element of frontSet, the
// bits of len(eps) in the sets bitSet0..7, and its endpoint entries in epMap.
func (c *compiler) flatFrontend(cp *compiledPart, frontSet, bitSet, epMap string, key []nft.Value, eps []model.Endpoint, comment string) {
	key = key[:len(key):len(key)]
	cp.flatMax = max(cp.flatMax, len(eps))
	cp.add(frontSet, nft.Element{Key: key, Comment: comment, Tag: cp.tag(purpose.Frontend)})
	bitTag := cp.tag(purpose.EndpointCount)
	for b := range countBits {
		if len(eps)>>b&1 == 1 {
			cp.add(countBitSetName(bitSet, b), nft.Element{Key: key, Tag: bitTag})
		}
	}
	cp.part.Elements = append(cp.part.Elements, nft.SetElements{Set: epMap,
		Source: &endpointEntries{key: key, eps: eps, tag: cp.tag(purpose.EndpointSlot)}})
}

// hairpinElements adds eps to the hairpin set: a pod reaching itself through a service
// is masqueraded.
func (c *compiler) hairpinElements(cp *compiledPart, eps []model.Endpoint) {
	if len(eps) == 0 {
		return
	}
	cp.part.Elements = append(cp.part.Elements, nft.SetElements{Set: SetHairpin,
		Source: &hairpinEntries{eps: eps, tag: cp.tag(purpose.Hairpin)}})
}

// The endpoint entries and hairpin elements of a flat service port are two elements per
// endpoint: at 30,000 services × 10 endpoints, stored as nft.Elements they took 120 MB,
// a third of the proxy's heap. They are built on demand instead (nft.ElementSource),
// from the endpoints the part keeps anyway (the model's, or Categorize's selection of
// them): the kernel applier builds each when it encodes or compares it.

// endpointEntries are a frontend's endpoint entries "key . i → endpoint i".
type endpointEntries struct {
	key []nft.Value // the frontend
	eps []model.Endpoint
	tag *purpose.Tag
}

func (s *endpointEntries) Len() int { return len(s.eps) }

func (s *endpointEntries) Element(i int, buf *nft.ElementBuf) *nft.Element {
	k := len(s.key)
	v := buf.Vals[:0]
	if k+3 > len(buf.Vals) {
		v = make([]nft.Value, 0, k+3)
	}
	e := &s.eps[i]
	v = append(v, s.key...)
	v = append(v, nft.Num(uint32(i)), nft.Addr(e.Addr), nft.Num(uint32(e.Port)))
	buf.Elem = nft.Element{Key: v[: k+1 : k+1], Data: v[k+1 : k+3 : k+3], Tag: s.tag}
	return &buf.Elem
}

// hairpinEntries are the hairpin set's elements "endpoint . endpoint".
type hairpinEntries struct {
	eps []model.Endpoint
	tag *purpose.Tag
}

func (s *hairpinEntries) Len() int { return len(s.eps) }

func (s *hairpinEntries) Element(i int, buf *nft.ElementBuf) *nft.Element {
	a := nft.Addr(s.eps[i].Addr)
	buf.Vals[0], buf.Vals[1] = a, a
	buf.Elem = nft.Element{Key: buf.Vals[0:2:2], Tag: s.tag}
	return &buf.Elem
}

// flatSets returns the flat path's shared sets, empty: parts add their elements.
func (c *compiler) flatSets() []*nft.Set {
	a := c.addrType()
	frontend := []nft.Datatype{a, nft.TypeInetProto, nft.TypeInetService}
	port := []nft.Datatype{nft.TypeInetProto, nft.TypeInetService}
	target := []nft.Datatype{a, nft.TypeInetService}
	sets := []*nft.Set{
		{Name: SetClusterFrontends, Key: frontend, Comment: "cluster IPs with endpoints, load-balanced by the lb chains"},
		{Name: SetExternalFrontends, Key: frontend, Comment: "external and load-balancer IPs with endpoints, load-balanced by the lb chains"},
		{Name: SetNodePortFrontends, Key: port, Comment: "node ports with endpoints, load-balanced by the nodeport-lb chains"},
		{Name: MapEndpoints, Key: append(frontend, nft.TypeNumgen), Data: target, Comment: "frontend . index → endpoint"},
		{Name: MapNodePortEndpoints, Key: append(port, nft.TypeNumgen), Data: target, Comment: "node port . index → endpoint"},
	}
	for _, k := range []struct {
		prefix, what string
		key          []nft.Datatype
	}{{setEndpointCountBit, "frontends", frontend}, {setNodePortEndpointCountBit, "node ports", port}} {
		for b := range c.treeBits {
			sets = append(sets, &nft.Set{Name: countBitSetName(k.prefix, b), Key: k.key,
				Comment: fmt.Sprintf("%s whose endpoint count has bit %d set", k.what, b)})
		}
	}
	return sets
}

// flatChains returns the flat path's shared chains: the frontend chains (masquerade
// marking) and the two trees that pick an endpoint.
func (c *compiler) flatChains() []*nft.Chain {
	rule := func(p purpose.Purpose, s ...nft.Stmt) nft.Rule { return nft.Rule{Stmts: s, Tag: purpose.Table(p)} }
	jump := func(ch string) nft.Stmt { return nft.Verdict{Kind: nft.Jump, Chain: ch} }
	goTo := func(ch string) nft.Stmt { return nft.Verdict{Kind: nft.Goto, Chain: ch} }
	root := treeNode(chainLB, 0, 1<<c.treeBits)
	npRoot := treeNode(chainNodePortLB, 0, 1<<c.treeBits)
	cluster := &nft.Chain{Name: ChainClusterFront}
	switch {
	case c.cfg.MasqueradeAll:
		cluster.Rules = append(cluster.Rules, rule(purpose.MarkAll, jump(ChainMarkMasq)))
	case c.local.ok():
		cluster.Rules = append(cluster.Rules, rule(purpose.MarkOffCluster, c.local.match(false), jump(ChainMarkMasq)))
	}
	cluster.Rules = append(cluster.Rules, rule(purpose.ToEndpoints, goTo(root)))
	chains := []*nft.Chain{
		cluster,
		{Name: ChainExternalFront, Rules: []nft.Rule{rule(purpose.MarkExternal, jump(ChainMarkMasq)), rule(purpose.ToEndpoints, goTo(root))}},
		{Name: ChainNodePortFront, Rules: []nft.Rule{rule(purpose.MarkExternal, jump(ChainMarkMasq)), rule(purpose.ToEndpoints, goTo(npRoot))}},
	}
	chains = appendTree(chains, c.treeBits, chainLB, setEndpointCountBit, MapEndpoints, frontendFields)
	return appendTree(chains, c.treeBits, chainNodePortLB, setNodePortEndpointCountBit, MapNodePortEndpoints, nodePortFields)
}

// appendTree appends the chains that pick an endpoint for a key whose endpoint count is
// in the sets bitSet0..depth-1: node lo-hi covers the counts lo..hi; it goes to its upper half
// when the next bit is set, else to its lower half, and a node of two counts N, N+1
// translates with "numgen random mod N+1" or "mod N".
func appendTree(chains []*nft.Chain, depth int, prefix, bitSet, epMap string, key []nft.Field) []*nft.Chain {
	var node func(lo, size uint32) string
	node = func(lo, size uint32) string {
		ch := &nft.Chain{Name: treeNode(prefix, lo, size)}
		chains = append(chains, ch)
		half := size / 2
		bit := nft.Lookup{Fields: key, Set: countBitSetName(bitSet, bits.TrailingZeros32(half))}
		dnat := func(n uint32) nft.Rule {
			return nft.Rule{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: key, Mod: n, Map: epMap}}, Tag: purpose.Table(purpose.EndpointDNAT)}
		}
		if half == 1 {
			ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{bit, nft.DNATKeyMap{Fields: key, Mod: lo + 1, Map: epMap}}, Tag: purpose.Table(purpose.EndpointDNAT)})
			if lo > 0 {
				ch.Rules = append(ch.Rules, dnat(lo))
			}
			return ch.Name
		}
		upper := node(lo+half, half)
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{bit, nft.Verdict{Kind: nft.Goto, Chain: upper}}, Tag: purpose.Table(purpose.EndpointCount)})
		lower := node(lo, half)
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: lower}}, Tag: purpose.Table(purpose.EndpointCount)})
		return ch.Name
	}
	node(0, 1<<depth)
	return chains
}

// growTree returns the depth of the endpoint-count trees once they express counts up to
// n, and keeps it.
func (s *Slots) growTree(n int) int {
	s.treeBits = max(s.treeBits, minTreeBits, bits.Len(uint(n)))
	return s.treeBits
}

// same reports whether a and b are the same slice (equal without a look at the elements).
func same[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
