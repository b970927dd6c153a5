// Package compile turns a model snapshot into the nftables ruleset of one address family.
// It is a pure function of its inputs (the snapshot, the configuration and the endpoint
// slot allocator); docs/architecture.md describes the layout it produces.
package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// TableName is the name of nftproxy's table in each family.
const TableName = "nftproxy"

// Object names in the table.
const (
	setClusterIPs          = "cluster-ips"
	setNodePortIPs         = "nodeport-ips"
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapEndpointsPrefix     = "endpoints-" // + page number
	setHairpin             = "hairpin"

	chainServices        = "services"
	chainMarkMasq        = "mark-for-masquerade"
	chainMasquerading    = "masquerading"
	chainEndpointsCheck  = "service-endpoints-check"
	chainClusterIPsCheck = "cluster-ips-check"
	chainReject          = "reject-chain"
)

// Config holds the flags that shape the ruleset.
type Config struct {
	Family nft.Family
	// ClusterCIDR is the pod network of this family ("--cluster-cidr"); traffic from
	// outside it to a cluster IP is masqueraded. Invalid (zero) means unknown.
	ClusterCIDR   netip.Prefix
	MasqueradeAll bool
	MasqueradeBit uint32 // mark bit index, kube-proxy's default is 14
	// NodePortAddrs are the local addresses node ports answer on. When NodePortAllLocal
	// is set, node ports answer on every local address instead ("fib daddr type local").
	NodePortAddrs    []netip.Addr
	NodePortAllLocal bool
}

func (c Config) masqMark() uint32 { return 1 << c.MasqueradeBit }

// Compile returns the complete ruleset for cfg.Family, and the conflicts it resolved (two
// services claiming the same address, protocol and port: the first in name order keeps
// it). slots keeps endpoint slot ranges stable between calls; pass the same allocator
// every time for one family.
func Compile(snap *model.Snapshot, cfg Config, slots *Slots) (*nft.Ruleset, []model.Problem) {
	c := &compiler{
		cfg: cfg, slots: slots, v6: cfg.Family == nft.IPv6,
		frontends: map[frontendKey]model.ServicePortName{},
		nodePorts: map[nodePortKey]model.ServicePortName{},
		clusterIP: map[netip.Addr]bool{},
		hairpinIP: map[netip.Addr]bool{},
	}
	c.init()
	live := map[model.ServicePortName]bool{}
	for i := range snap.Services {
		if c.servicePort(&snap.Services[i]) {
			live[snap.Services[i].Name] = true
		}
	}
	slots.retain(live)
	return c.finish(), c.problems
}

type frontendKey struct {
	addr  netip.Addr
	proto uint8
	port  uint16
}

type nodePortKey struct {
	proto uint8
	port  uint16
}

type compiler struct {
	cfg   Config
	slots *Slots
	v6    bool

	clusterIPs, nodePortIPs, serviceIPs, serviceNodePorts *nft.Set
	noEndpointServices, noEndpointNodePorts               *nft.Set
	hairpin                                               *nft.Set
	endpointMaps                                          map[uint32]*nft.Set // by page
	serviceChains                                         []*nft.Chain

	// keys already used, so that conflicting input never produces a duplicate element
	frontends            map[frontendKey]model.ServicePortName
	nodePorts            map[nodePortKey]model.ServicePortName
	clusterIP, hairpinIP map[netip.Addr]bool
	problems             []model.Problem
}

// claimFrontend reserves addr:port/proto for sp; false (and a problem) if another service
// port has it.
func (c *compiler) claimFrontend(sp model.ServicePortName, addr netip.Addr, port uint16) bool {
	k := frontendKey{addr, sp.Protocol, port}
	if owner, taken := c.frontends[k]; taken {
		if owner != sp { // a service listing one address twice is not a conflict
			c.conflict(sp, "%s %s:%d is already used by %s", model.ProtoString(sp.Protocol), addr, port, owner)
		}
		return false
	}
	c.frontends[k] = sp
	return true
}

