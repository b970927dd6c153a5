package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// The statement encoding through github.com/google/nftables/expr that nft/wire used
// until it wrote expressions itself: TestExpressionsAsBefore holds the new encoder to
// these bytes, expression by expression.

// exprs encodes one rule's statements.
func refExprs(fam nft.Family, r nft.Rule) ([]expr.Any, error) {
	var out []expr.Any
	for _, s := range r.Stmts {
		e, err := refStmtExprs(fam, s)
		if err != nil {
			return nil, err
		}
		out = append(out, e...)
	}
	return out, nil
}

func refStmtExprs(fam nft.Family, s nft.Stmt) ([]expr.Any, error) {
	switch s := s.(type) {
	case nft.MatchPrefix:
		return refPrefixMatch(fam, s), nil
	case nft.MatchIifname:
		name := []byte(s.Name)
		if !s.Prefix {
			name = make([]byte, 16)
			copy(name, s.Name)
		}
		op := expr.CmpOpEq
		if s.Op == nft.OpNeq {
			op = expr.CmpOpNeq
		}
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
			&expr.Cmp{Op: op, Register: reg1, Data: name},
		}, nil
	case nft.MatchL4Proto:
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{s.Proto}},
		}, nil
	case nft.MatchCtStateNew:
		return refCtBit(expr.CtKeySTATE, expr.CtStateBitNEW), nil
	case nft.MatchCtStatusDNAT:
		return refCtBit(expr.CtKeySTATUS, 1<<5 /* IPS_DST_NAT */), nil
	case nft.MatchCtStateEstablished:
		return refCtBit(expr.CtKeySTATE, expr.CtStateBitESTABLISHED), nil
	case nft.FlowOffload:
		// libnftnl writes the name with its NUL (mnl_attr_put_strz), google/nftables without
		return []expr.Any{&expr.FlowOffload{Name: s.Flowtable + "\x00"}}, nil
	case nft.MatchMarkUnset:
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: le32(s.Bits), Xor: le32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: le32(0)},
		}, nil
	case nft.MatchFibDaddrLocal:
		return []expr.Any{
			&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: le32(unix.RTN_LOCAL)},
		}, nil
	case nft.Lookup:
		return append(refLoadFields(fam, s.Fields), &expr.Lookup{SourceRegister: reg1, SetName: s.Set}), nil
	case nft.VMap:
		return append(refLoadFields(fam, s.Fields), &expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: s.Map}), nil
	case nft.Verdict:
		v, err := refVerdict(s)
		return []expr.Any{v}, err
	case nft.Reject:
		code := uint8(3) // ICMP_PORT_UNREACH
		if fam == nft.IPv6 {
			code = 4 // ICMPV6_PORT_UNREACH
		}
		return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code}}, nil
	case nft.SetMarkBits:
		mask, xor := ^s.Bits, s.Bits
		if s.Xor {
			mask = 0xffffffff
		}
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: le32(mask), Xor: le32(xor)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
		}, nil
	case nft.Masquerade:
		return []expr.Any{&expr.Masq{FullyRandom: s.FullyRandom}}, nil
	case nft.DNATNumgenMap:
		return []expr.Any{
			&expr.Numgen{Register: reg1, Modulus: s.Mod, Type: unix.NFT_NG_RANDOM, Offset: s.Offset},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: s.Map},
			refDnatRegs(fam, refNatPortReg(fam)),
		}, nil
	case nft.DNATHashMap:
		// as nft encodes "dnat ip to jhash ip saddr . th sport mod M seed S offset O map @m":
		// the address in reg 1, the port in the next 32-bit word
		off, n := addrField(fam, nft.FieldSaddr)
		next := uint32(9) // NFT_REG32_01
		if fam == nft.IPv6 {
			next = 2 // NFT_REG_2
		}
		return []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Payload{DestRegister: next, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
			&expr.Hash{SourceRegister: reg1, DestRegister: reg1, Length: n + 4, Modulus: s.Mod, Seed: s.Seed, Offset: s.Offset, Type: expr.HashTypeJenkins},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: s.Map},
			refDnatRegs(fam, refNatPortReg(fam)),
		}, nil
	case nft.DNATKeyMap:
		// as "nft --debug=netlink" shows nft 1.0.6 encoding
		// "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @m":
		//   [ payload load 4b @ network header + 16 => reg 1 ]
		//   [ meta load l4proto => reg 9 ]
		//   [ payload load 2b @ transport header + 2 => reg 10 ]
		//   [ numgen reg 11 = random mod 3 ]
		//   [ lookup reg 1 set m dreg 1 ]
		//   [ nat dnat ip addr_min reg 1 proto_min reg 9 ]
		// (ip6: reg 1, 2, 13, numgen reg 14, proto_min reg 2; without the address:
		// reg 1, 9, numgen reg 10)
		var out []expr.Any
		word := uint32(0)      // 32-bit register words used
		put := func() uint32 { // netlink_put_register
			if word%4 == 0 {
				return 1 + word/4
			}
			return 8 + word
		}
		for _, f := range s.Fields {
			switch f {
			case nft.FieldDaddr:
				off, n := addrField(fam, f)
				out = append(out, &expr.Payload{DestRegister: put(), Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
				word += n / 4
			case nft.FieldL4Proto:
				out = append(out, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: put()})
				word++
			case nft.FieldTHDport:
				out = append(out, &expr.Payload{DestRegister: put(), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
				word++
			}
		}
		return append(out,
			&expr.Numgen{Register: put(), Modulus: s.Mod, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: s.Map},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam), RegAddrMin: reg1, RegProtoMin: refNatPortReg(fam)}), nil
	case nft.Counter:
		return []expr.Any{&expr.Counter{}}, nil
	case nft.MatchFibSaddrLocal:
		return []expr.Any{
			&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: le32(unix.RTN_LOCAL)},
		}, nil
	case nft.MatchNumgen:
		return []expr.Any{
			&expr.Numgen{Register: reg1, Modulus: s.Mod, Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: le32(0)},
		}, nil
	case nft.SNATTo:
		return []expr.Any{
			&expr.Immediate{Register: reg1, Data: s.Addr.AsSlice()},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: uint32(fam), RegAddrMin: reg1, RegAddrMax: reg1, FullyRandom: true},
		}, nil
	case nft.DNATTo:
		return []expr.Any{
			&expr.Immediate{Register: reg1, Data: s.Addr.AsSlice()},
			&expr.Immediate{Register: reg2, Data: binary.BigEndian.AppendUint16(nil, s.Port)},
			refDnatRegs(fam, reg2),
		}, nil
	case nft.UpdateSaddr:
		off, n := addrField(fam, nft.FieldSaddr)
		return []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Dynset{SrcRegKey: reg1, SetName: s.Set, Operation: unix.NFT_DYNSET_OP_UPDATE},
		}, nil
	}
	return nil, fmt.Errorf("kernel: no encoding for statement %T", s)
}

