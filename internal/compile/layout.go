package compile

import (
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/internal/model"
)

// The table's layout: every chain, set and map the compiler writes, by role, and the
// names of those it writes per service port, endpoint, slot page, count bit and tree
// node. Programs that read a table back (nftproxy list, verify) find its objects here,
// never by spelling a name: TestLayoutDescribesEveryObject holds the layout to what the
// compiler emits.

// ObjectKind is what kind of nftables object an object is.
type ObjectKind uint8

const (
	KindChain     ObjectKind = iota + 1 // a regular chain, entered by jump or goto
	KindBaseChain                       // a chain on a netfilter hook
	KindSet                             // a set: keys only
	KindMap                             // a map: keys with values or verdicts
)

func (k ObjectKind) String() string {
	switch k {
	case KindChain:
		return "chain"
	case KindBaseChain:
		return "base chain"
	case KindSet:
		return "set"
	case KindMap:
		return "map"
	}
	return "kind " + strconv.Itoa(int(k))
}

// Role is which of the table's objects (or families of objects) one is.
type Role uint8

// Roles. The table's own objects come first, then those of a service port's part.
const (
	RoleNone Role = iota

	RoleClusterIPs               // set SetClusterIPs
	RoleNodePortIPs              // set SetNodePortIPs
	RoleServiceIPs               // map MapServiceIPs
	RoleServiceNodePorts         // map MapServiceNodePorts
	RoleNoEndpointServices       // set SetNoEndpointServices
	RoleNoEndpointNodePorts      // set SetNoEndpointNodePorts
	RoleNoLocalServices          // set SetNoLocalServices
	RoleNoLocalNodePorts         // set SetNoLocalNodePorts
	RoleClusterFrontends         // set SetClusterFrontends
	RoleExternalFrontends        // set SetExternalFrontends
	RoleNodePortFrontends        // set SetNodePortFrontends
	RoleFlatEndpoints            // map MapEndpoints
	RoleFlatNodePortEndpoints    // map MapNodePortEndpoints
	RoleEndpointCountBit         // sets, one per bit (Object.Index)
	RoleNodePortEndpointCountBit // sets, one per bit (Object.Index)
	RoleEndpointSlots            // maps, one per slot page (Object.Index)
	RoleHairpin                  // set SetHairpin
	RoleFirewallIPs              // map MapFirewallIPs
	RoleServiceCounters          // set SetServiceCounters
	RoleNodePortCounters         // set SetNodePortCounters

	RoleServices         // chain ChainServices
	RoleMarkMasq         // chain ChainMarkMasq
	RoleMasquerading     // chain ChainMasquerading
	RoleEndpointsCheck   // chain ChainEndpointsCheck
	RoleClusterIPsCheck  // chain ChainClusterIPsCheck
	RoleReject           // chain ChainReject
	RoleFirewallCheck    // chain ChainFirewallCheck
	RoleClusterFrontend  // chain ChainClusterFront
	RoleExternalFrontend // chain ChainExternalFront
	RoleNodePortFrontend // chain ChainNodePortFront
	RoleLBTree           // chains, one per tree node (Object.Index, Object.Last)
	RoleNodePortLBTree   // chains, one per tree node (Object.Index, Object.Last)
	RoleHook             // the base chains

	RoleServiceChain     // a service port's chain
	RoleLocalChain       // a service port's chain of its endpoints on this node
	RoleExternalChain    // a service port's chain for external traffic
	RoleEndpointChain    // an endpoint's chain under session affinity (Object.Index)
	RoleAffinity         // an endpoint's set of recent clients (Object.Index)
	RoleSourceRangeChain // a service port's source-range check
	RoleSourceRanges     // a service port's set of admitted sources
	roleEnd
)

// Description describes a role: its objects' kind, name and purpose.
type Description struct {
	Role Role
	Kind ObjectKind
	// Name is the object's name, or for a role of several objects the pattern of
	// their names.
	Name string
	// PerServicePort is set for objects of a service port's part; the others are the
	// table's own.
	PerServicePort bool
	Purpose        string
}