func (c *compiler) claimNodePort(sp model.ServicePortName, port uint16) bool {
	k := nodePortKey{sp.Protocol, port}
	if owner, taken := c.nodePorts[k]; taken {
		c.conflict(sp, "node port %s %d is already used by %s", model.ProtoString(sp.Protocol), port, owner)
		return false
	}
	c.nodePorts[k] = sp
	return true
}

func (c *compiler) conflict(sp model.ServicePortName, format string, args ...any) {
	c.problems = append(c.problems, model.Problem{Kind: "Service", Namespace: sp.Namespace, Name: sp.Name,
		Reason: fmt.Sprintf("port %q: ", sp.Port) + fmt.Sprintf(format, args...) + ", ignored"})
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
	c.clusterIPs = &nft.Set{Name: setClusterIPs, Key: []nft.Datatype{a}, Comment: "cluster IPs of all services"}
	c.nodePortIPs = &nft.Set{Name: setNodePortIPs, Key: []nft.Datatype{a}, Comment: "addresses node ports answer on"}
	c.serviceIPs = &nft.Set{Name: mapServiceIPs, Key: frontend, Data: verdict, Comment: "cluster, external and load-balancer IPs with endpoints"}
	c.serviceNodePorts = &nft.Set{Name: mapServiceNodePorts, Key: port, Data: verdict, Comment: "node ports with endpoints"}
	c.noEndpointServices = &nft.Set{Name: mapNoEndpointServices, Key: frontend, Data: verdict, Comment: "service IPs without endpoints: rejected"}
	c.noEndpointNodePorts = &nft.Set{Name: mapNoEndpointNodePorts, Key: port, Data: verdict, Comment: "node ports without endpoints: rejected"}
	c.endpointMaps = map[uint32]*nft.Set{}
	c.hairpin = &nft.Set{Name: setHairpin, Key: []nft.Datatype{a, a}, Comment: "endpoint . endpoint: hairpin traffic to masquerade"}
	for _, ip := range c.cfg.NodePortAddrs {
		if ip.Is6() == c.v6 {
			c.nodePortIPs.Elements = append(c.nodePortIPs.Elements, nft.Element{Key: []nft.Value{nft.Addr(ip)}})
		}
	}
}

// ChainName returns the name of a service port's chain; kind is "svc" or "ext".
func ChainName(kind string, sp model.ServicePortName) string {
	port := sp.Port
	if port == "" {
		port = "-"
	}
	return kind + "-" + sp.Namespace + "/" + sp.Name + "/" + strings.ToLower(model.ProtoString(sp.Protocol)) + "/" + port
}

