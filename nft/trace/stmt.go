package trace

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/nftproxy/nftproxy/nft"
)

// stmt evaluates one statement for the first packet of a connection. Every kind of
// nft.Stmt has a case; anything else is ErrUnsupported.
func (tr *tracer) stmt(t *thread, s nft.Stmt) ([]branch, error) {
	switch s := s.(type) {
	case nft.MatchPrefix:
		return tr.matchPrefix(t, s)
	case nft.MatchIifname:
		in := t.pkt.Iifname
		if t.pkt.Hook == nft.Output {
			in = "" // no input interface
		}
		is := in == s.Name || (s.Prefix && strings.HasPrefix(in, s.Name))
		return cond(t, is == (s.Op == nft.OpEq)), nil
	case nft.MatchL4Proto:
		return cond(t, t.pkt.L4Proto == s.Proto), nil
	case nft.MatchCtStateNew:
		return cond(t, true), nil // the first packet of a connection
	case nft.MatchCtStatusDNAT:
		return cond(t, t.dnat.IsValid()), nil
	case nft.MatchCtStateEstablished:
		return cond(t, false), nil // the first packet of a connection
	case nft.FlowOffload:
		return next(t), nil // later packets may take the fast path; this one goes on
	case nft.MatchMarkUnset:
		return cond(t, t.mark&s.Bits == 0), nil
	case nft.MatchFibDaddrLocal:
		return cond(t, tr.isLocal(t.pkt.Daddr)), nil
	case nft.MatchFibSaddrLocal:
		return cond(t, tr.ctx.SaddrLocal || t.pkt.Hook == nft.Output || tr.isLocal(t.pkt.Saddr)), nil
	case nft.MatchNumgen:
		return matchNumgen(t, s)
	case nft.Lookup:
		e, err := tr.lookup(t, s.Set, s.Fields)
		return cond(t, e != nil), err
	case nft.VMap:
		return tr.vmap(t, s)
	case nft.Verdict:
		return one(t, control{kind: ctlVerdict, verdict: s}), nil
	case nft.Reject:
		return one(t, control{kind: ctlEnd, end: Reject}), nil
	case nft.SetMarkBits:
		if s.Xor {
			t.mark ^= s.Bits
		} else {
			t.mark |= s.Bits
		}
		return next(t), nil
	case nft.Masquerade:
		t.masq, t.natted = true, true
		return one(t, control{kind: ctlEnd, end: Accept}), nil // NAT statements accept
	case nft.SNATTo:
		t.masq, t.natted = true, true // the source is rewritten, as by masquerade
		return one(t, control{kind: ctlEnd, end: Accept}), nil
	case nft.DNATTo:
		return dnat(t, netip.AddrPortFrom(s.Addr, s.Port)), nil
	case nft.DNATNumgenMap:
		return tr.dnatNumgenMap(t, s)
	case nft.DNATKeyMap:
		return tr.dnatKeyMap(t, s)
	case nft.DNATHashMap:
		return tr.dnatHashMap(t, s)
	case nft.UpdateSaddr:
		// Records the client for session affinity; nothing this packet depends on.
		if tr.sets[s.Set] == nil {
			return nil, fmt.Errorf("set %s does not exist", s.Set)
		}
		return next(t), nil
	case nft.Counter:
		return next(t), nil
	}
	return nil, fmt.Errorf("%T: %w", s, ErrUnsupported)
}

func one(t *thread, ctl control) []branch { return []branch{{t: t, ctl: ctl}} }

func next(t *thread) []branch { return one(t, control{kind: ctlNext}) }

// cond continues the rule when ok, else goes on with the next rule.
func cond(t *thread, ok bool) []branch {
	if ok {
		return next(t)
	}
	return one(t, control{kind: ctlBreak})
}

func (tr *tracer) matchPrefix(t *thread, s nft.MatchPrefix) ([]branch, error) {
	var a = t.pkt.Saddr
	switch s.Field {
	case nft.FieldSaddr:
	case nft.FieldDaddr:
		a = t.pkt.Daddr
	default:
		return nil, fmt.Errorf("prefix match on field %d, not an address", s.Field)
	}
	in := s.Prefix.Contains(a)
	switch s.Op {
	case nft.OpEq:
		return cond(t, in), nil
	case nft.OpNeq:
		return cond(t, !in), nil
	}
	return nil, fmt.Errorf("unknown operator %d", s.Op)
}

// matchNumgen ("numgen random mod N 0") matches with probability 1/N.
func matchNumgen(t *thread, s nft.MatchNumgen) ([]branch, error) {
	if s.Mod == 0 {
		return nil, fmt.Errorf("numgen modulus 0")
	}
	if s.Mod == 1 {
		return next(t), nil
	}
	p := 1 / float64(s.Mod)
	return []branch{
		{t: t.fork(p), ctl: control{kind: ctlNext}},
		{t: t.fork(1 - p), ctl: control{kind: ctlBreak}},
	}, nil
}

func (tr *tracer) vmap(t *thread, s nft.VMap) ([]branch, error) {
	e, err := tr.lookup(t, s.Map, s.Fields)
	if err != nil || e == nil {
		return cond(t, false), err
	}
	if e.Verdict == nil {
		return nil, fmt.Errorf("map %s is not a verdict map", s.Map)
	}
	return one(t, control{kind: ctlVerdict, verdict: *e.Verdict}), nil
}

