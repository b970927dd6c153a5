package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file turns typed statements into nf_tables expressions exactly as nft 1.0.6 would
// (same registers, same payload lengths, same userdata), so that "nft list" decompiles
// what we write into the text nft.Render produces. The differential kernel test holds us
// to that.

const (
	reg1      = 1 // NFT_REG_1: 16 bytes, aliases NFT_REG32_00..03
	reg2      = 2 // NFT_REG_2: 16 bytes, aliases NFT_REG32_04..07
	reg32base = 8 // NFT_REG32_00
)

// exprs encodes one rule's statements.
func exprs(fam nft.Family, r nft.Rule) ([]expr.Any, error) {
	var out []expr.Any
	for _, s := range r.Stmts {
		e, err := stmtExprs(fam, s)
		if err != nil {
			return nil, err
		}
		out = append(out, e...)
	}
	return out, nil
}

func stmtExprs(fam nft.Family, s nft.Stmt) ([]expr.Any, error) {
	switch s := s.(type) {
	case nft.MatchPrefix:
		return prefixMatch(fam, s), nil
	case nft.MatchIifname:
		if len(s.Name) > 15 || s.Name == "" {
			return nil, fmt.Errorf("iifname %q: not 1 to 15 bytes", s.Name)
		}
		name := []byte(s.Name) // a prefix compares only its bytes
		if !s.Prefix {
			name = make([]byte, 16) // a whole name compares the NUL-padded IFNAMSIZ bytes
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
		return ctBit(expr.CtKeySTATE, expr.CtStateBitNEW), nil
	case nft.MatchCtStatusDNAT:
		return ctBit(expr.CtKeySTATUS, 1<<5 /* IPS_DST_NAT */), nil
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
		return append(loadFields(fam, s.Fields), &expr.Lookup{SourceRegister: reg1, SetName: s.Set}), nil
	case nft.VMap:
		return append(loadFields(fam, s.Fields), &expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: s.Map}), nil
	case nft.Verdict:
		v, err := verdict(s)
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
			dnatRegs(fam, natPortReg(fam)),
		}, nil
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
	case nft.DNATTo:
		return []expr.Any{
			&expr.Immediate{Register: reg1, Data: s.Addr.AsSlice()},
			&expr.Immediate{Register: reg2, Data: binary.BigEndian.AppendUint16(nil, s.Port)},
			dnatRegs(fam, reg2),
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
func natPortReg(fam nft.Family) uint32 {
	if fam == nft.IPv6 {
		return reg2
	}
	return reg32base + 1
}

func dnatRegs(fam nft.Family, portReg uint32) *expr.NAT {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam), RegAddrMin: reg1, RegAddrMax: reg1, RegProtoMin: portReg, RegProtoMax: portReg, Specified: true}
}

func verdict(v nft.Verdict) (*expr.Verdict, error) {
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

func ctBit(key expr.CtKey, bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: key, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: le32(bit), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: le32(0)},
	}
}

// prefixMatch loads only the bytes the prefix covers, masking a partial last byte, as nft
// does.
func prefixMatch(fam nft.Family, m nft.MatchPrefix) []expr.Any {
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

// addrField returns the network header offset and length of saddr/daddr.
func addrField(fam nft.Family, f nft.Field) (uint32, uint32) {
	if fam == nft.IPv6 {
		if f == nft.FieldSaddr {
			return 8, 16
		}
		return 24, 16
	}
	if f == nft.FieldSaddr {
		return 12, 4
	}
	return 16, 4
}

// loadFields loads a concatenation into consecutive registers starting at NFT_REG_1, each
// field rounded up to 4 bytes, as nft lays out lookup keys.
func loadFields(fam nft.Family, fs []nft.Field) []expr.Any {
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

func le32(v uint32) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, v) // registers hold host byte order; amd64/arm64 are little endian
	return b
}

// Datatype encodings (nft's datatype ids and sizes).

func typeID(t nft.Datatype) uint32 {
	switch t {
	case nft.TypeIPv4Addr:
		return 7
	case nft.TypeIPv6Addr:
		return 8
	case nft.TypeInetProto:
		return 12
	case nft.TypeInetService:
		return 13
	case nft.TypeNumgen:
		return 4 // integer
	}
	return 0
}

func typeLen(t nft.Datatype) uint32 {
	switch t {
	case nft.TypeIPv4Addr:
		return 4
	case nft.TypeIPv6Addr:
		return 16
	case nft.TypeInetProto:
		return 1
	case nft.TypeInetService:
		return 2
	case nft.TypeNumgen:
		return 4
	}
	return 0
}

// concatType returns the key type id and length of a (possibly concatenated) type.
func concatType(ts []nft.Datatype) (id, length uint32) {
	if len(ts) == 1 {
		return typeID(ts[0]), typeLen(ts[0])
	}
	for _, t := range ts {
		id = id<<6 | typeID(t)
		length += (typeLen(t) + 3) &^ 3
	}
	return id, length
}

