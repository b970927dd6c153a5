package wire

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// recorder is a Peer that keeps the transactions it gets and refuses the messages
// refuse names.
type recorder struct {
	txns   [][]Msg
	refuse func(i int, m Msg) error
	tables []*TableState
	gen    uint32
}

func (r *recorder) Transaction(msgs []Msg) []MsgError {
	r.txns = append(r.txns, msgs)
	var out []MsgError
	for i, m := range msgs {
		if r.refuse != nil {
			if err := r.refuse(i, m); err != nil {
				out = append(out, MsgError{i, err})
			}
		}
	}
	return out
}

func (r *recorder) Tables(fam nft.Family) []*TableState {
	var out []*TableState
	for _, t := range r.tables {
		if t.Family == fam {
			out = append(out, t)
		}
	}
	return out
}

func (r *recorder) Generation() uint32 { return r.gen }

// peerRuleset has a base chain, a regular chain, a verdict map, an address map and a
// dynamic set.
func peerRuleset() *nft.Ruleset {
	a := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
	return &nft.Ruleset{Family: nft.IPv4, Table: "t",
		Sets: []*nft.Set{
			{Name: "vm", Key: []nft.Datatype{nft.TypeIPv4Addr}, Data: []nft.Datatype{nft.TypeVerdict},
				Elements: []nft.Element{{Key: []nft.Value{a("10.0.0.1")}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "c"}}}},
			{Name: "eps", Key: []nft.Datatype{nft.TypeNumgen}, Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService},
				Elements: []nft.Element{{Key: []nft.Value{nft.Num(0)}, Data: []nft.Value{a("10.244.1.2"), nft.Num(8080)}}}},
			{Name: "aff", Key: []nft.Datatype{nft.TypeIPv4Addr}, Dynamic: true, Timeout: 10800},
		},
		Chains: []*nft.Chain{
			{Name: "c", Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.UpdateSaddr{Set: "aff"}, nft.DNATNumgenMap{Mod: 1, Map: "eps"}}}}},
			{Name: "entry", Hook: &nft.Hook{Type: nft.TypeNAT, Hook: nft.Prerouting, Priority: -100}, Rules: []nft.Rule{
				{Stmts: []nft.Stmt{nft.VMap{Fields: []nft.Field{nft.FieldDaddr}, Map: "vm"}}},
				{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: "aff"}, nft.Verdict{Kind: nft.Jump, Chain: "c"}}},
			}},
		},
	}
}