var layout = [roleEnd]Description{
	RoleClusterIPs:               {Kind: KindSet, Name: SetClusterIPs, Purpose: "every service's cluster IPs"},
	RoleNodePortIPs:              {Kind: KindSet, Name: SetNodePortIPs, Purpose: "the addresses node ports answer on"},
	RoleServiceIPs:               {Kind: KindMap, Name: MapServiceIPs, Purpose: "frontends of chained service ports → their chains"},
	RoleServiceNodePorts:         {Kind: KindMap, Name: MapServiceNodePorts, Purpose: "node ports of chained service ports → their chains"},
	RoleNoEndpointServices:       {Kind: KindSet, Name: SetNoEndpointServices, Purpose: "frontends without endpoints: rejected"},
	RoleNoEndpointNodePorts:      {Kind: KindSet, Name: SetNoEndpointNodePorts, Purpose: "node ports without endpoints: rejected"},
	RoleNoLocalServices:          {Kind: KindSet, Name: SetNoLocalServices, Purpose: "frontends whose Local policy has no endpoint on this node: dropped"},
	RoleNoLocalNodePorts:         {Kind: KindSet, Name: SetNoLocalNodePorts, Purpose: "node ports whose Local policy has no endpoint on this node: dropped"},
	RoleClusterFrontends:         {Kind: KindSet, Name: SetClusterFrontends, Purpose: "the flat path's cluster IP frontends"},
	RoleExternalFrontends:        {Kind: KindSet, Name: SetExternalFrontends, Purpose: "the flat path's external and load-balancer IP frontends"},
	RoleNodePortFrontends:        {Kind: KindSet, Name: SetNodePortFrontends, Purpose: "the flat path's node ports"},
	RoleFlatEndpoints:            {Kind: KindMap, Name: MapEndpoints, Purpose: "the flat path's frontend . index → endpoint"},
	RoleFlatNodePortEndpoints:    {Kind: KindMap, Name: MapNodePortEndpoints, Purpose: "the flat path's node port . index → endpoint"},
	RoleEndpointCountBit:         {Kind: KindSet, Name: setEndpointCountBit + "<bit>", Purpose: "flat frontends whose endpoint count has the bit set"},
	RoleNodePortEndpointCountBit: {Kind: KindSet, Name: setNodePortEndpointCountBit + "<bit>", Purpose: "flat node ports whose endpoint count has the bit set"},
	RoleEndpointSlots:            {Kind: KindMap, Name: mapEndpointsPrefix + "<page>", Purpose: "endpoint slots of chained service ports: slot → endpoint"},
	RoleHairpin:                  {Kind: KindSet, Name: SetHairpin, Purpose: "endpoint . endpoint: hairpin traffic to masquerade"},
	RoleFirewallIPs:              {Kind: KindMap, Name: MapFirewallIPs, Purpose: "load-balancer IPs with source ranges → their source-range chains"},
	RoleServiceCounters:          {Kind: KindSet, Name: SetServiceCounters, Purpose: "packets and bytes per service address"},
	RoleNodePortCounters:         {Kind: KindSet, Name: SetNodePortCounters, Purpose: "packets and bytes per node port"},

	RoleServices:         {Kind: KindChain, Name: ChainServices, Purpose: "dispatch of new connections to the frontends"},
	RoleMarkMasq:         {Kind: KindChain, Name: ChainMarkMasq, Purpose: "marks a packet for masquerading"},
	RoleMasquerading:     {Kind: KindChain, Name: ChainMasquerading, Purpose: "masquerades marked and hairpin packets"},
	RoleEndpointsCheck:   {Kind: KindChain, Name: ChainEndpointsCheck, Purpose: "rejects or drops frontends without (local) endpoints"},
	RoleClusterIPsCheck:  {Kind: KindChain, Name: ChainClusterIPsCheck, Purpose: "rejects undefined cluster IP ports, drops unallocated service addresses"},
	RoleReject:           {Kind: KindChain, Name: ChainReject, Purpose: "rejects, and counts, traffic to services without endpoints"},
	RoleFirewallCheck:    {Kind: KindChain, Name: ChainFirewallCheck, Purpose: "sends load-balancer IPs with source ranges to their checks"},
	RoleClusterFrontend:  {Kind: KindChain, Name: ChainClusterFront, Purpose: "the flat path's cluster IP traffic: masquerade marking, then the lb tree"},
	RoleExternalFrontend: {Kind: KindChain, Name: ChainExternalFront, Purpose: "the flat path's external traffic: masquerade marking, then the lb tree"},
	RoleNodePortFrontend: {Kind: KindChain, Name: ChainNodePortFront, Purpose: "the flat path's node ports: masquerade marking, then the nodeport-lb tree"},
	RoleLBTree:           {Kind: KindChain, Name: chainLB + "-<first>-<last>", Purpose: "the tree picking a flat frontend's endpoint by its count"},
	RoleNodePortLBTree:   {Kind: KindChain, Name: chainNodePortLB + "-<first>-<last>", Purpose: "the tree picking a flat node port's endpoint by its count"},
	RoleHook:             {Kind: KindBaseChain, Name: "<filter|nat>-<hook>[-pre-dnat|-fastpath]", Purpose: "netfilter's hooks into the chains above"},

	RoleServiceChain:     {Kind: KindChain, Name: kindService + "-<service port>", PerServicePort: true, Purpose: "a chained service port: masquerade marking and the pick of an endpoint"},
	RoleLocalChain:       {Kind: KindChain, Name: kindLocal + "-<service port>", PerServicePort: true, Purpose: "a Local traffic policy: the pick of an endpoint on this node"},
	RoleExternalChain:    {Kind: KindChain, Name: kindExternal + "-<service port>", PerServicePort: true, Purpose: "external traffic of a service port: masquerade marking, then its policy's chain"},
	RoleEndpointChain:    {Kind: KindChain, Name: kindService + "-<service port>/<endpoint>", PerServicePort: true, Purpose: "session affinity: records the client, then DNAT to the endpoint"},
	RoleAffinity:         {Kind: KindSet, Name: affinityPrefix + "<service port>/<endpoint>", PerServicePort: true, Purpose: "session affinity: the clients the endpoint served recently"},
	RoleSourceRangeChain: {Kind: KindChain, Name: kindFirewall + "-<service port>", PerServicePort: true, Purpose: "loadBalancerSourceRanges: admits the ranges, drops the rest"},
	RoleSourceRanges:     {Kind: KindSet, Name: kindFirewall + "-<service port>", PerServicePort: true, Purpose: "loadBalancerSourceRanges: the admitted sources"},
}