// AppendValues appends the encoding of vs to dst: each field in its own 32-bit aligned
// register slot when there are several (a concatenation), as nft does.
func AppendValues(dst []byte, ts []nft.Datatype, vs []nft.Value) ([]byte, error) {
	if len(ts) != len(vs) {
		return nil, fmt.Errorf("kernel: %d values for %d types", len(vs), len(ts))
	}
	for i, t := range ts {
		start := len(dst)
		v := vs[i]
		switch t {
		case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
			a := v.Addr
			if !a.IsValid() || a.Is4() != (t == nft.TypeIPv4Addr) {
				return nil, fmt.Errorf("kernel: %v is not a valid %s", a, map[bool]string{true: "IPv4 address", false: "IPv6 address"}[t == nft.TypeIPv4Addr])
			}
			if a.Is4() {
				b := a.As4()
				dst = append(dst, b[:]...)
			} else {
				b := a.As16()
				dst = append(dst, b[:]...)
			}
		case nft.TypeInetProto:
			dst = append(dst, byte(v.Num))
		case nft.TypeInetService:
			dst = binary.BigEndian.AppendUint16(dst, uint16(v.Num))
		case nft.TypeNumgen:
			dst = binary.LittleEndian.AppendUint32(dst, v.Num) // registers hold host byte order
		default:
			return nil, fmt.Errorf("kernel: cannot encode datatype %d", t)
		}
		if len(ts) > 1 {
			for (len(dst)-start)%4 != 0 {
				dst = append(dst, 0)
			}
		}
	}
	return dst, nil
}

// Userdata (libnftnl's TLVs) that nft attaches to sets and rules.

func udataTLV(buf []byte, typ byte, data []byte) []byte {
	buf = append(buf, typ, byte(len(data)))
	return append(buf, data...)
}

func udataU32(buf []byte, typ byte, v uint32) []byte { return udataTLV(buf, typ, le32(v)) }

func udataString(buf []byte, typ byte, s string) []byte {
	return udataTLV(buf, typ, append([]byte(s), 0))
}

const (
	udataSetKeyByteorder  = 0
	udataSetDataByteorder = 1
	udataSetKeyTypeof     = 3
	udataSetDataTypeof    = 4
	udataSetDataInterval  = 6
	udataSetComment       = 7
	udataComment          = 0 // rules and set elements

	exprNumgen  = 23 // nft's enum expr_types
	exprPayload = 7
	exprConcat  = 13
)

func setUserdata(fam nft.Family, s *nft.Set) []byte {
	var u []byte
	switch {
	case len(s.Key) == 1 && s.Key[0] == nft.TypeNumgen:
		// typeof numgen random mod 1 : ip daddr . th dport
		u = udataU32(u, udataSetKeyByteorder, 1)
		u = udataU32(u, udataSetDataByteorder, 0)
		var ng []byte
		ng = udataU32(ng, 0, unix.NFT_NG_RANDOM)
		ng = udataU32(ng, 1, 1)
		ng = udataU32(ng, 2, 0)
		u = udataTLV(u, udataSetKeyTypeof, typeofExpr(exprNumgen, ng))
		addrDesc, addrField := uint32(12), uint32(12) // proto_ip, IPHDR_DADDR
		if fam == nft.IPv6 {
			addrDesc, addrField = 13, 9 // proto_ip6, IP6HDR_DADDR
		}
		var cat []byte
		cat = udataTLV(cat, 0, typeofExpr(exprPayload, payloadTypeof(addrDesc, addrField)))
		cat = udataTLV(cat, 1, typeofExpr(exprPayload, payloadTypeof(11, 2))) // proto_th, THDR_DPORT
		u = udataTLV(u, udataSetDataTypeof, typeofExpr(exprConcat, cat))
		u = udataU32(u, udataSetDataInterval, 0)
	case len(s.Key) == 1 && s.IsMap() && len(s.Data) > 1:
		u = udataU32(u, udataSetKeyByteorder, 2)
		u = udataU32(u, udataSetDataByteorder, 0)
		u = udataTLV(u, udataSetDataTypeof, typeofExpr(exprConcat, nil))
		u = udataU32(u, udataSetDataInterval, 0)
	case len(s.Key) == 1:
		u = udataU32(u, udataSetKeyByteorder, 2) // big endian
	default:
		u = udataU32(u, udataSetKeyByteorder, 0)
		if s.IsMap() {
			u = udataU32(u, udataSetDataByteorder, 0)
		}
		u = udataTLV(u, udataSetKeyTypeof, typeofExpr(exprConcat, nil))
		if s.IsMap() {
			u = udataU32(u, udataSetDataInterval, 0)
		}
	}
	if s.Comment != "" {
		u = udataString(u, udataSetComment, s.Comment)
	}
	return u
}

func typeofExpr(kind uint32, data []byte) []byte {
	var b []byte
	b = udataU32(b, 0, kind)
	return udataTLV(b, 1, data)
}

func payloadTypeof(desc, field uint32) []byte {
	var b []byte
	b = udataU32(b, 0, desc)
	return udataU32(b, 1, field)
}
