package wire

import (
	"bytes"
	"net/netip"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file turns a table read back from the kernel into typed values (nft.Ruleset), so
// that what is programmed can be shown in nft syntax (nft.Render, nft.RenderRule) and
// walked by meaning (nftproxy list). Rules are decoded by guess and check: the
// expressions at a position suggest a statement, the statement is encoded as the applier
// would encode it, and it is accepted only when that encoding is the same as the kernel's
// expressions (compared as Verify compares). A rule nftproxy could not have written is
// reported as undecodable, never guessed.

// Decode returns the table as a Ruleset: chains with hooks and decoded rules, sets with
// their types, flags and elements (sorted by key bytes). undecoded names the rules no
// statement sequence encodes to ("chain c rule 3"); those rules are left out.
func Decode(st *TableState) (rs *nft.Ruleset, undecoded []string) {
	rs = &nft.Ruleset{Family: st.Family, Table: st.Name}
	for _, name := range sortedKeys(st.Sets) {
		rs.Sets = append(rs.Sets, decodeSet(st.Sets[name]))
	}
	var regular, base []*nft.Chain
	for _, name := range sortedKeys(st.Chains) {
		c := st.Chains[name]
		ch := &nft.Chain{Name: name}
		if c.Hook != nil {
			ch.Hook = &nft.Hook{Type: nft.ChainType(c.Hook.Type), Hook: nft.HookPoint(c.Hook.Hooknum), Priority: c.Hook.Priority}
		}
		for i, r := range c.Rules {
			rule, ok := DecodeRule(st.Family, r)
			if !ok {
				undecoded = append(undecoded, "chain "+name+" rule "+strconv.Itoa(i))
				continue
			}
			ch.Rules = append(ch.Rules, rule)
		}
		if ch.Hook != nil {
			base = append(base, ch)
		} else {
			regular = append(regular, ch)
		}
	}
	rs.Chains = append(regular, base...)
	for _, name := range sortedKeys(st.Flowtables) {
		rs.Flowtables = append(rs.Flowtables, decodeFlowtable(st.Flowtables[name]))
	}
	return rs, undecoded
}

// decodeSet reverses addSet and elems for the types nftproxy uses; fields it cannot
// type are left empty and their elements keep no values.
func decodeSet(s *SetState) *nft.Set {
	out := &nft.Set{
		Name:     s.Name,
		Key:      TypesOf(s.KeyType, s.KeyLen),
		Comment:  udataStringTLV(s.UserData, udataSetComment),
		Dynamic:  s.Flags&unix.NFT_SET_EVAL != 0,
		Timeout:  uint32(s.Timeout / 1000),
		Size:     s.Size,
		Counter:  slices.Contains(s.Exprs, "counter"),
		Interval: s.Flags&unix.NFT_SET_INTERVAL != 0,
	}
	switch {
	case s.Flags&unix.NFT_SET_MAP == 0:
	case s.DataType == unix.NFT_DATA_VERDICT:
		out.Data = []nft.Datatype{nft.TypeVerdict}
	default:
		out.Data = TypesOf(s.DataType, s.DataLen)
	}
	keys := sortedKeys(s.Elements)
	slices.SortFunc(keys, func(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) })
	if out.Interval {
		out.Elements = decodeRanges(out.Key, s, keys)
		return out
	}
	for _, k := range keys {
		e := s.Elements[k]
		el := nft.Element{Comment: CommentOf(e.UserData)}
		el.Key, _ = decodeValues(out.Key, e.Key)
		switch {
		case e.Verdict:
			v := decodeVerdictKind(e)
			el.Verdict = &v
		case e.Data != nil:
			el.Data, _ = decodeValues(out.Data, e.Data)
		}
		out.Elements = append(out.Elements, el)
	}
	return out
}

// decodeRanges pairs an interval set's elements, in address order, into ranges: a start
// runs to the address before the next element (an interval's end), or to the family's
// last address when none follows.
func decodeRanges(key []nft.Datatype, s *SetState, keys []string) []nft.Element {
	var out []nft.Element
	for i := 0; i < len(keys); i++ {
		e := s.Elements[keys[i]]
		if e.Flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
			continue // an end without a start (the kernel's own zero element, if any)
		}
		first, _ := decodeValues(key, e.Key)
		if len(first) != 1 {
			continue
		}
		last := lastOf(first[0].Addr())
		if i+1 < len(keys) {
			if n := s.Elements[keys[i+1]]; n.Flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
				end, _ := decodeValues(key, n.Key)
				if len(end) == 1 {
					last = end[0].Addr().Prev()
					i++
				}
			}
		}
		out = append(out, nft.Element{Key: first, Data: []nft.Value{nft.Addr(last)}, Comment: CommentOf(e.UserData)})
	}
	return out
}

// lastOf is the last address of a's family.
func lastOf(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	var b [16]byte
	for i := range b {
		b[i] = 0xff
	}
	return netip.AddrFrom16(b)
}

// udataStringTLV returns the string TLV typ of set userdata.
func udataStringTLV(u []byte, typ byte) string {
	for len(u) >= 2 {
		t, n := u[0], int(u[1])
		if len(u) < 2+n {
			break
		}
		if t == typ {
			return cstring(u[2 : 2+n])
		}
		u = u[2+n:]
	}
	return ""
}

func decodeVerdictKind(e ElemState) nft.Verdict {
	switch e.VerdictCode {
	case nfAccept:
		return nft.Verdict{Kind: nft.Accept}
	case nfDrop:
		return nft.Verdict{Kind: nft.Drop}
	case verdictReturn:
		return nft.Verdict{Kind: nft.Return}
	case verdictJump:
		return nft.Verdict{Kind: nft.Jump, Chain: e.VerdictChain}
	case verdictGoto:
		return nft.Verdict{Kind: nft.Goto, Chain: e.VerdictChain}
	}
	return nft.Verdict{}
}