// hookChains are the base chains' names.
var hookChains = []string{ChainFilterPreroutingPreDNAT, ChainFilterOutputPreDNAT, ChainFilterInput, ChainFilterForward,
	ChainFilterOutput, ChainNATPrerouting, ChainNATOutput, ChainNATPostrouting, ChainFilterForwardFastPath}

// fixedNames maps the names of roles with one object (and the base chains) to them, for
// chains and for sets.
var fixedChains, fixedSets = func() (map[string]Role, map[string]Role) {
	chains, sets := map[string]Role{}, map[string]Role{}
	for r := RoleNone + 1; r < roleEnd; r++ {
		d := layout[r]
		if strings.Contains(d.Name, "<") {
			continue
		}
		if d.Kind == KindSet || d.Kind == KindMap {
			sets[d.Name] = r
		} else {
			chains[d.Name] = r
		}
	}
	for _, n := range hookChains {
		chains[n] = RoleHook
	}
	return chains, sets
}()

func init() {
	for r := range layout {
		layout[r].Role = Role(r)
	}
}

// Layout describes every role, in order.
func Layout() []Description { return append([]Description(nil), layout[1:]...) }

// Describe describes a role.
func (r Role) Describe() Description {
	if r >= roleEnd {
		return Description{Role: r}
	}
	return layout[r]
}

func (r Role) String() string {
	if r == RoleNone || r >= roleEnd {
		return "role " + strconv.Itoa(int(r))
	}
	return layout[r].Kind.String() + " " + layout[r].Name
}

// Object is one object of a table, known by its name.
type Object struct {
	Role Role
	// Port is the service port of an object of its part (Role.Describe().PerServicePort).
	Port model.ServicePortName
	// Index is an endpoint's position among its service port's (RoleEndpointChain,
	// RoleAffinity), a slot page (RoleEndpointSlots), a bit (the count-bit sets) or the
	// first endpoint count a tree node covers.
	Index uint32
	// Last is the last endpoint count a tree node covers.
	Last uint32
}

// ChainOf tells which of the compiler's chains name is; ok is false for a name the
// compiler never gives a chain.
func ChainOf(name string) (Object, bool) {
	if r, ok := fixedChains[name]; ok {
		return Object{Role: r}, true
	}
	for _, t := range []struct {
		prefix string
		role   Role
	}{{chainNodePortLB, RoleNodePortLBTree}, {chainLB, RoleLBTree}} {
		if rest, ok := strings.CutPrefix(name, t.prefix+"-"); ok {
			first, last, ok := strings.Cut(rest, "-")
			lo, err1 := parseIndex(first)
			hi, err2 := parseIndex(last)
			if ok && err1 == nil && err2 == nil && lo <= hi {
				return Object{Role: t.role, Index: lo, Last: hi}, true
			}
			return Object{}, false
		}
	}
	kind, rest, ok := strings.Cut(name, "-")
	if !ok {
		return Object{}, false
	}
	roles := map[string]Role{kindService: RoleServiceChain, kindLocal: RoleLocalChain, kindExternal: RoleExternalChain, kindFirewall: RoleSourceRangeChain}
	r, ok := roles[kind]
	if !ok {
		return Object{}, false
	}
	sp, i, ok := parsePortName(rest, kind == kindService)
	switch {
	case !ok:
		return Object{}, false
	case i >= 0:
		return Object{Role: RoleEndpointChain, Port: sp, Index: uint32(i)}, true
	}
	return Object{Role: r, Port: sp}, true
}