// servicePort compiles one service port; it reports whether the port has endpoint slots.
func (c *compiler) servicePort(sp *model.ServicePort) bool {
	clusterIPs := model.AddrsOf(sp.ClusterIPs, c.v6)
	if len(clusterIPs) == 0 {
		return false // the service has no address in this family
	}
	comment := sp.Name.String()
	externals := append(model.AddrsOf(sp.ExternalIPs, c.v6), model.AddrsOf(sp.LoadBalancerIPs, c.v6)...)
	for _, ip := range clusterIPs {
		if !c.clusterIP[ip] {
			c.clusterIP[ip] = true
			c.clusterIPs.Elements = append(c.clusterIPs.Elements, nft.Element{Key: []nft.Value{nft.Addr(ip)}})
		}
	}
	// Frontends this service port may use; conflicting ones are dropped and reported.
	var frontIPs []netip.Addr
	hasExternal := false
	for _, ip := range append(clusterIPs, externals...) {
		if c.claimFrontend(sp.Name, ip, sp.Port) {
			frontIPs = append(frontIPs, ip)
			hasExternal = hasExternal || !isClusterIP(ip, clusterIPs)
		}
	}
	nodePort := sp.NodePort
	if nodePort != 0 && !c.claimNodePort(sp.Name, nodePort) {
		nodePort = 0
	}
	var eps []model.Endpoint
	for _, e := range model.UsableEndpoints(sp.Endpoints) {
		if e.Addr.Is6() == c.v6 {
			eps = append(eps, e)
		}
	}
	proto := nft.Num(uint32(sp.Name.Protocol))
	port := nft.Num(uint32(sp.Port))
	if len(eps) == 0 {
		reject := &nft.Verdict{Kind: nft.Goto, Chain: chainReject}
		for _, ip := range frontIPs {
			c.noEndpointServices.Elements = append(c.noEndpointServices.Elements, nft.Element{Key: []nft.Value{nft.Addr(ip), proto, port}, Verdict: reject, Comment: comment})
		}
		if nodePort != 0 {
			c.noEndpointNodePorts.Elements = append(c.noEndpointNodePorts.Elements, nft.Element{Key: []nft.Value{proto, nft.Num(uint32(nodePort))}, Verdict: reject, Comment: comment})
		}
		return false
	}

	svcChain := ChainName("svc", sp.Name)
	c.serviceChains = append(c.serviceChains, c.serviceChain(svcChain, sp, eps, comment))
	var extChain string
	if hasExternal || nodePort != 0 {
		extChain = ChainName("ext", sp.Name)
		// External traffic (externalTrafficPolicy: Cluster) is always masqueraded, so
		// that replies come back through this node.
		c.serviceChains = append(c.serviceChains, &nft.Chain{Name: extChain, Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: chainMarkMasq}}},
			{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: svcChain}}},
		}})
		if nodePort != 0 {
			c.serviceNodePorts.Elements = append(c.serviceNodePorts.Elements, nft.Element{Key: []nft.Value{proto, nft.Num(uint32(nodePort))}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: extChain}, Comment: comment})
		}
	}
	for _, ip := range frontIPs {
		target := svcChain
		if !isClusterIP(ip, clusterIPs) {
			target = extChain
		}
		c.serviceIPs.Elements = append(c.serviceIPs.Elements, nft.Element{Key: []nft.Value{nft.Addr(ip), proto, port}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: target}, Comment: comment})
	}
	return true
}

// serviceChain masquerades what must be, then DNATs to a uniformly random endpoint slot.
func (c *compiler) serviceChain(name string, sp *model.ServicePort, eps []model.Endpoint, comment string) *nft.Chain {
	ch := &nft.Chain{Name: name}
	switch {
	case c.cfg.MasqueradeAll:
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: chainMarkMasq}}})
	case c.cfg.ClusterCIDR.IsValid():
		ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{
			nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: c.cfg.ClusterCIDR},
			nft.Verdict{Kind: nft.Jump, Chain: chainMarkMasq},
		}})
	}
	base := c.slots.base(sp.Name, len(eps))
	epMap := c.endpointMap(base / PageSlots)
	for i, e := range eps {
		epMap.Elements = append(epMap.Elements, nft.Element{
			Key:  []nft.Value{nft.Num(base + uint32(i))},
			Data: []nft.Value{nft.Addr(e.Addr), nft.Num(uint32(e.Port))},
		})
		if !c.hairpinIP[e.Addr] {
			c.hairpinIP[e.Addr] = true
			c.hairpin.Elements = append(c.hairpin.Elements, nft.Element{Key: []nft.Value{nft.Addr(e.Addr), nft.Addr(e.Addr)}})
		}
	}
	ch.Rules = append(ch.Rules, nft.Rule{Stmts: []nft.Stmt{
		nft.MatchL4Proto{Proto: sp.Name.Protocol},
		nft.DNATNumgenMap{Mod: uint32(len(eps)), Offset: base, Map: epMap.Name},
	}, Comment: comment})
	return ch
}

// endpointMap returns the endpoints map of a slot page.
func (c *compiler) endpointMap(page uint32) *nft.Set {
	m := c.endpointMaps[page]
	if m == nil {
		m = &nft.Set{
			Name:    fmt.Sprintf("%s%d", mapEndpointsPrefix, page),
			Key:     []nft.Datatype{nft.TypeNumgen},
			Data:    []nft.Datatype{c.addrType(), nft.TypeInetService},
			Comment: "endpoint slots: a service's slot base + random index → endpoint",
		}
		c.endpointMaps[page] = m
	}
	return m
}

