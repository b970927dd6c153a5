package nft

import "net/netip"

// Stmt is one statement of a rule. The implementations below are the complete list; every
// consumer (renderer, kernel encoder, tracer) has a case for each.
type Stmt interface{ isStmt() }

// Field is a packet or metadata field usable in matches, lookups and map keys.
type Field uint8

// Fields. Saddr/Daddr are the network header addresses of the table's family.
const (
	FieldSaddr Field = iota + 1
	FieldDaddr
	FieldL4Proto
	FieldTHDport
	// FieldCtOrigDaddr is the destination of the connection's original direction,
	// before DNAT ("ct original ip daddr").
	FieldCtOrigDaddr
)

// Op is a comparison operator.
type Op uint8

// Comparison operators.
const (
	OpEq Op = iota
	OpNeq
)

// MatchPrefix matches an address field against a prefix ("ip saddr != 10.0.0.0/8").
type MatchPrefix struct {
	Field  Field // FieldSaddr or FieldDaddr
	Op     Op
	Prefix netip.Prefix
}

// MatchIifname matches the input interface's name ("iifname "cni0""), or with Prefix
// every name that begins with Name ("iifname "veth*"").
type MatchIifname struct {
	Op     Op
	Name   string // at most 15 bytes
	Prefix bool
}

// MatchL4Proto matches the transport protocol ("meta l4proto tcp").
type MatchL4Proto struct{ Proto uint8 }

// MatchCtStateNew matches connections in state new ("ct state new").
type MatchCtStateNew struct{}

// MatchCtStateEstablished matches connections in state established ("ct state
// established"): a packet of a connection that has seen traffic both ways.
type MatchCtStateEstablished struct{}

// FlowOffload adds the packet's connection to the flowtable Flowtable ("flow add
// @ft"): its later packets take the flowtable's fast path (Flowtable).
type FlowOffload struct{ Flowtable string }

// MatchCtStatusDNAT matches connections that were destination-NATed ("ct status dnat").
type MatchCtStatusDNAT struct{}

// MatchMarkUnset matches packets whose mark has none of Bits set ("meta mark & B == 0").
type MatchMarkUnset struct{ Bits uint32 }

// MatchFibDaddrLocal matches packets addressed to a local address ("fib daddr type local").
type MatchFibDaddrLocal struct{}

// Lookup matches when the concatenation of Fields is in Set ("ip saddr . ip daddr @s").
type Lookup struct {
	Fields []Field
	Set    string
}

// VMap looks the concatenation of Fields up in a verdict map and applies the verdict.
type VMap struct {
	Fields []Field
	Map    string
}

// Verdict ends (or jumps out of) rule evaluation.
type Verdict struct {
	Kind  VerdictKind
	Chain string // for Jump and Goto
}

// VerdictKind enumerates verdicts.
type VerdictKind uint8

// Verdict kinds.
const (
	Accept VerdictKind = iota + 1
	Drop
	Return
	Jump
	Goto
)

// Reject rejects the packet (ICMP port unreachable, "reject").
type Reject struct{}

// SetMarkBits ORs (Xor == false) or XORs (Xor == true) Bits into the packet mark.
type SetMarkBits struct {
	Bits uint32
	Xor  bool
}

// Masquerade source-NATs to the outgoing interface's address.
type Masquerade struct{ FullyRandom bool }

// DNATNumgenMap destination-NATs to the address and port found in Map at key
// "numgen random mod Mod offset Offset" — a uniform random choice among Mod consecutive
// slots.
type DNATNumgenMap struct {
	Mod    uint32
	Offset uint32
	Map    string
}

// DNATKeyMap destination-NATs to the address and port found in Map at the key
// "Fields . numgen random mod Mod" ("dnat ip to ip daddr . meta l4proto . th dport .
// numgen random mod 3 map @endpoints"): a uniform random choice among the Mod entries
// 0..Mod-1 of the packet's own key, so one rule serves every key with Mod entries.
type DNATKeyMap struct {
	Fields []Field
	Mod    uint32
	Map    string
}