// natPortReg is where a map lookup leaves the port of an "address . port" value.
func refNatPortReg(fam nft.Family) uint32 {
	if fam == nft.IPv6 {
		return reg2
	}
	return reg32base + 1
}

func refDnatRegs(fam nft.Family, portReg uint32) *expr.NAT {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam), RegAddrMin: reg1, RegAddrMax: reg1, RegProtoMin: portReg, RegProtoMax: portReg, Specified: true}
}

func refVerdict(v nft.Verdict) (*expr.Verdict, error) {
	switch v.Kind {
	case nft.Accept:
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case nft.Drop:
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case nft.Return:
		return &expr.Verdict{Kind: expr.VerdictReturn}, nil
	case nft.Jump:
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: v.Chain}, nil
	case nft.Goto:
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: v.Chain}, nil
	}
	return nil, fmt.Errorf("kernel: unknown verdict kind %d", v.Kind)
}

func refCtBit(key expr.CtKey, bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: key, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: le32(bit), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: le32(0)},
	}
}

// prefixMatch loads only the bytes the prefix covers, masking a partial last byte, as nft
// does.
func refPrefixMatch(fam nft.Family, m nft.MatchPrefix) []expr.Any {
	p := m.Prefix.Masked()
	off, _ := addrField(fam, m.Field)
	n := uint32((p.Bits() + 7) / 8)
	want := p.Addr().AsSlice()[:n]
	out := []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}}
	if p.Bits()%8 != 0 {
		mask := make([]byte, n)
		for i := range mask {
			mask[i] = 0xff
		}
		mask[n-1] = byte(0xff << (8 - p.Bits()%8))
		out = append(out, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: n, Mask: mask, Xor: make([]byte, n)})
	}
	op := expr.CmpOpEq
	if m.Op == nft.OpNeq {
		op = expr.CmpOpNeq
	}
	return append(out, &expr.Cmp{Op: op, Register: reg1, Data: want})
}