func isClusterIP(ip netip.Addr, clusterIPs []netip.Addr) bool {
	for _, c := range clusterIPs {
		if c == ip {
			return true
		}
	}
	return false
}

func (c *compiler) finish() *nft.Ruleset {
	mark := c.cfg.masqMark()
	rule := func(s ...nft.Stmt) nft.Rule { return nft.Rule{Stmts: s} }
	jump := func(ch string) nft.Verdict { return nft.Verdict{Kind: nft.Jump, Chain: ch} }
	ctNew := nft.MatchCtStateNew{}

	nodePortMatch := nft.Stmt(nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: setNodePortIPs})
	if c.cfg.NodePortAllLocal {
		nodePortMatch = nft.MatchFibDaddrLocal{}
	}
	frontend := []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}
	portKey := []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}

	chains := []*nft.Chain{
		{Name: chainServices, Rules: []nft.Rule{
			rule(nft.VMap{Fields: frontend, Map: mapServiceIPs}),
			rule(nodePortMatch, nft.VMap{Fields: portKey, Map: mapServiceNodePorts}),
		}},
		{Name: chainMarkMasq, Rules: []nft.Rule{rule(nft.SetMarkBits{Bits: mark})}},
		{Name: chainMasquerading, Rules: []nft.Rule{
			rule(nft.MatchCtStatusDNAT{}, nft.Lookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: setHairpin}, nft.Masquerade{FullyRandom: true}),
			rule(nft.MatchMarkUnset{Bits: mark}, nft.Verdict{Kind: nft.Return}),
			rule(nft.SetMarkBits{Bits: mark, Xor: true}),
			rule(nft.Masquerade{FullyRandom: true}),
		}},
		{Name: chainEndpointsCheck, Rules: []nft.Rule{
			rule(nft.VMap{Fields: frontend, Map: mapNoEndpointServices}),
			rule(nodePortMatch, nft.VMap{Fields: portKey, Map: mapNoEndpointNodePorts}),
		}},
		{Name: chainClusterIPsCheck, Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: setClusterIPs}, nft.Reject{}}, Comment: "cluster IP port that no service defines"},
		}},
		{Name: chainReject, Rules: []nft.Rule{rule(nft.Reject{})}},
	}
	chains = append(chains, c.serviceChains...)
	base := func(name string, t nft.ChainType, h nft.HookPoint, prio int32, rules ...nft.Rule) *nft.Chain {
		return &nft.Chain{Name: name, Hook: &nft.Hook{Type: t, Hook: h, Priority: prio}, Rules: rules}
	}
	chains = append(chains,
		// The checks run after DNAT (filter priority 0): a packet that still has a
		// service address as destination was not sent to an endpoint.
		base("filter-input", nft.TypeFilter, nft.Input, 0, rule(ctNew, jump(chainEndpointsCheck))),
		base("filter-forward", nft.TypeFilter, nft.Forward, 0, rule(ctNew, jump(chainEndpointsCheck)), rule(ctNew, jump(chainClusterIPsCheck))),
		base("filter-output", nft.TypeFilter, nft.Output, 0, rule(ctNew, jump(chainEndpointsCheck)), rule(ctNew, jump(chainClusterIPsCheck))),
		base("nat-prerouting", nft.TypeNAT, nft.Prerouting, -100, rule(jump(chainServices))),
		base("nat-output", nft.TypeNAT, nft.Output, -100, rule(jump(chainServices))),
		base("nat-postrouting", nft.TypeNAT, nft.Postrouting, 100, rule(jump(chainMasquerading))),
	)
	sets := []*nft.Set{c.clusterIPs, c.nodePortIPs, c.serviceIPs, c.serviceNodePorts,
		c.noEndpointServices, c.noEndpointNodePorts, c.hairpin}
	pages := make([]uint32, 0, len(c.endpointMaps))
	for p := range c.endpointMaps {
		pages = append(pages, p)
	}
	slices.Sort(pages)
	for _, p := range pages {
		sets = append(sets, c.endpointMaps[p])
	}
	return &nft.Ruleset{Family: c.cfg.Family, Table: TableName, Sets: sets, Chains: chains}
}