// SetOf tells which of the compiler's sets or maps name is; ok is false for a name the
// compiler never gives a set.
func SetOf(name string) (Object, bool) {
	if r, ok := fixedSets[name]; ok {
		return Object{Role: r}, true
	}
	for _, t := range []struct {
		prefix string
		role   Role
	}{{setNodePortEndpointCountBit, RoleNodePortEndpointCountBit}, {setEndpointCountBit, RoleEndpointCountBit}, {mapEndpointsPrefix, RoleEndpointSlots}} {
		if rest, ok := strings.CutPrefix(name, t.prefix); ok {
			i, err := parseIndex(rest)
			if err != nil {
				return Object{}, false
			}
			return Object{Role: t.role, Index: i}, true
		}
	}
	if rest, ok := strings.CutPrefix(name, affinityPrefix); ok {
		if sp, i, ok := parsePortName(rest, true); ok && i >= 0 {
			return Object{Role: RoleAffinity, Port: sp, Index: uint32(i)}, true
		}
		return Object{}, false
	}
	if rest, ok := strings.CutPrefix(name, kindFirewall+"-"); ok {
		if sp, _, ok := parsePortName(rest, false); ok {
			return Object{Role: RoleSourceRanges, Port: sp}, true
		}
	}
	return Object{}, false
}

// parseIndex parses a decimal number as the compiler writes it (no sign, no leading
// zeros).
func parseIndex(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err == nil && strconv.FormatUint(n, 10) != s {
		err = strconv.ErrSyntax
	}
	return uint32(n), err
}

// ChainName returns the name of a service port's object of the given kind: kindService,
// kindLocal, kindExternal or kindFirewall (the table's), or any other word for a name
// that is no object's (the part's owner). The service port is
// namespace/name/protocol/port, "-" for an unnamed port (a port's name is never "-").
func ChainName(kind string, sp model.ServicePortName) string {
	port := sp.Port
	if port == "" {
		port = "-"
	}
	return kind + "-" + sp.Namespace + "/" + sp.Name + "/" + strings.ToLower(model.ProtoString(sp.Protocol)) + "/" + port
}

// parsePortName parses what ChainName writes after the kind, and with endpoint set an
// endpoint's suffix "/<index>": i is the index, -1 without one.
func parsePortName(s string, endpoint bool) (sp model.ServicePortName, i int, ok bool) {
	parts := strings.Split(s, "/")
	i = -1
	if endpoint && len(parts) == 5 {
		n, err := parseIndex(parts[4])
		if err != nil {
			return sp, -1, false
		}
		i, parts = int(n), parts[:4]
	}
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" || parts[3] == "" {
		return sp, -1, false
	}
	sp.Namespace, sp.Name, sp.Port = parts[0], parts[1], parts[3]
	if sp.Port == "-" {
		sp.Port = ""
	}
	for _, p := range []uint8{model.ProtoTCP, model.ProtoUDP, model.ProtoSCTP} {
		if strings.ToLower(model.ProtoString(p)) == parts[2] {
			sp.Protocol = p
			return sp, i, true
		}
	}
	return sp, -1, false
}

// endpointChainName is the chain of a service chain's endpoint i under session affinity.
func endpointChainName(svcChain string, i int) string { return svcChain + "/" + strconv.Itoa(i) }

// affinitySetName is the set of the clients an endpoint chain served recently.
func affinitySetName(epChain string) string {
	return affinityPrefix + strings.TrimPrefix(epChain, kindService+"-")
}

// endpointMapName is the endpoint slot map of a slot page.
func endpointMapName(page uint32) string {
	return mapEndpointsPrefix + strconv.FormatUint(uint64(page), 10)
}

// countBitSetName is the count-bit set of bit b of a prefix (setEndpointCountBit,
// setNodePortEndpointCountBit).
func countBitSetName(prefix string, b int) string { return prefix + strconv.Itoa(b) }

// treeNode is the tree chain of a prefix (chainLB, chainNodePortLB) covering the
// endpoint counts lo..lo+size-1.
func treeNode(prefix string, lo, size uint32) string {
	return prefix + "-" + strconv.FormatUint(uint64(lo), 10) + "-" + strconv.FormatUint(uint64(lo+size-1), 10)
}
