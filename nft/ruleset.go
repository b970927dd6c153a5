// Package nft models an nftables ruleset as typed values.
//
// One compiler produces a Ruleset; several consumers read it: the text renderer in this
// package (nft syntax, for --dry-run and golden tests), the netlink encoder in nft/kernel
// (the only code that speaks to the kernel), and the packet tracer. Statements form a small
// closed set so that every consumer can handle every kind; adding a kind without teaching
// the renderer and the encoder fails their table tests.
package nft

import (
	"encoding/binary"
	"net/netip"
	"strconv"
)

// Family is the nftables address family of a table.
type Family uint8

const (
	// IPv4 is the "ip" family.
	IPv4 Family = 2 // NFPROTO_IPV4
	// IPv6 is the "ip6" family.
	IPv6 Family = 10 // NFPROTO_IPV6
)

func (f Family) String() string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// Ruleset is the complete desired content of one table.
type Ruleset struct {
	Family Family
	Table  string
	Sets   []*Set   // in render order
	Chains []*Chain // in render order: regular chains first, base chains last
	// Flowtables are fast paths for established flows (see Flowtable), by name.
	Flowtables []*Flowtable
	// Parts hold the objects of each service port (see Part); Flatten merges them in.
	Parts []*Part
	// Changes, when set, names the parts that differ from those of the ruleset this one
	// was derived from (see PartChanges). The zero value says nothing.
	Changes PartChanges
}

// Chain is a regular chain (Hook == nil) or a base chain attached to a netfilter hook.
type Chain struct {
	Name  string
	Hook  *Hook
	Rules []Rule
}

// Flowtable is a fast path for established flows ("flowtable ft { hook ingress
// priority filter; devices = { eth0, veth1 } }"): a flow that a rule adds to it
// ("flow add @ft", FlowOffload) is forwarded from then on by the flowtable's ingress
// hook on its devices, past every later netfilter hook of every table. Its hook is
// always ingress.
type Flowtable struct {
	Name     string
	Priority int32    // of the ingress hook (0: "priority filter")
	Devices  []string // interface names, sorted, each at most 15 bytes
}

// Hook describes a base chain.
type Hook struct {
	Type     ChainType
	Hook     HookPoint
	Priority int32
}

// ChainType is the base chain type.
type ChainType string

// Base chain types.
const (
	TypeFilter ChainType = "filter"
	TypeNAT    ChainType = "nat"
)

// HookPoint is a netfilter hook.
type HookPoint uint32

// Netfilter hooks (NF_INET_*).
const (
	Prerouting  HookPoint = 0
	Input       HookPoint = 1
	Forward     HookPoint = 2
	Output      HookPoint = 3
	Postrouting HookPoint = 4
)

func (h HookPoint) String() string {
	return [...]string{"prerouting", "input", "forward", "output", "postrouting"}[h]
}

// Rule is a sequence of statements evaluated left to right, with an optional comment
// (for humans) and an optional Tag (for programs; see Tag).
type Rule struct {
	Stmts   []Stmt
	Comment string
	Tag     Tag
}

// StmtOf returns the first statement of kind T in r.
func StmtOf[T Stmt](r Rule) (T, bool) {
	for _, s := range r.Stmts {
		if v, ok := s.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// Datatype is the type of one field of a set key or map value.
type Datatype uint8

// Datatypes used by nftproxy. NumgenKey is an integer produced by "numgen random": nft
// only accepts it as a map key when the map is declared with typeof.
const (
	TypeIPv4Addr Datatype = iota + 1
	TypeIPv6Addr
	TypeInetProto
	TypeInetService
	TypeVerdict
	TypeNumgen
)

// Set is a named set (Data == nil) or map (Data != nil) with its full element list.
type Set struct {
	Name string
	Key  []Datatype
	// Data is the map's value type: {TypeVerdict} for a verdict map, or address and port
	// for a NAT target map.
	Data     []Datatype
	Comment  string
	Elements []Element
	// Dynamic sets are filled from rules ("update @s {…}") with entries that expire
	// after Timeout seconds; Size bounds them. The applier never diffs their elements:
	// it flushes them when Epoch changes.
	Dynamic bool
	Timeout uint32
	Size    uint32
	Epoch   string
	// Counter gives every element packet and byte counters, updated by lookups.
	Counter bool
	// Interval sets (of one address field) hold ranges: each element's Key is a range's
	// first address and its Data (one value of the key's type) the last, inclusive.
	// Ranges must not overlap or touch (see MergeRanges). A lookup takes logarithmic
	// time in the number of ranges; the kernel stores a range as two elements, its
	// start and the address after its end (none when it ends at the last address).
	Interval bool
}

// IsMap reports whether the set carries values.
func (s *Set) IsMap() bool { return len(s.Data) > 0 }

// Element is one set element or map entry.
type Element struct {
	Key     []Value
	Data    []Value  // address/port map values
	Verdict *Verdict // verdict map values
	Comment string   // for humans reading "nft list"
	Tag     Tag      // for programs (see Tag); never sent to the kernel
}

// Value is one field of a key or value: an address or a number (protocol, port,
// integer), as the Datatype at the same position says. It holds no pointer (a
// netip.Addr holds one), so the collector never scans the values of a large ruleset
// (hundreds of thousands of map entries at 30k services), and it is made of bytes only:
// 17 bytes, packed one after the other in a key's array, where a netip.Addr and a
// number took 32. Values compare with ==.
type Value struct {
	b    [16]byte // an IPv6 address; an IPv4 address or a number (little endian) in b[:4]
	kind valueKind
}

type valueKind uint8

const (
	valueNum valueKind = iota
	valueIPv4
	valueIPv6
)

// Addr returns an address value (without its zone: nftables has none).
func Addr(a netip.Addr) Value {
	switch {
	case a.Is4():
		v := Value{kind: valueIPv4}
		b := a.As4()
		copy(v.b[:], b[:])
		return v
	case a.Is6():
		return Value{b: a.As16(), kind: valueIPv6}
	}
	return Value{}
}

// Num returns a numeric value (protocol, port, integer).
func Num(n uint32) Value {
	var v Value
	binary.LittleEndian.PutUint32(v.b[:4], n)
	return v
}

// Addr returns the address of an address value; the zero Addr for a number.
func (v Value) Addr() netip.Addr {
	switch v.kind {
	case valueIPv4:
		return netip.AddrFrom4([4]byte(v.b[:4]))
	case valueIPv6:
		return netip.AddrFrom16(v.b)
	}
	return netip.Addr{}
}

// Num returns the number of a numeric value; 0 for an address.
func (v Value) Num() uint32 {
	if v.kind != valueNum {
		return 0
	}
	return binary.LittleEndian.Uint32(v.b[:4])
}

// String is the address, or the number.
func (v Value) String() string {
	if v.kind != valueNum {
		return v.Addr().String()
	}
	return strconv.FormatUint(uint64(v.Num()), 10)
}
