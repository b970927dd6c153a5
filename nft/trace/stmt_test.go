package trace

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

var v4 = nft.TypeIPv4Addr

// testPacket is a TCP packet from 10.0.0.1 to 10.0.0.2:80 arriving from the network.
var testPacket = Packet{Family: nft.IPv4, Saddr: ip("10.0.0.1"), Daddr: ip("10.0.0.2"), L4Proto: 6, Dport: 80, Hook: nft.Prerouting}

// oneRule returns a table whose prerouting NAT chain has one rule of stmts, with the sets
// and chains the statements refer to; their elements match testPacket.
func oneRule(stmts ...nft.Stmt) *nft.Ruleset {
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{
		{Name: "c", Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Counter{}}}}},
		{Name: "pre", Hook: &nft.Hook{Type: nft.TypeNAT, Hook: nft.Prerouting, Priority: -100}, Rules: []nft.Rule{{Stmts: stmts}}},
	}}
	for _, s := range stmts {
		switch s := s.(type) {
		case nft.Lookup:
			rs.Sets = append(rs.Sets, &nft.Set{Name: s.Set, Key: keyTypes(s.Fields), Elements: []nft.Element{{Key: keyOf(s.Fields)}}})
		case nft.VMap:
			rs.Sets = append(rs.Sets, &nft.Set{Name: s.Map, Key: keyTypes(s.Fields), Data: []nft.Datatype{nft.TypeVerdict},
				Elements: []nft.Element{{Key: keyOf(s.Fields), Verdict: &nft.Verdict{Kind: nft.Jump, Chain: "c"}}}})
		case nft.DNATNumgenMap:
			m := &nft.Set{Name: s.Map, Key: []nft.Datatype{nft.TypeNumgen}, Data: []nft.Datatype{v4, nft.TypeInetService}}
			for i := range s.Mod {
				m.Elements = append(m.Elements, nft.Element{Key: []nft.Value{nft.Num(s.Offset + i)}, Data: []nft.Value{nft.Addr(ip(fmt.Sprintf("10.1.0.%d", i+1))), nft.Num(8080)}})
			}
			rs.Sets = append(rs.Sets, m)
		case nft.DNATHashMap:
			// a table of two endpoints taking turns, its last slot empty
			m := &nft.Set{Name: s.Map, Key: []nft.Datatype{nft.TypeNumgen}, Data: []nft.Datatype{v4, nft.TypeInetService}}
			for i := range s.Mod - 1 {
				m.Elements = append(m.Elements, nft.Element{Key: []nft.Value{nft.Num(s.Offset + i)}, Data: []nft.Value{nft.Addr(ip(fmt.Sprintf("10.1.0.%d", 1+i%2))), nft.Num(8080)}})
			}
			rs.Sets = append(rs.Sets, m)
		case nft.DNATKeyMap:
			// entries at every index but the last: the last one misses
			m := &nft.Set{Name: s.Map, Key: append(keyTypes(s.Fields), nft.TypeNumgen), Data: []nft.Datatype{v4, nft.TypeInetService}}
			for i := range s.Mod - 1 {
				m.Elements = append(m.Elements, nft.Element{Key: append(keyOf(s.Fields), nft.Num(i)), Data: []nft.Value{nft.Addr(ip(fmt.Sprintf("10.1.0.%d", i+1))), nft.Num(8080)}})
			}
			rs.Sets = append(rs.Sets, m)
		case nft.UpdateSaddr:
			rs.Sets = append(rs.Sets, &nft.Set{Name: s.Set, Key: []nft.Datatype{v4}, Dynamic: true, Timeout: 60})
		}
	}
	return rs
}

func keyTypes(fs []nft.Field) []nft.Datatype {
	types := map[nft.Field]nft.Datatype{nft.FieldSaddr: v4, nft.FieldDaddr: v4, nft.FieldL4Proto: nft.TypeInetProto, nft.FieldTHDport: nft.TypeInetService}
	out := make([]nft.Datatype, len(fs))
	for i, f := range fs {
		out[i] = types[f]
	}
	return out
}

func keyOf(fs []nft.Field) []nft.Value {
	vals := map[nft.Field]nft.Value{nft.FieldSaddr: nft.Addr(testPacket.Saddr), nft.FieldDaddr: nft.Addr(testPacket.Daddr),
		nft.FieldL4Proto: nft.Num(6), nft.FieldTHDport: nft.Num(80)}
	out := make([]nft.Value, len(fs))
	for i, f := range fs {
		out[i] = vals[f]
	}
	return out
}

// TestEveryStmtKind: the tracer evaluates every statement kind there is.
func TestEveryStmtKind(t *testing.T) {
	for _, s := range nft.AllStmtKinds() {
		t.Run(fmt.Sprintf("%T", s), func(t *testing.T) {
			res, err := Trace(oneRule(s), testPacket, Context{})
			if err != nil {
				t.Fatal(err)
			}
			checkProbabilities(t, res)
		})
	}
}