// fullBatch is every kind of message a transaction has: a table, chains, sets and
// elements added, then flushed and deleted.
func fullBatch(t *testing.T) *Batch {
	t.Helper()
	rs := peerRuleset()
	b := NewBatch(rs.Family, rs.Table)
	b.AddTable()
	for _, s := range rs.Sets {
		b.AddSet(s)
	}
	for _, c := range rs.Chains {
		b.AddChain(c)
	}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if err := b.AddRule(c.Name, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range rs.Sets[:2] {
		es := []*nft.Element{&s.Elements[0]}
		if err := b.Elems(s, es, false); err != nil {
			t.Fatal(err)
		}
		if err := b.Elems(s, es, true); err != nil {
			t.Fatal(err)
		}
	}
	b.FlushSet("aff")
	b.FlushChain("c")
	b.DelChain("c")
	b.DelSet("eps")
	b.DelTable()
	return b
}

// A batch sent on a peer connection reaches the peer as one transaction, every message
// parsed as the encoder wrote it.
func TestPeerGetsTheBatch(t *testing.T) {
	p := &recorder{}
	c := DialPeer(p)
	defer c.Close()
	if err := fullBatch(t).Send(c); err != nil {
		t.Fatal(err)
	}
	if len(p.txns) != 1 {
		t.Fatalf("%d transactions, want 1", len(p.txns))
	}
	var got []string
	for _, m := range p.txns[0] {
		if m.Family != nft.IPv4 || m.Table != "t" {
			t.Errorf("message %d in %s %s", m.Type, m.Family, m.Table)
		}
		s := fmt.Sprintf("%d %s", m.Type, m.Name)
		switch {
		case m.Chain != nil:
			s += fmt.Sprintf(" hook=%v", m.Chain.Hook != nil)
		case m.Rule != nil:
			s += fmt.Sprintf(" exprs=%d", len(m.Rule.Exprs))
		case m.Set != nil:
			s += fmt.Sprintf(" map=%v verdicts=%v dynamic=%v", m.Set.IsMap(), m.Set.Verdicts(), m.Set.Dynamic())
		case m.Elems != nil:
			s += fmt.Sprintf(" elems=%d", len(m.Elems))
		}
		got = append(got, s)
	}
	want := []string{
		fmt.Sprintf("%d ", unix.NFT_MSG_NEWTABLE),
		fmt.Sprintf("%d vm map=true verdicts=true dynamic=false", unix.NFT_MSG_NEWSET),
		fmt.Sprintf("%d eps map=true verdicts=false dynamic=false", unix.NFT_MSG_NEWSET),
		fmt.Sprintf("%d aff map=false verdicts=false dynamic=true", unix.NFT_MSG_NEWSET),
		fmt.Sprintf("%d c hook=false", unix.NFT_MSG_NEWCHAIN),
		fmt.Sprintf("%d entry hook=true", unix.NFT_MSG_NEWCHAIN),
		fmt.Sprintf("%d c exprs=5", unix.NFT_MSG_NEWRULE),
		fmt.Sprintf("%d entry exprs=2", unix.NFT_MSG_NEWRULE),
		fmt.Sprintf("%d entry exprs=3", unix.NFT_MSG_NEWRULE),
		fmt.Sprintf("%d vm elems=1", unix.NFT_MSG_NEWSETELEM),
		fmt.Sprintf("%d vm elems=1", unix.NFT_MSG_DELSETELEM),
		fmt.Sprintf("%d eps elems=1", unix.NFT_MSG_NEWSETELEM),
		fmt.Sprintf("%d eps elems=1", unix.NFT_MSG_DELSETELEM),
		fmt.Sprintf("%d aff", unix.NFT_MSG_DELSETELEM),
		fmt.Sprintf("%d c", unix.NFT_MSG_DELRULE),
		fmt.Sprintf("%d c", unix.NFT_MSG_DELCHAIN),
		fmt.Sprintf("%d eps", unix.NFT_MSG_DELSET),
		fmt.Sprintf("%d ", unix.NFT_MSG_DELTABLE),
	}
	if !slices.Equal(got, want) {
		t.Errorf("the peer got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// the elements as encoded: the verdict map's goto, the address map's value
	msgs := p.txns[0]
	if e := msgs[9].Elems[0]; !e.Verdict || e.VerdictChain != "c" || len(e.Key) != 4 {
		t.Errorf("verdict map element %+v", e)
	}
	if e := msgs[11].Elems[0]; e.Verdict || len(e.Data) != 8 || len(e.Key) != 4 {
		t.Errorf("map element %+v", e)
	}
	// the rules' references
	chains, sets := RuleRefs(*msgs[6].Rule)
	if len(chains) != 0 || !reflect.DeepEqual(sets, []SetRef{{Set: "aff", Update: true}, {Set: "eps", Values: true}}) {
		t.Errorf("chain c's rule refers to %v, %+v", chains, sets)
	}
	chains, sets = RuleRefs(*msgs[7].Rule)
	if len(chains) != 0 || !reflect.DeepEqual(sets, []SetRef{{Set: "vm", Verdicts: true}}) {
		t.Errorf("the vmap rule refers to %v, %+v", chains, sets)
	}
	chains, sets = RuleRefs(*msgs[8].Rule)
	if !slices.Equal(chains, []string{"c"}) || !reflect.DeepEqual(sets, []SetRef{{Set: "aff"}}) {
		t.Errorf("the lookup and jump rule refers to %v, %+v", chains, sets)
	}
}

// A refusal comes back as the kernel's does: a RejectedError with each refused
// message's errno and the peer's text, whichever message it was.
func TestPeerRefusal(t *testing.T) {
	for _, at := range []int{0, 5, 17} { // first, middle, last (the one acknowledged)
		p := &recorder{refuse: func(i int, m Msg) error {
			if i == at {
				return fmt.Errorf("message %d: %w", i, syscall.EBUSY)
			}
			return nil
		}}
		c := DialPeer(p)
		err := fullBatch(t).Send(c)
		c.Close()
		var rejected *RejectedError
		if !errors.As(err, &rejected) || !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), fmt.Sprintf("message %d: device or resource busy", at)) {
			t.Errorf("refusing message %d: %v", at, err)
		}
	}
	// two refused messages: both reported
	p := &recorder{refuse: func(i int, m Msg) error {
		switch i {
		case 1:
			return syscall.EEXIST
		case 2:
			return errors.New("no errno") // EINVAL
		}
		return nil
	}}
	c := DialPeer(p)
	defer c.Close()
	err := fullBatch(t).Send(c)
	if !errors.Is(err, syscall.EEXIST) || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("two refusals: %v", err)
	}
	// the connection serves the next transaction
	p.refuse = nil
	if err := fullBatch(t).Send(c); err != nil {
		t.Errorf("after a refusal: %v", err)
	}
}