// loadFields loads a concatenation into consecutive registers starting at NFT_REG_1, each
// field rounded up to 4 bytes, as nft lays out lookup keys.
func refLoadFields(fam nft.Family, fs []nft.Field) []expr.Any {
	var out []expr.Any
	var used uint32 // bytes of the concatenation so far
	for _, f := range fs {
		reg := uint32(reg1)
		if used > 0 {
			reg = reg32base + used/4
		}
		switch f {
		case nft.FieldSaddr, nft.FieldDaddr:
			off, n := addrField(fam, f)
			out = append(out, &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
			used += n
		case nft.FieldL4Proto:
			out = append(out, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg})
			used += 4
		case nft.FieldTHDport:
			out = append(out, &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			used += 4
		}
	}
	return out
}

// refAddRule is AddRule as it was: expressions marshalled by google/nftables.
func (b *Batch) refAddRule(chain string, r nft.Rule) error {
	es, err := refExprs(b.fam, r)
	if err != nil {
		return err
	}
	b.begin(unix.NFT_MSG_NEWRULE, nlmCreate|nlmAppend)
	b.str(unix.NFTA_RULE_TABLE, b.table)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	list := b.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, e := range es {
		data, err := expr.Marshal(byte(b.fam), e)
		if err != nil {
			return err
		}
		b.attr(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, data)
	}
	b.close(list)
	if r.Comment != "" {
		b.scratch = udataString(b.scratch[:0], udataComment, r.Comment)
		b.attr(unix.NFTA_RULE_USERDATA, b.scratch)
	}
	b.finish()
	return nil
}

// TestExpressionsAsBefore: every statement kind, in both families and with the operand
// variants the compiler uses, encodes to exactly the bytes google/nftables' expression
// marshallers produced (which the kernel tests compared with nft's own encoding).
func TestExpressionsAsBefore(t *testing.T) {
	variants := []nft.Stmt{
		nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpEq, Prefix: netip.MustParsePrefix("10.96.0.1/32")},
		nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("10.244.0.0/13")},
		nft.Verdict{Kind: nft.Accept}, nft.Verdict{Kind: nft.Drop}, nft.Verdict{Kind: nft.Return},
		nft.Verdict{Kind: nft.Goto, Chain: "svc-default/a/tcp/http"},
		nft.Masquerade{}, nft.SetMarkBits{Bits: 0x4000, Xor: true},
		nft.VMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Map: "service-nodeports"},
		nft.Lookup{Fields: []nft.Field{nft.FieldDaddr}, Set: "nodeport-ips"},
		nft.MatchIifname{Op: nft.OpEq, Name: "cbr0"},
		nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"},
		nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1000, Map: "endpoints"},
	}
	six := map[string]nft.Stmt{
		"prefix": nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("fd00:10:244::/56")},
		"odd":    nft.MatchPrefix{Field: nft.FieldDaddr, Prefix: netip.MustParsePrefix("fd00::/13")},
		"dnat":   nft.DNATTo{Addr: netip.MustParseAddr("fd00::1"), Port: 8080},
		"snat":   nft.SNATTo{Addr: netip.MustParseAddr("2001:db8::10")},
	}
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		stmts := append(nft.AllStmtKinds(), variants...)
		for i, s := range stmts {
			if fam == nft.IPv6 {
				switch s.(type) {
				case nft.MatchPrefix:
					stmts[i] = six["prefix"]
				case nft.DNATTo:
					stmts[i] = six["dnat"]
				case nft.SNATTo:
					stmts[i] = six["snat"]
				}
			}
		}
		if fam == nft.IPv6 {
			stmts = append(stmts, six["odd"])
		}
		for _, s := range stmts {
			r := nft.Rule{Stmts: []nft.Stmt{s}, Comment: "default/a:http"}
			now, before := NewBatch(fam, "nftproxy"), NewBatch(fam, "nftproxy")
			if err := now.AddRule("c", r); err != nil {
				t.Fatalf("%s %T: %v", fam, s, err)
			}
			if err := before.refAddRule("c", r); err != nil {
				t.Fatalf("%s %T: reference: %v", fam, s, err)
			}
			var got, want []byte
			_ = now.each(func(_ uint16, p []byte) error { got = p; return nil })
			_ = before.each(func(_ uint16, p []byte) error { want = p; return nil })
			if !bytes.Equal(got, want) {
				t.Errorf("%s %s: encoded\n%x\nwant\n%x", fam, nft.RenderRule(fam, r), got, want)
			}
		}
	}
	// a whole rule of several statements
	r := nft.Rule{Stmts: []nft.Stmt{nft.MatchL4Proto{Proto: 6}, nft.DNATNumgenMap{Mod: 3, Offset: 7, Map: "endpoints-0"}}}
	now, before := NewBatch(nft.IPv4, "t"), NewBatch(nft.IPv4, "t")
	_, _ = now.AddRule("c", r), before.refAddRule("c", r)
	if !bytes.Equal(now.pages[0][16:], before.pages[0][16:]) {
		t.Errorf("two-statement rule differs")
	}
}
