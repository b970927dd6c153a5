// Package shapes is a research bench for nftables ruleset shapes in which a steady-state
// change (endpoint replaced, endpoint count changed, service added, service removed) is a
// change of map and set elements only: no rule, no chain and no verdict-map jump element,
// so that nf_tables never validates the whole table at commit.
//
// Each shape is generated as nft text (loaded with nft -f, so nft 1.0.6 must accept it and
// print it back) and each change as a list of element operations, sent as one netlink
// transaction. The results are in docs/shapes.md.
package shapes

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Table is the table every shape is generated in.
const Table = "shapes"

// Shape names.
const (
	// MarkClass dispatches with a fixed verdict map over endpoint-count classes: per-bit
	// sets of service keys set the class, in 8 reserved mark bits, then one lookup of
	// "meta mark & mask" in a verdict map whose elements exist once per class, not per
	// service. A shared chain per class draws the endpoint from one map keyed by
	// service . numgen random mod N.
	MarkClass = "markclass"
	// ClassRules has one dnat rule per class in the dispatch chain, each looking the
	// service key . numgen random mod N up in the class's own endpoint map: a lookup miss
	// falls through to the next class. No jump, no mark, O(classes) per new connection.
	ClassRules = "classrules"
	// JumpVMap is the service verdict map of today's ruleset, whose elements jump to the
	// shared per-class chains instead of per-service chains: it still adds a jump element
	// per new service, so it measures what validation costs when the jumps all lead to a
	// few small chains.
	JumpVMap = "jumpvmap"
)

// affinityTimeouts are the affinity timeouts with a recording rule (kube-proxy's default
// 10800 s, and a short one for tests). A service with another timeout would add one rule:
// rare, and the one change that still costs a validation.
var affinityTimeouts = []uint32{10800, 5}

// Shapes are the candidates, in report order.
var Shapes = []string{MarkClass, ClassRules, JumpVMap}

// ClusterCIDR is the pod range: other sources are marked for masquerade.
const ClusterCIDR = "10.0.0.0/8"

// Mark bits: kube-proxy's masquerade bit, and the 8 bits MarkClass reserves for the class.
const (
	MasqBit    = 0x4000
	ClassShift = 16
	ClassBits  = 8
	ClassMask  = ((1 << ClassBits) - 1) << ClassShift
)

// Service is one service port (TCP) with its endpoints, all IPv4.
type Service struct {
	IP        netip.Addr
	Port      uint16
	Endpoints []Endpoint
	// Affinity is the ClientIP session affinity timeout in seconds, 0 for none.
	Affinity uint32
	// NodePort is the service's node port, 0 for none (MarkClass only: on every local
	// address, externalTrafficPolicy Cluster).
	NodePort uint16
}

// Endpoint is one backend address and port.
type Endpoint struct {
	Addr netip.Addr
	Port uint16
}

func (s Service) npKey() string { return fmt.Sprintf("tcp . %d", s.NodePort) }

// npEPElements are the node-port endpoint map entries.
func npEPElements(svcs []Service) []string {
	var out []string
	for _, s := range svcs {
		if s.NodePort == 0 {
			continue
		}
		for i, e := range s.Endpoints {
			out = append(out, fmt.Sprintf("%s . %d : %s . %d", s.npKey(), i, e.Addr, e.Port))
		}
	}
	return out
}

// Key is the service's map key in nft syntax.
func (s Service) Key() string { return fmt.Sprintf("%s . tcp . %d", s.IP, s.Port) }

// Services returns n services with e endpoints each (the addressing of nft/kernel's
// benchmarks: services in 10.96.0.0/12, endpoints from 10.128.0.0).
func Services(n, e int) []Service {
	out := make([]Service, n)
	for i := range out {
		out[i] = Service{IP: netip.AddrFrom4([4]byte{10, byte(96 + i/65536), byte(i / 256), byte(i)}), Port: 80}
		for j := 0; j < e; j++ {
			k := i*e + j
			out[i].Endpoints = append(out[i].Endpoints, Endpoint{netip.AddrFrom4([4]byte{10, byte(128 + k/65536), byte(k / 256), byte(k)}), 8080})
		}
	}
	return out
}