// dnat translates the destination; like every NAT statement it ends the chain with accept.
func dnat(t *thread, to netip.AddrPort) []branch {
	t.dnat = to
	t.pkt.Daddr, t.pkt.Dport = t.dnat.Addr(), t.dnat.Port()
	t.natted = true
	return one(t, control{kind: ctlEnd, end: Accept})
}

// slotMap is the slot → address . port map a DNAT picks from with a modulus mod of
// the kind given ("numgen", "jhash").
func (tr *tracer) slotMap(name string, mod uint32, kind string) (*nft.Set, error) {
	m := tr.sets[name]
	switch {
	case m == nil:
		return nil, fmt.Errorf("map %s does not exist", name)
	case len(m.Key) != 1 || len(m.Data) != 2:
		return nil, fmt.Errorf("map %s is not a slot → address . port map", name)
	case mod == 0:
		return nil, fmt.Errorf("%s modulus 0", kind)
	}
	return m, nil
}

// dnatNumgenMap forks into the Mod slots Offset…Offset+Mod-1, each with probability
// 1/Mod. A slot without an entry makes the rule not match, as a failed map lookup does.
func (tr *tracer) dnatNumgenMap(t *thread, s nft.DNATNumgenMap) ([]branch, error) {
	m, err := tr.slotMap(s.Map, s.Mod, "numgen")
	if err != nil {
		return nil, err
	}
	return tr.draw(t, m, s.Mod, func(i uint32) []nft.Value { return []nft.Value{nft.Num(s.Offset + i)} }), nil
}

// dnatHashMap forks, over all clients, into the endpoints of the Mod slots
// Offset…Offset+Mod-1, each with the share of the slots it fills (a Maglev table
// repeats each endpoint in many slots: one branch per endpoint, not per slot). Slots
// without an entry make the rule not match, as a failed map lookup does.
func (tr *tracer) dnatHashMap(t *thread, s nft.DNATHashMap) ([]branch, error) {
	m, err := tr.slotMap(s.Map, s.Mod, "jhash")
	if err != nil {
		return nil, err
	}
	type target struct {
		e     *nft.Element // the first slot of the endpoint
		slots int
	}
	var targets []*target
	byEndpoint := map[netip.AddrPort]*target{}
	found := 0
	for i := range m.Elements {
		e := &m.Elements[i]
		if len(e.Key) != 1 || len(e.Data) != 2 || e.Key[0].Num() < s.Offset || e.Key[0].Num()-s.Offset >= s.Mod {
			continue
		}
		found++
		ap := netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num()))
		if byEndpoint[ap] == nil {
			byEndpoint[ap] = &target{e: e}
			targets = append(targets, byEndpoint[ap])
		}
		byEndpoint[ap].slots++
	}
	var out []branch
	for _, tg := range targets {
		f := t.fork(float64(tg.slots) / float64(s.Mod))
		f.matched = append(f.matched, match(tr.fam, m, *tg.e))
		out = append(out, dnat(f, netip.AddrPortFrom(tg.e.Data[0].Addr(), uint16(tg.e.Data[1].Num())))...)
	}
	if missing := int(s.Mod) - found; missing > 0 {
		out = append(out, branch{t: t.fork(float64(missing) / float64(s.Mod)), ctl: control{kind: ctlBreak}})
	}
	return out, nil
}

// dnatKeyMap forks into the Mod indexes 0…Mod-1 of the packet's own key (its Fields as
// the thread sees them), each with probability 1/Mod. An index without an entry makes
// the rule not match, as a failed map lookup does: the packet goes on unchanged.
func (tr *tracer) dnatKeyMap(t *thread, s nft.DNATKeyMap) ([]branch, error) {
	m := tr.sets[s.Map]
	switch {
	case m == nil:
		return nil, fmt.Errorf("map %s does not exist", s.Map)
	case len(m.Key) != len(s.Fields)+1 || m.Key[len(s.Fields)] != nft.TypeNumgen || len(m.Data) != 2:
		return nil, fmt.Errorf("map %s is not a map of %d fields . index → address . port", s.Map, len(s.Fields))
	case s.Mod == 0:
		return nil, fmt.Errorf("numgen modulus 0")
	}
	key := make([]nft.Value, len(m.Key))
	for i, f := range s.Fields {
		v, err := t.field(f, m.Key[i])
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", s.Map, err)
		}
		key[i] = v
	}
	return tr.draw(t, m, s.Mod, func(i uint32) []nft.Value {
		key[len(key)-1] = nft.Num(i)
		return key
	}), nil
}

// draw forks t into mod branches of probability 1/mod, branch i translating to the
// address . port of m's entry at key(i); an index without an entry makes the rule not
// match, as a failed map lookup does.
func (tr *tracer) draw(t *thread, m *nft.Set, mod uint32, key func(i uint32) []nft.Value) []branch {
	out := make([]branch, 0, mod)
	for i := range mod {
		f := t.fork(1 / float64(mod))
		e := find(m, key(i))
		if e == nil {
			out = append(out, branch{t: f, ctl: control{kind: ctlBreak}})
			continue
		}
		f.matched = append(f.matched, match(tr.fam, m, *e))
		out = append(out, dnat(f, netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num())))...)
	}
	return out
}