// DNATHashMap destination-NATs to the address and port found in Map at key
// "jhash <family> saddr . th sport mod Mod seed Seed offset Offset": the slot that a hash
// of the client's address and port selects among Mod consecutive slots. The hash is a
// function of those two fields and Seed alone, so the same client address and port
// select the same slot on every node (consistent hashing).
type DNATHashMap struct {
	Mod    uint32
	Seed   uint32
	Offset uint32
	Map    string
}

// SNATTo source-NATs to a fixed address with fully random ports ("snat ip to
// 192.0.2.10 fully-random").
type SNATTo struct{ Addr netip.Addr }

// Counter counts packets and bytes.
type Counter struct{}

// MatchFibSaddrLocal matches packets whose source is a local address ("fib saddr type
// local").
type MatchFibSaddrLocal struct{}

// MatchNumgen matches with probability 1/Mod ("numgen random mod Mod 0").
type MatchNumgen struct{ Mod uint32 }

// DNATTo destination-NATs to a fixed address and port.
type DNATTo struct {
	Addr netip.Addr
	Port uint16
}

// UpdateSaddr adds the packet's source address to the dynamic set Set, or refreshes its
// timeout ("update @s { ip saddr }").
type UpdateSaddr struct{ Set string }

func (MatchPrefix) isStmt()             {}
func (MatchIifname) isStmt()            {}
func (MatchL4Proto) isStmt()            {}
func (MatchCtStateNew) isStmt()         {}
func (MatchCtStatusDNAT) isStmt()       {}
func (MatchCtStateEstablished) isStmt() {}
func (FlowOffload) isStmt()             {}
func (MatchMarkUnset) isStmt()          {}
func (MatchFibDaddrLocal) isStmt()      {}
func (Lookup) isStmt()                  {}
func (VMap) isStmt()                    {}
func (Verdict) isStmt()                 {}
func (Reject) isStmt()                  {}
func (SetMarkBits) isStmt()             {}
func (Masquerade) isStmt()              {}
func (DNATNumgenMap) isStmt()           {}
func (DNATKeyMap) isStmt()              {}
func (DNATHashMap) isStmt()             {}
func (SNATTo) isStmt()                  {}
func (Counter) isStmt()                 {}
func (MatchFibSaddrLocal) isStmt()      {}
func (MatchNumgen) isStmt()             {}
func (DNATTo) isStmt()                  {}
func (UpdateSaddr) isStmt()             {}

// AllStmtKinds lists one value of every statement kind, for table tests that prove each
// consumer handles them all.
func AllStmtKinds() []Stmt {
	return []Stmt{
		MatchPrefix{Field: FieldSaddr, Op: OpNeq, Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		MatchIifname{Op: OpNeq, Name: "veth", Prefix: true},
		MatchL4Proto{Proto: 6},
		MatchCtStateNew{},
		MatchCtStatusDNAT{},
		MatchMarkUnset{Bits: 0x4000},
		MatchFibDaddrLocal{},
		Lookup{Fields: []Field{FieldSaddr, FieldDaddr}, Set: "s"},
		VMap{Fields: []Field{FieldDaddr, FieldL4Proto, FieldTHDport}, Map: "m"},
		Verdict{Kind: Jump, Chain: "c"},
		Reject{},
		SetMarkBits{Bits: 0x4000},
		Masquerade{FullyRandom: true},
		DNATNumgenMap{Mod: 2, Offset: 100, Map: "m"},
		DNATKeyMap{Fields: []Field{FieldDaddr, FieldL4Proto, FieldTHDport}, Mod: 3, Map: "m"},
		DNATHashMap{Mod: 4093, Seed: 0x6e667470, Offset: 256, Map: "m"},
		Counter{},
		MatchFibSaddrLocal{},
		MatchNumgen{Mod: 3},
		DNATTo{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080},
		UpdateSaddr{Set: "a"},
		SNATTo{Addr: netip.MustParseAddr("192.0.2.10")},
		MatchCtStateEstablished{},
		FlowOffload{Flowtable: "ft"},
	}
}