// DecodeRule turns a rule's expressions into statements; ok is false when some
// expressions are not an encoding of any statement (a rule another program wrote).
func DecodeRule(fam nft.Family, r RuleState) (rule nft.Rule, ok bool) {
	rule.Comment = CommentOf(r.UserData)
	for i := 0; i < len(r.Exprs); {
		s, n := decodeStmt(fam, r.Exprs[i:])
		if n == 0 {
			return nft.Rule{}, false
		}
		rule.Stmts = append(rule.Stmts, s)
		i += n
	}
	return rule, true
}

// decodeStmt finds the statement the expressions start with and how many it spans.
func decodeStmt(fam nft.Family, es []ExprState) (nft.Stmt, int) {
	for _, s := range candidates(fam, es) {
		enc, err := encodeStmt(fam, s)
		if err != nil || len(enc) > len(es) {
			continue
		}
		if RuleKey(RuleState{Exprs: enc}) == RuleKey(RuleState{Exprs: es[:len(enc)]}) {
			return s, len(enc)
		}
	}
	return nil, 0
}

// encodeStmt is a statement's expressions as the kernel dumps them: the statement
// encoded alone, as AddRule encodes it, and parsed back.
func encodeStmt(fam nft.Family, s nft.Stmt) ([]ExprState, error) {
	b := &Batch{fam: fam}
	if err := b.AddRule("", nft.Rule{Stmts: []nft.Stmt{s}}); err != nil {
		return nil, err
	}
	st := newTableState(fam, "")
	if err := b.each(func(_ uint16, payload []byte) error { return st.addRuleMsg(payload) }); err != nil {
		return nil, err
	}
	return st.Chains[""].Rules[0].Exprs, nil
}

// loadField reports which field a payload or meta expression loads.
func loadField(fam nft.Family, e ExprState) (nft.Field, bool) {
	switch e.Name {
	case "payload":
		base, off := be32(e.Attrs[unix.NFTA_PAYLOAD_BASE]), be32(e.Attrs[unix.NFTA_PAYLOAD_OFFSET])
		switch {
		case base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && off == 2:
			return nft.FieldTHDport, true
		case base != unix.NFT_PAYLOAD_NETWORK_HEADER:
		case off == 12 && fam == nft.IPv4, off == 8 && fam == nft.IPv6:
			return nft.FieldSaddr, true
		case off == 16 && fam == nft.IPv4, off == 24 && fam == nft.IPv6:
			return nft.FieldDaddr, true
		}
	case "meta":
		if be32(e.Attrs[unix.NFTA_META_KEY]) == unix.NFT_META_L4PROTO {
			return nft.FieldL4Proto, true
		}
	case "ct":
		if isCtOrigDaddr(fam, e) {
			return nft.FieldCtOrigDaddr, true
		}
	}
	return 0, false
}

// prefixFrom reads "payload [bitwise] cmp" as an address prefix match.
func prefixFrom(fam nft.Family, f nft.Field, es []ExprState) (nft.MatchPrefix, bool) {
	n := int(be32(es[0].Attrs[unix.NFTA_PAYLOAD_LEN]))
	bits := n * 8
	i := 1
	if i < len(es) && es[i].Name == "bitwise" {
		mask := bitwiseValue(es[i], unix.NFTA_BITWISE_MASK)
		bits = 0
		for _, b := range mask {
			for ; b&0x80 != 0; b <<= 1 {
				bits++
			}
		}
		i++
	}
	if i >= len(es) || es[i].Name != "cmp" {
		return nft.MatchPrefix{}, false
	}
	full := make([]byte, 4)
	if fam == nft.IPv6 {
		full = make([]byte, 16)
	}
	d := cmpValue(es[i])
	if len(d) > len(full) {
		return nft.MatchPrefix{}, false
	}
	copy(full, d)
	a, _ := netip.AddrFromSlice(full)
	op := nft.OpEq
	if be32(es[i].Attrs[unix.NFTA_CMP_OP]) == unix.NFT_CMP_NEQ {
		op = nft.OpNeq
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return nft.MatchPrefix{}, false
	}
	return nft.MatchPrefix{Field: f, Op: op, Prefix: p}, true
}

func cmpValue(e ExprState) []byte {
	if e.Name != "cmp" {
		return nil
	}
	return dataValue(e.Attrs[unix.NFTA_CMP_DATA])
}

func bitwiseValue(e ExprState, attr uint16) []byte {
	if e.Name != "bitwise" {
		return nil
	}
	return dataValue(e.Attrs[attr])
}

// dataValue returns the NFTA_DATA_VALUE inside nested data attributes.
func dataValue(b []byte) []byte {
	ad, err := decoder(b)
	if err != nil {
		return nil
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_DATA_VALUE {
			return ad.Bytes()
		}
	}
	return nil
}

func immediateVerdictOf(e ExprState) (nft.Verdict, bool) {
	ad, err := decoder(e.Attrs[unix.NFTA_IMMEDIATE_DATA])
	if err != nil {
		return nft.Verdict{}, false
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_DATA_VERDICT {
			v := decodeVerdictKind(decodeVerdict(ad.Bytes()))
			return v, v.Kind != 0
		}
	}
	return nft.Verdict{}, false
}

// SetDef is a set's definition as a typed value, without its elements.
func SetDef(s *SetState) *nft.Set {
	return decodeSet(&SetState{Name: s.Name, Flags: s.Flags, KeyType: s.KeyType, KeyLen: s.KeyLen, DataType: s.DataType,
		DataLen: s.DataLen, Timeout: s.Timeout, Size: s.Size, UserData: s.UserData, Exprs: s.Exprs})
}