// Classes returns the endpoint counts present, ascending.
func Classes(svcs []Service) []int {
	seen := map[int]bool{}
	var out []int
	for _, s := range svcs {
		if n := len(s.Endpoints); n > 0 && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

const (
	npKeyType   = "meta l4proto . th dport"
	npEPKeyType = npKeyType + " . numgen random mod %d"
	svcKeyType  = "ip daddr . meta l4proto . th dport"
	epKeyType   = svcKeyType + " . numgen random mod %d"
	epData      = "ip daddr . th dport"
)

// Generate writes the whole ruleset of a shape for the services, with chains for the
// endpoint counts in classes (a superset of those the services use: steady-state changes
// then never need a new class).
func Generate(shape string, svcs []Service, classes []int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table ip %s {\n", Table)
	var noEP []string
	for _, s := range svcs {
		if len(s.Endpoints) == 0 {
			noEP = append(noEP, s.Key())
		}
	}
	set(&b, "no-endpoint-services", svcKeyType, "", noEP)
	switch shape {
	case MarkClass:
		set(&b, "ep", fmt.Sprintf(epKeyType, 65536), epData, epElements(svcs, -1))
		set(&b, "service-ips", svcKeyType, "", withEndpoints(svcs))
		for bit := 0; bit < ClassBits; bit++ {
			var keys []string
			for _, s := range svcs {
				if len(s.Endpoints)>>bit&1 == 1 {
					keys = append(keys, s.Key())
				}
			}
			set(&b, fmt.Sprintf("class-bit%d", bit), svcKeyType, "", keys)
		}
		var cls []string
		for _, n := range classes {
			cls = append(cls, fmt.Sprintf("0x%08x : goto lb-%d", n<<ClassShift, n))
		}
		set(&b, "classes", "meta mark", "verdict", cls)
		for _, n := range classes {
			fmt.Fprintf(&b, "\tchain lb-%d {\n", n)
			fmt.Fprintf(&b, "\t\tmeta mark set meta mark & 0x%08x\n", ^uint32(ClassMask))
			fmt.Fprintf(&b, "\t\tip saddr != %s meta mark set meta mark | 0x%08x\n", ClusterCIDR, MasqBit)
			fmt.Fprintf(&b, "\t\tdnat to ip saddr . %s map @affinity\n", svcKeyType)
			fmt.Fprintf(&b, "\t\tdnat to %s . numgen random mod %d map @ep\n", svcKeyType, n)
			b.WriteString("\t}\n")
		}
		// Node ports: the same scheme keyed by protocol . port, their own class sets,
		// endpoint map and chains (always marked for masquerade: externalTrafficPolicy
		// Cluster).
		var nps []string
		for _, s := range svcs {
			if s.NodePort > 0 && len(s.Endpoints) > 0 {
				nps = append(nps, s.npKey())
			}
		}
		set(&b, "nodeport-services", npKeyType, "", nps)
		set(&b, "np-ep", fmt.Sprintf(npEPKeyType, 65536), epData, npEPElements(svcs))
		for bit := 0; bit < ClassBits; bit++ {
			var keys []string
			for _, s := range svcs {
				if s.NodePort > 0 && len(s.Endpoints)>>bit&1 == 1 {
					keys = append(keys, s.npKey())
				}
			}
			set(&b, fmt.Sprintf("np-bit%d", bit), npKeyType, "", keys)
		}
		cls = nil
		for _, n := range classes {
			cls = append(cls, fmt.Sprintf("0x%08x : goto np-%d", n<<ClassShift, n))
		}
		set(&b, "np-classes", "meta mark", "verdict", cls)
		for _, n := range classes {
			fmt.Fprintf(&b, "\tchain np-%d {\n", n)
			fmt.Fprintf(&b, "\t\tmeta mark set meta mark & 0x%08x | 0x%08x\n", ^uint32(ClassMask), MasqBit)
			fmt.Fprintf(&b, "\t\tdnat to %s . numgen random mod %d map @np-ep\n", npKeyType, n)
			b.WriteString("\t}\n")
		}
		// Packets to other addresses leave with their mark untouched; service packets
		// get the class bits cleared, then set bit by bit.
		b.WriteString("\tchain cluster-ips {\n")
		fmt.Fprintf(&b, "\t\tmeta mark set meta mark & 0x%08x\n", ^uint32(ClassMask))
		for bit := 0; bit < ClassBits; bit++ {
			fmt.Fprintf(&b, "\t\t%s @class-bit%d meta mark set meta mark | 0x%08x\n", svcKeyType, bit, 1<<(ClassShift+bit))
		}
		fmt.Fprintf(&b, "\t\tmeta mark & 0x%08x vmap @classes\n", uint32(ClassMask))
		// Only reached when the class has no chain (the proxy adds a class's jump in
		// the transaction that adds its first service): leave no class bits behind.
		fmt.Fprintf(&b, "\t\tmeta mark set meta mark & 0x%08x\n", ^uint32(ClassMask))
		b.WriteString("\t}\n")
		b.WriteString("\tchain nodeports {\n")
		fmt.Fprintf(&b, "\t\tmeta mark set meta mark & 0x%08x\n", ^uint32(ClassMask))
		for bit := 0; bit < ClassBits; bit++ {
			fmt.Fprintf(&b, "\t\t%s @np-bit%d meta mark set meta mark | 0x%08x\n", npKeyType, bit, 1<<(ClassShift+bit))
		}
		fmt.Fprintf(&b, "\t\tmeta mark & 0x%08x vmap @np-classes\n", uint32(ClassMask))
		fmt.Fprintf(&b, "\t\tmeta mark set meta mark & 0x%08x\n", ^uint32(ClassMask))
		b.WriteString("\t}\n")
		b.WriteString("\tchain services {\n")
		fmt.Fprintf(&b, "\t\t%s @service-ips goto cluster-ips\n", svcKeyType)
		fmt.Fprintf(&b, "\t\tfib daddr type local %s @nodeport-services goto nodeports\n", npKeyType)
		b.WriteString("\t}\n")
	case ClassRules:
		set(&b, "service-ips", svcKeyType, "", withEndpoints(svcs))
		for _, n := range classes {
			set(&b, fmt.Sprintf("ep-%d", n), fmt.Sprintf(epKeyType, n), epData, epElements(svcs, n))
		}
		b.WriteString("\tchain services {\n")
		fmt.Fprintf(&b, "\t\t%s @service-ips ip saddr != %s meta mark set meta mark | 0x%08x\n", svcKeyType, ClusterCIDR, MasqBit)
		fmt.Fprintf(&b, "\t\tdnat to ip saddr . %s map @affinity\n", svcKeyType)
		for _, n := range classes {
			fmt.Fprintf(&b, "\t\tdnat to %s . numgen random mod %d map @ep-%d\n", svcKeyType, n, n)
		}
		b.WriteString("\t}\n")
	case JumpVMap:
		set(&b, "ep", fmt.Sprintf(epKeyType, 65536), epData, epElements(svcs, -1))
		var jumps []string
		for _, s := range svcs {
			if n := len(s.Endpoints); n > 0 {
				jumps = append(jumps, fmt.Sprintf("%s : goto lb-%d", s.Key(), n))
			}
		}
		set(&b, "service-ips", svcKeyType, "verdict", jumps)
		for _, n := range classes {
			fmt.Fprintf(&b, "\tchain lb-%d {\n", n)
			fmt.Fprintf(&b, "\t\tip saddr != %s meta mark set meta mark | 0x%08x\n", ClusterCIDR, MasqBit)
			fmt.Fprintf(&b, "\t\tdnat to ip saddr . %s map @affinity\n", svcKeyType)
			fmt.Fprintf(&b, "\t\tdnat to %s . numgen random mod %d map @ep\n", svcKeyType, n)
			b.WriteString("\t}\n")
		}
		b.WriteString("\tchain services {\n")
		fmt.Fprintf(&b, "\t\t%s vmap @service-ips\n", svcKeyType)
		b.WriteString("\t}\n")
	default:
		panic("unknown shape " + shape)
	}
	// The rest is common to every shape and constant in size: base chains, the
	// no-endpoints reject (a set, not a verdict map: adding a service without endpoints
	// adds no jump element), masquerade, session affinity.
	//
	// Affinity: one dynamic map, client . service → endpoint, shared by all services.
	// The shared chains try it before the random draw; the endpoint a new connection got
	// is recorded after DNAT (source NAT hooks, first packet only), by one rule per
	// distinct timeout for the services in that timeout's set. "meta l4proto tcp" gives
	// "ct original proto-dst" its size; the counter keeps nft 1.0.6 from dropping it
	// from the listing as a redundant dependency (the listing would not load back).
	timeouts := map[uint32][]string{}
	for _, s := range svcs {
		if s.Affinity > 0 && len(s.Endpoints) > 0 {
			timeouts[s.Affinity] = append(timeouts[s.Affinity], s.Key())
		}
	}
	for _, t := range affinityTimeouts {
		set(&b, fmt.Sprintf("affinity-%d", t), svcKeyType, "", timeouts[t])
	}
	fmt.Fprintf(&b, "\tmap affinity {\n\t\ttypeof ip saddr . %s : %s\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 3h\n\t}\n", svcKeyType, epData)
	var record strings.Builder
	for _, t := range affinityTimeouts {
		fmt.Fprintf(&record, "\t\tmeta l4proto tcp counter ct status dnat ct original ip daddr . meta l4proto . ct original proto-dst @affinity-%d update @affinity { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout %ds : ip daddr . th dport }\n", t, t)
	}
	b.WriteString("\tchain reject-chain {\n\t\tcounter reject\n\t}\n")
	b.WriteString("\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n")
	b.WriteString("\tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n")
	fmt.Fprintf(&b, "\tchain nat-input {\n\t\ttype nat hook input priority 100; policy accept;\n%s\t}\n", record.String())
	fmt.Fprintf(&b, "\tchain nat-postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n%s\t\tmeta mark & 0x%08x == 0 return\n\t\tmeta mark set meta mark ^ 0x%08x\n\t\tmasquerade fully-random\n\t}\n", record.String(), MasqBit, MasqBit)
	fmt.Fprintf(&b, "\tchain filter-forward {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tct state new %s @no-endpoint-services goto reject-chain\n\t}\n", svcKeyType)
	fmt.Fprintf(&b, "\tchain filter-output {\n\t\ttype filter hook output priority filter; policy accept;\n\t\tct state new %s @no-endpoint-services goto reject-chain\n\t}\n", svcKeyType)
	b.WriteString("}\n")
	return b.String()
}

// withEndpoints are the keys of the services that have endpoints.
func withEndpoints(svcs []Service) []string {
	var out []string
	for _, s := range svcs {
		if len(s.Endpoints) > 0 {
			out = append(out, s.Key())
		}
	}
	return out
}

func set(b *strings.Builder, name, keyType, dataType string, elems []string) {
	kind, typ := "set", "typeof "+keyType
	if dataType != "" {
		kind, typ = "map", typ+" : "+dataType
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\t%s\n", kind, name, typ)
	if len(elems) > 0 {
		b.WriteString("\t\telements = { ")
		for i, e := range elems {
			if i > 0 {
				b.WriteString(",\n\t\t\t")
			}
			b.WriteString(e)
		}
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
}

// epElements are the endpoint map entries of the services with class n (all when n < 0).
func epElements(svcs []Service, n int) []string {
	var out []string
	for _, s := range svcs {
		if n >= 0 && len(s.Endpoints) != n {
			continue
		}
		for i, e := range s.Endpoints {
			out = append(out, fmt.Sprintf("%s . %d : %s . %d", s.Key(), i, e.Addr, e.Port))
		}
	}
	return out
}

// Op is one batch message: elements added to or deleted from a named set or map.
type Op struct {
	Delete   bool
	Set      string
	Elements []Elem
}

// Elem is one element in netlink encoding: the key's fields each padded to 4 bytes, a
// data value, or a goto verdict to Chain.
type Elem struct {
	Key, Val []byte
	Chain    string
}

func svcKey(s Service) []byte {
	k := make([]byte, 12)
	copy(k, s.IP.AsSlice())
	k[4] = 6 // tcp
	binary.BigEndian.PutUint16(k[8:], s.Port)
	return k
}

func npKey(s Service) []byte {
	k := make([]byte, 8)
	k[0] = 6 // tcp
	binary.BigEndian.PutUint16(k[4:], s.NodePort)
	return k
}

func npEPElem(s Service, i int) Elem {
	e := epElem(s, i)
	return Elem{Key: binary.NativeEndian.AppendUint32(npKey(s), uint32(i)), Val: e.Val}
}

func epElem(s Service, i int) Elem {
	k := svcKey(s)
	k = binary.NativeEndian.AppendUint32(k, uint32(i)) // numgen: host byte order
	v := make([]byte, 8)
	copy(v, s.Endpoints[i].Addr.AsSlice())
	binary.BigEndian.PutUint16(v[4:], s.Endpoints[i].Port)
	return Elem{Key: k, Val: v}
}

func epMap(shape string, n int) string {
	if shape == ClassRules {
		return fmt.Sprintf("ep-%d", n)
	}
	return "ep"
}

// serviceOps are the element operations that add service s (or, with del, remove it).
func serviceOps(shape string, s Service, del bool) []Op {
	n := len(s.Endpoints)
	if n == 0 {
		return []Op{{Delete: del, Set: "no-endpoint-services", Elements: []Elem{{Key: svcKey(s)}}}}
	}
	var eps []Elem
	for i := range s.Endpoints {
		eps = append(eps, epElem(s, i))
	}
	ops := []Op{{Delete: del, Set: epMap(shape, n), Elements: eps}}
	if s.Affinity > 0 {
		ops = append(ops, Op{Delete: del, Set: fmt.Sprintf("affinity-%d", s.Affinity), Elements: []Elem{{Key: svcKey(s)}}})
	}
	switch shape {
	case MarkClass:
		ops = append(ops, Op{Delete: del, Set: "service-ips", Elements: []Elem{{Key: svcKey(s)}}})
		for bit := 0; bit < ClassBits; bit++ {
			if n>>bit&1 == 1 {
				ops = append(ops, Op{Delete: del, Set: fmt.Sprintf("class-bit%d", bit), Elements: []Elem{{Key: svcKey(s)}}})
			}
		}
		if s.NodePort > 0 {
			var npeps []Elem
			for i := range s.Endpoints {
				npeps = append(npeps, npEPElem(s, i))
			}
			ops = append(ops, Op{Delete: del, Set: "np-ep", Elements: npeps}, Op{Delete: del, Set: "nodeport-services", Elements: []Elem{{Key: npKey(s)}}})
			for bit := 0; bit < ClassBits; bit++ {
				if n>>bit&1 == 1 {
					ops = append(ops, Op{Delete: del, Set: fmt.Sprintf("np-bit%d", bit), Elements: []Elem{{Key: npKey(s)}}})
				}
			}
		}
	case ClassRules:
		ops = append(ops, Op{Delete: del, Set: "service-ips", Elements: []Elem{{Key: svcKey(s)}}})
	case JumpVMap:
		ops = append(ops, Op{Delete: del, Set: "service-ips", Elements: []Elem{{Key: svcKey(s), Chain: fmt.Sprintf("lb-%d", n)}}})
	}
	if del {
		slices.Reverse(ops) // references before what they reference
	}
	return ops
}

// AddService returns the transaction that adds a service.
func AddService(shape string, s Service) []Op { return serviceOps(shape, s, false) }

// RemoveService returns the transaction that removes a service.
func RemoveService(shape string, s Service) []Op { return serviceOps(shape, s, true) }

// ReplaceEndpoint returns the transaction that replaces endpoint i of s by e (the count
// stays): one entry of the endpoint map deleted and added again.
func ReplaceEndpoint(shape string, s Service, i int, e Endpoint) []Op {
	next := s
	next.Endpoints = slices.Clone(s.Endpoints)
	next.Endpoints[i] = e
	ops := slotOps(epMap(shape, len(s.Endpoints)), epElem, s, next)
	if shape == MarkClass && s.NodePort > 0 {
		ops = append(ops, slotOps("np-ep", npEPElem, s, next)...)
	}
	return ops
}

// Resize returns the transaction that changes s's endpoints from old to s.Endpoints (a
// different count, neither zero: to or from zero is RemoveService then AddService).
// Where the endpoint map is shared by all classes, the entries both lists share at the
// same index stay; the class changes by set elements.
func Resize(shape string, old, s Service) []Op {
	switch shape {
	case ClassRules:
		return append(serviceOps(shape, old, true), serviceOps(shape, s, false)...)
	}
	var ops []Op // one transaction: the order of its messages is not seen by packets
	switch shape {
	case MarkClass:
		for bit := 0; bit < ClassBits; bit++ {
			was, is := len(old.Endpoints)>>bit&1 == 1, len(s.Endpoints)>>bit&1 == 1
			if was != is {
				ops = append(ops, Op{Delete: was, Set: fmt.Sprintf("class-bit%d", bit), Elements: []Elem{{Key: svcKey(s)}}})
				if s.NodePort > 0 {
					ops = append(ops, Op{Delete: was, Set: fmt.Sprintf("np-bit%d", bit), Elements: []Elem{{Key: npKey(s)}}})
				}
			}
		}
	case JumpVMap:
		ops = append(ops,
			Op{Delete: true, Set: "service-ips", Elements: []Elem{{Key: svcKey(s), Chain: fmt.Sprintf("lb-%d", len(old.Endpoints))}}},
			Op{Set: "service-ips", Elements: []Elem{{Key: svcKey(s), Chain: fmt.Sprintf("lb-%d", len(s.Endpoints))}}})
	}
	ops = append(ops, slotOps("ep", epElem, old, s)...)
	if shape == MarkClass && s.NodePort > 0 {
		ops = append(ops, slotOps("np-ep", npEPElem, old, s)...)
	}
	return ops
}

// slotOps rewrites the endpoint slots of a map that differ between old and s.
func slotOps(set string, elem func(Service, int) Elem, old, s Service) []Op {
	var ops []Op
	var del, add []Elem
	for i := range max(len(old.Endpoints), len(s.Endpoints)) {
		switch {
		case i >= len(s.Endpoints):
			del = append(del, elem(old, i))
		case i >= len(old.Endpoints):
			add = append(add, elem(s, i))
		case old.Endpoints[i] != s.Endpoints[i]:
			del = append(del, elem(old, i))
			add = append(add, elem(s, i))
		}
	}
	if len(del) > 0 {
		ops = append(ops, Op{Delete: true, Set: set, Elements: del})
	}
	if len(add) > 0 {
		ops = append(ops, Op{Set: set, Elements: add})
	}
	return ops
}

// ClassJump returns a MarkClass transaction that deletes and re-adds the classes verdict
// map's jump to lb-n.
func ClassJump(n int) []Op {
	e := Elem{Key: binary.NativeEndian.AppendUint32(nil, uint32(n)<<ClassShift), Chain: fmt.Sprintf("lb-%d", n)}
	return []Op{{Delete: true, Set: "classes", Elements: []Elem{e}}, {Set: "classes", Elements: []Elem{e}}}
}