// unknownStmt is a statement kind the tracer has no case for.
type unknownStmt struct{ nft.Counter }

func TestUnsupportedStmt(t *testing.T) {
	_, err := Trace(oneRule(unknownStmt{}), testPacket, Context{})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "unknownStmt") {
		t.Errorf("err = %v, want ErrUnsupported naming the type", err)
	}
}

// TestStmtEffects checks what each statement does to the packet and the outcome.
func TestStmtEffects(t *testing.T) {
	jumpC := nft.Verdict{Kind: nft.Jump, Chain: "c"}
	for _, tc := range []struct {
		name  string
		stmts []nft.Stmt
		then  []nft.Stmt // a second rule
		want  []string
	}{
		{"prefix matches", []nft.Stmt{nft.MatchPrefix{Field: nft.FieldDaddr, Prefix: pfx("10.0.0.0/24")}, nft.Reject{}}, nil, []string{"1 reject"}},
		{"prefix != fails", []nft.Stmt{nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: pfx("10.0.0.0/24")}, nft.Reject{}}, nil, []string{"1 accept"}},
		{"l4proto fails", []nft.Stmt{nft.MatchL4Proto{Proto: 17}, nft.Reject{}}, nil, []string{"1 accept"}},
		{"ct status dnat fails before DNAT", []nft.Stmt{nft.MatchCtStatusDNAT{}, nft.Reject{}}, nil, []string{"1 accept"}},
		{"mark", []nft.Stmt{nft.SetMarkBits{Bits: 4}, nft.MatchMarkUnset{Bits: 4}, nft.Reject{}}, nil, []string{"1 accept"}},
		{"mark xor", []nft.Stmt{nft.SetMarkBits{Bits: 4}, nft.SetMarkBits{Bits: 4, Xor: true}, nft.MatchMarkUnset{Bits: 4}, nft.Reject{}}, nil, []string{"1 reject"}},
		{"fib daddr not local", []nft.Stmt{nft.MatchFibDaddrLocal{}, nft.Reject{}}, nil, []string{"1 accept"}},
		{"lookup miss", []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: "empty"}, nft.Reject{}}, nil, []string{"1 accept"}},
		{"lookup of daddr . l4proto . dport", []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Set: "k3"}, nft.Reject{}}, nil, []string{"1 reject"}},
		{"lookup of l4proto . dport", []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Set: "k2"}, nft.Reject{}}, nil, []string{"1 reject"}},
		{"numgen", []nft.Stmt{nft.MatchNumgen{Mod: 4}, nft.Verdict{Kind: nft.Drop}}, nil, []string{"0.25 drop", "0.75 accept"}},
		{"dnat map", []nft.Stmt{nft.DNATNumgenMap{Mod: 2, Offset: 7, Map: "m"}}, nil, []string{"0.5 accept 10.1.0.1:8080", "0.5 accept 10.1.0.2:8080"}},
		{"dnat key map", []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 4, Map: "m"}}, nil,
			[]string{"0.25 accept 10.1.0.1:8080", "0.25 accept 10.1.0.2:8080", "0.25 accept 10.1.0.3:8080", "0.25 accept"}},
		{"dnat key map miss goes on", []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: "m"}},
			[]nft.Stmt{nft.Reject{}}, []string{"0.5 accept 10.1.0.1:8080", "0.5 reject"}},
		{"dnat hash map: one branch per endpoint, by its share of the slots", []nft.Stmt{nft.DNATHashMap{Mod: 5, Offset: 7, Map: "m"}}, []nft.Stmt{nft.Reject{}},
			[]string{"0.4 accept 10.1.0.1:8080", "0.4 accept 10.1.0.2:8080", "0.2 reject"}},
		{"dnat to", []nft.Stmt{nft.DNATTo{Addr: ip("10.9.9.9"), Port: 99}, nft.Reject{}}, nil, []string{"1 accept 10.9.9.9:99"}},
		{"masquerade", []nft.Stmt{nft.Masquerade{}, nft.Reject{}}, nil, []string{"1 accept masq"}},
		{"return goes on after the jump's rule", []nft.Stmt{jumpC}, []nft.Stmt{nft.Reject{}}, []string{"1 reject"}},
		{"goto does not come back", []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "c"}}, []nft.Stmt{nft.Reject{}}, []string{"1 accept"}},
		{"accept", []nft.Stmt{nft.Verdict{Kind: nft.Accept}, nft.Reject{}}, nil, []string{"1 accept"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := oneRule(tc.stmts...)
			rs.Sets = append(rs.Sets, &nft.Set{Name: "empty", Key: []nft.Datatype{v4}})
			if tc.then != nil {
				base := rs.Chains[1]
				base.Rules = append(base.Rules, nft.Rule{Stmts: tc.then})
			}
			res, err := Trace(rs, testPacket, Context{})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(summary(res), ", "); got != strings.Join(tc.want, ", ") {
				t.Errorf("got %s, want %s", got, strings.Join(tc.want, ", "))
			}
		})
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestTraceErrors(t *testing.T) {
	loop := oneRule(nft.Verdict{Kind: nft.Goto, Chain: "c"})
	loop.Chains[0].Rules = []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "c"}}}}
	deep := oneRule(nft.Verdict{Kind: nft.Jump, Chain: "c"})
	deep.Chains[0].Rules = []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "c"}}}}
	for _, tc := range []struct {
		name string
		rs   *nft.Ruleset
		pkt  Packet
		want string
	}{
		{"missing chain", oneRule(nft.Verdict{Kind: nft.Jump, Chain: "nope"}), testPacket, "chain nope, which does not exist"},
		{"missing set", withSet(oneRule(nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: "nope"})), testPacket, "set nope does not exist"},
		{"key arity", withSet(oneRule(nft.Lookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: "empty"})), testPacket, "whose key has 1"},
		{"key type", withSet(oneRule(nft.Lookup{Fields: []nft.Field{nft.FieldTHDport}, Set: "empty"})), testPacket, "the key wants"},
		{"key map missing", withSet(oneRule(nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: "nope"})), testPacket, "map nope does not exist"},
		{"key map shape", withSet(oneRule(nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: "empty"})), testPacket, "not a map of 2 fields . index"},
		{"key map field type", keyMapOf([]nft.Datatype{v4, nft.TypeNumgen}), testPacket, "the key wants"},
		{"goto loop", loop, testPacket, "does not end"},
		{"jump loop", deep, testPacket, "nested jumps"},
		{"family", oneRule(), Packet{Family: nft.IPv6, Saddr: ip("::1"), Daddr: ip("::2"), Hook: nft.Prerouting}, "ip6 packet in an ip table"},
		{"no source", oneRule(), Packet{Family: nft.IPv4, Daddr: ip("10.0.0.2"), Hook: nft.Prerouting}, "are not both ip"},
		{"hook", oneRule(), Packet{Family: nft.IPv4, Saddr: ip("10.0.0.1"), Daddr: ip("10.0.0.2"), Hook: nft.Forward}, "not forward"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Trace(tc.rs, tc.pkt, Context{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// keyMapOf is a rule "dnat ip to th dport . numgen random mod 2 map @m" with m keyed by key.
func keyMapOf(key []nft.Datatype) *nft.Ruleset {
	rs := oneRule(nft.DNATKeyMap{Fields: []nft.Field{nft.FieldTHDport}, Mod: 2, Map: "m"})
	rs.Sets = []*nft.Set{{Name: "m", Key: key, Data: []nft.Datatype{v4, nft.TypeInetService}}}
	return rs
}

// withSet replaces the sets of rs by one set "empty" of IPv4 addresses.
func withSet(rs *nft.Ruleset) *nft.Ruleset {
	rs.Sets = []*nft.Set{{Name: "empty", Key: []nft.Datatype{v4}}}
	return rs
}

// TestHookOrder: base chains run by hook and priority, whatever their order in the table;
// a locally generated packet to a local address is delivered through input, without NAT.
func TestHookOrder(t *testing.T) {
	chain := func(name string, typ nft.ChainType, h nft.HookPoint, prio int32) *nft.Chain {
		return &nft.Chain{Name: name, Hook: &nft.Hook{Type: typ, Hook: h, Priority: prio}, Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Counter{}}}}}
	}
	rs := &nft.Ruleset{Family: nft.IPv4, Chains: []*nft.Chain{
		chain("filter-post", nft.TypeFilter, nft.Postrouting, 0),
		chain("nat-post", nft.TypeNAT, nft.Postrouting, 100),
		chain("filter-in", nft.TypeFilter, nft.Input, 0),
		chain("nat-pre", nft.TypeNAT, nft.Prerouting, -100),
		chain("filter-pre", nft.TypeFilter, nft.Prerouting, -110),
		chain("filter-fwd", nft.TypeFilter, nft.Forward, 0),
		chain("filter-out", nft.TypeFilter, nft.Output, 0),
		chain("nat-out", nft.TypeNAT, nft.Output, -100),
	}}
	local := Context{IsLocal: func(a netip.Addr) bool { return a == ip("10.0.0.2") }}
	for _, tc := range []struct {
		name string
		hook nft.HookPoint
		ctx  Context
		want string
	}{
		{"forwarded", nft.Prerouting, Context{}, "filter-pre nat-pre filter-fwd filter-post nat-post"},
		{"to the node", nft.Prerouting, local, "filter-pre nat-pre filter-in"},
		{"from the node", nft.Output, Context{}, "nat-out filter-out filter-post nat-post"},
		{"node to itself", nft.Output, local, "nat-out filter-out filter-post nat-post filter-pre filter-in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkt := testPacket
			pkt.Hook = tc.hook
			res, err := Trace(rs, pkt, tc.ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range res.Outcomes[0].Path {
				got = append(got, s.Chain)
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("chains %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}