// GETGEN and the dumps of tables, chains and sets are answered from the peer's tables;
// other dumps are refused with EOPNOTSUPP.
func TestPeerQueries(t *testing.T) {
	st, err := EncodeState(peerRuleset())
	if err != nil {
		t.Fatal(err)
	}
	other := newTableState(nft.IPv4, "u")
	six := newTableState(nft.IPv6, "t")
	p := &recorder{tables: []*TableState{st, other, six}, gen: 41}
	c := DialPeer(p)
	defer c.Close()
	if gen, err := GenID(c); err != nil || gen != 41 {
		t.Errorf("GenID: %d, %v", gen, err)
	}
	if names, err := TableNames(c, nft.IPv4); err != nil || !slices.Equal(names, []string{"t", "u"}) {
		t.Errorf("TableNames: %v, %v", names, err)
	}
	if names, err := TableNames(c, nft.IPv6); err != nil || !slices.Equal(names, []string{"t"}) {
		t.Errorf("TableNames ip6: %v, %v", names, err)
	}
	if chains, err := ChainNames(c, nft.IPv4); err != nil || !reflect.DeepEqual(chains, map[string][]string{"t": {"c", "entry"}}) {
		t.Errorf("ChainNames: %v, %v", chains, err)
	}
	if sets, err := SetNames(c, nft.IPv4, "t"); err != nil || !slices.Equal(sets, []string{"aff", "eps", "vm"}) {
		t.Errorf("SetNames: %v, %v", sets, err)
	}
	if sets, err := SetNames(c, nft.IPv4, "u"); err != nil || len(sets) != 0 {
		t.Errorf("SetNames of an empty table: %v, %v", sets, err)
	}
	if _, _, err := RuleCounters(c, nft.IPv4, "t", "entry"); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("a rule dump: %v, want EOPNOTSUPP", err)
	}
	// and the connection still answers after a refused request
	if gen, err := GenID(c); err != nil || gen != 41 {
		t.Errorf("GenID after a refused dump: %d, %v", gen, err)
	}
}

// Every peer connection has a port of its own, and closing it forgets it.
func TestPeerPorts(t *testing.T) {
	p := &recorder{}
	a, b := DialPeer(p), DialPeer(p)
	pa, err := PortOf(a)
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := PortOf(b)
	if pa == pb || pa == 0 {
		t.Errorf("ports %d and %d", pa, pb)
	}
	if err := sizeBuffers(a, 1<<30); err != nil {
		t.Errorf("sizing a peer connection's buffers: %v", err)
	}
	a.Close()
	if peerOf(a) != nil || peerOf(b) == nil {
		t.Error("closing one connection did not forget it alone")
	}
	b.Close()
}

// ParseMsg refuses what it cannot parse.
func TestParseMsgErrors(t *testing.T) {
	if _, err := ParseMsg(unix.NFT_MSG_GETGEN, nft.IPv4, nil); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("a GETGEN in a batch: %v", err)
	}
	if _, err := ParseMsg(unix.NFT_MSG_NEWRULE, nft.IPv4, []byte{200, 0, 1}); err == nil {
		t.Error("a truncated rule parsed")
	}
}

// SameSetDef compares every part of a definition and nothing of the elements.
func TestSameSetDef(t *testing.T) {
	st, err := EncodeState(peerRuleset())
	if err != nil {
		t.Fatal(err)
	}
	base := st.Sets["eps"]
	if !SameSetDef(base, base) {
		t.Fatal("a set differs from itself")
	}
	emptied := *base
	emptied.Elements = nil
	if !SameSetDef(base, &emptied) {
		t.Error("elements compared")
	}
	for name, change := range map[string]func(s *SetState){
		"flags": func(s *SetState) { s.Flags ^= unix.NFT_SET_TIMEOUT }, "key type": func(s *SetState) { s.KeyType++ },
		"key length": func(s *SetState) { s.KeyLen++ }, "data type": func(s *SetState) { s.DataType++ },
		"data length": func(s *SetState) { s.DataLen++ }, "timeout": func(s *SetState) { s.Timeout++ },
		"size": func(s *SetState) { s.Size++ }, "userdata": func(s *SetState) { s.UserData = append(s.UserData, 0) },
		"expressions": func(s *SetState) { s.Exprs = append(s.Exprs, "counter") },
	} {
		c := *base
		change(&c)
		if SameSetDef(base, &c) {
			t.Errorf("a different %s is the same definition", name)
		}
	}
}
