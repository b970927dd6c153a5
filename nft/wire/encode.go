package wire

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file turns typed statements into nf_tables expressions exactly as nft 1.0.6 would
// (same registers, same payload lengths, same userdata), so that "nft list" decompiles
// what we write into the text nft.Render produces. The differential kernel test holds us
// to that. One set attribute differs on purpose: the key type of a numgen index in a
// concatenation (concatTypeID), so that older nft list the maps as well.

const (
	reg1      = 1 // NFT_REG_1: 16 bytes, aliases NFT_REG32_00..03
	reg2      = 2 // NFT_REG_2: 16 bytes, aliases NFT_REG32_04..07
	reg32base = 8 // NFT_REG32_00
)

// Expressions are written straight into the batch, each as nft 1.0.6 (libnftnl) lays
// it out: NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { attributes } }, integers
// big endian, register contents in host order.

// expr appends one expression: its name, then the attributes data writes.
func (b *Batch) expr(name string, data func()) {
	el := b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, name)
	d := b.nest(unix.NFTA_EXPR_DATA)
	data()
	b.close(d)
	b.close(el)
}

// meta loads a meta key into reg, or with set, sets it from reg.
func (b *Batch) meta(key, reg uint32, set bool) {
	b.expr("meta", func() {
		b.u32(unix.NFTA_META_KEY, key)
		if set {
			b.u32(unix.NFTA_META_SREG, reg)
		} else {
			b.u32(unix.NFTA_META_DREG, reg)
		}
	})
}

func (b *Batch) cmp(op, reg uint32, data []byte) {
	b.expr("cmp", func() {
		b.u32(unix.NFTA_CMP_SREG, reg)
		b.u32(unix.NFTA_CMP_OP, op)
		b.value(unix.NFTA_CMP_DATA, data)
	})
}

// value is a nested NFTA_DATA_VALUE attribute.
func (b *Batch) value(typ uint16, data []byte) {
	n := b.nest(typ)
	b.attr(unix.NFTA_DATA_VALUE, data)
	b.close(n)
}

// bitwise is reg = (reg & mask) ^ xor over n bytes.
func (b *Batch) bitwise(reg, n uint32, mask, xor []byte) {
	b.expr("bitwise", func() {
		b.u32(unix.NFTA_BITWISE_SREG, reg)
		b.u32(unix.NFTA_BITWISE_DREG, reg)
		b.u32(unix.NFTA_BITWISE_LEN, n)
		b.value(unix.NFTA_BITWISE_MASK, mask)
		b.value(unix.NFTA_BITWISE_XOR, xor)
	})
}

// ctBit matches a conntrack key having bit set.
func (b *Batch) ctBit(key, bit uint32) {
	b.expr("ct", func() {
		b.u32(unix.NFTA_CT_KEY, key)
		b.u32(unix.NFTA_CT_DREG, reg1)
	})
	b.bitwise(reg1, 4, le32(bit), le32(0))
	b.cmp(unix.NFT_CMP_NEQ, reg1, le32(0))
}

// fib loads the address type of the packet's source or destination (flag) into reg1.
func (b *Batch) fib(flag uint32) {
	b.expr("fib", func() {
		b.u32(unix.NFTA_FIB_DREG, reg1)
		b.u32(unix.NFTA_FIB_FLAGS, flag)
		b.u32(unix.NFTA_FIB_RESULT, unix.NFT_FIB_RESULT_ADDRTYPE)
	})
}

// lookup looks sreg up in set; with dreg, the value found goes there (a map).
func (b *Batch) lookup(set string, sreg uint32, dreg *uint32) {
	b.expr("lookup", func() {
		b.u32(unix.NFTA_LOOKUP_SREG, sreg)
		if dreg != nil {
			b.u32(unix.NFTA_LOOKUP_DREG, *dreg)
		}
		b.str(unix.NFTA_LOOKUP_SET, set)
		b.u32(unix.NFTA_LOOKUP_SET_ID, 0)
	})
}

// verdictExpr is an immediate verdict.
func (b *Batch) verdictExpr(code uint32, chain string) {
	b.expr("immediate", func() {
		b.u32(unix.NFTA_IMMEDIATE_DREG, 0) // NFT_REG_VERDICT
		d := b.nest(unix.NFTA_IMMEDIATE_DATA)
		v := b.nest(unix.NFTA_DATA_VERDICT)
		b.u32(unix.NFTA_VERDICT_CODE, code)
		if chain != "" {
			b.str(unix.NFTA_VERDICT_CHAIN, chain)
		}
		b.close(v)
		b.close(d)
	})
}

func (b *Batch) immediate(reg uint32, data []byte) {
	b.expr("immediate", func() {
		b.u32(unix.NFTA_IMMEDIATE_DREG, reg)
		b.value(unix.NFTA_IMMEDIATE_DATA, data)
	})
}

// numgen loads "numgen random mod mod offset offset" into reg1.
func (b *Batch) numgen(mod, offset uint32) { b.numgenTo(reg1, mod, offset) }

// numgenTo loads "numgen random mod mod offset offset" into reg.
func (b *Batch) numgenTo(reg, mod, offset uint32) {
	b.expr("numgen", func() {
		b.u32(unix.NFTA_NG_DREG, reg)
		b.u32(unix.NFTA_NG_MODULUS, mod)
		b.u32(unix.NFTA_NG_TYPE, unix.NFT_NG_RANDOM)
		b.u32(unix.NFTA_NG_OFFSET, offset)
	})
}

// dnat translates the destination to the address in reg1 and the port in portReg.
func (b *Batch) dnat(fam nft.Family, portReg uint32) {
	b.expr("nat", func() {
		b.u32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
		b.u32(unix.NFTA_NAT_FAMILY, uint32(fam))
		b.u32(unix.NFTA_NAT_REG_ADDR_MIN, reg1)
		b.u32(unix.NFTA_NAT_REG_ADDR_MAX, reg1)
		b.u32(unix.NFTA_NAT_REG_PROTO_MIN, portReg)
		b.u32(unix.NFTA_NAT_REG_PROTO_MAX, portReg)
		b.u32(unix.NFTA_NAT_FLAGS, unix.NF_NAT_RANGE_PROTO_SPECIFIED)
	})
}

func (b *Batch) payload(reg, base, offset, n uint32) {
	b.expr("payload", func() {
		b.u32(unix.NFTA_PAYLOAD_DREG, reg)
		b.u32(unix.NFTA_PAYLOAD_BASE, base)
		b.u32(unix.NFTA_PAYLOAD_OFFSET, offset)
		b.u32(unix.NFTA_PAYLOAD_LEN, n)
	})
}

// natPortReg is where a map lookup leaves the port of an "address . port" value.
func natPortReg(fam nft.Family) uint32 {
	if fam == nft.IPv6 {
		return reg2
	}
	return reg32base + 1
}

// prefixMatch loads only the bytes the prefix covers, masking a partial last byte, as nft
// does.
func (b *Batch) prefixMatch(fam nft.Family, m nft.MatchPrefix) {
	p := m.Prefix.Masked()
	off, _ := addrField(fam, m.Field)
	n := uint32((p.Bits() + 7) / 8)
	want := p.Addr().AsSlice()[:n]
	b.payload(reg1, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
	if p.Bits()%8 != 0 {
		mask := make([]byte, n)
		for i := range mask {
			mask[i] = 0xff
		}
		mask[n-1] = byte(0xff << (8 - p.Bits()%8))
		b.bitwise(reg1, n, mask, make([]byte, n))
	}
	op := uint32(unix.NFT_CMP_EQ)
	if m.Op == nft.OpNeq {
		op = unix.NFT_CMP_NEQ
	}
	b.cmp(op, reg1, want)
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
// field rounded up to 4 bytes, as nft lays out lookup keys (the registers after the first
// named by their 32-bit names, as these expressions were always written).
func (b *Batch) loadFields(fam nft.Family, fs []nft.Field) {
	b.loadConcat(fam, fs, func(word uint32) uint32 {
		if word == 0 {
			return reg1
		}
		return reg32base + word
	})
}

// loadConcat loads the fields fs into consecutive register space from NFT_REG_1, each
// rounded up to 4 bytes; reg names the register at a 32-bit word. It returns the bytes
// used.
func (b *Batch) loadConcat(fam nft.Family, fs []nft.Field, reg func(word uint32) uint32) uint32 {
	var used uint32
	for _, f := range fs {
		r := reg(used / 4)
		switch f {
		case nft.FieldSaddr, nft.FieldDaddr:
			off, n := addrField(fam, f)
			b.payload(r, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
			used += n
		case nft.FieldL4Proto:
			b.meta(unix.NFT_META_L4PROTO, r, false)
			used += 4
		case nft.FieldTHDport:
			b.payload(r, unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
			used += 4
		case nft.FieldCtOrigDaddr:
			used += b.ctOrigDaddr(fam, r)
		}
	}
	return used
}

// maxKeyBytes is the room the data registers give a concatenated key (NFT_REG32_00 to
// NFT_REG32_15).
const maxKeyBytes = 64

// nftReg names the register at 32-bit word word of the register file as nft 1.0.6 does
// (netlink_put_register): by its 16-byte name (NFT_REG_1 … NFT_REG_4) where one starts,
// otherwise by its 32-bit name (NFT_REG32_xx). An IPv6 address's successor is NFT_REG_2.
func nftReg(word uint32) uint32 {
	if word%4 == 0 {
		return reg1 + word/4
	}
	return reg32base + word
}

// loadKey loads a concatenation of packet fields as nft 1.0.6 does for a map key that
// goes on with a numgen index: registers named as nft names them (nftReg). It returns the
// bytes used.
func (b *Batch) loadKey(fam nft.Family, fs []nft.Field) uint32 {
	return b.loadConcat(fam, fs, nftReg)
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

// KeyLen is the length of the keys (or values) of datatypes ts as AppendValues encodes
// them.
func KeyLen(ts []nft.Datatype) int {
	_, n := concatType(ts)
	return int(n)
}

// concatType returns the key type id and length of a (possibly concatenated) type.
func concatType(ts []nft.Datatype) (id, length uint32) {
	if len(ts) == 1 {
		return typeID(ts[0]), typeLen(ts[0])
	}
	for _, t := range ts {
		id = id<<6 | concatTypeID(t)
		length += (typeLen(t) + 3) &^ 3
	}
	return id, length
}

// concatTypeID is the type id of one field of a concatenated key. A numgen index is
// "integer" to nft, a type without a fixed size; nft before 1.0.4 splits a listed
// element by the sizes of the key type's fields, and with a field of unknown size it
// aborts ("concat_expr_msort_value: Assertion 'ilen > 0' failed" in 0.9.8). "mark" is a
// 32-bit integer in host byte order, the same bytes, and has a size, so every nft can
// split the key; nft 1.0.4 and later split it by the typeof userdata instead and list
// the map as before.
func concatTypeID(t nft.Datatype) uint32 {
	if t == nft.TypeNumgen {
		return typeMark
	}
	return typeID(t)
}

// typeMark is nft's "mark" datatype (TYPE_MARK).
const typeMark = 19

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
			a := v.Addr()
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
			dst = append(dst, byte(v.Num()))
		case nft.TypeInetService:
			dst = binary.BigEndian.AppendUint16(dst, uint16(v.Num()))
		case nft.TypeNumgen:
			dst = binary.LittleEndian.AppendUint32(dst, v.Num()) // registers hold host byte order
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
	exprMeta    = 9
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
		u = udataTLV(u, udataSetDataTypeof, typeofAddrPort(fam))
		u = udataU32(u, udataSetDataInterval, 0)
	case nft.IsKeyNumgenMap(s):
		// typeof ip daddr . meta l4proto . th dport . numgen random mod 256 : ip daddr . th dport
		u = udataU32(u, udataSetKeyByteorder, 0)
		u = udataU32(u, udataSetDataByteorder, 0)
		var cat []byte
		for i, t := range s.Key {
			cat = udataTLV(cat, byte(i), typeofKeyField(fam, t))
		}
		u = udataTLV(u, udataSetKeyTypeof, typeofExpr(exprConcat, cat))
		u = udataTLV(u, udataSetDataTypeof, typeofAddrPort(fam))
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

// typeofAddrPort is the typeof userdata of "ip daddr . th dport" (ip6 for IPv6).
func typeofAddrPort(fam nft.Family) []byte {
	var cat []byte
	cat = udataTLV(cat, 0, typeofDaddr(fam))
	cat = udataTLV(cat, 1, typeofExpr(exprPayload, payloadTypeof(11, 2))) // proto_th, THDR_DPORT
	return typeofExpr(exprConcat, cat)
}

// typeofDaddr is the typeof userdata of "ip daddr" (ip6 for IPv6).
func typeofDaddr(fam nft.Family) []byte {
	if fam == nft.IPv6 {
		return typeofExpr(exprPayload, payloadTypeof(13, 9)) // proto_ip6, IP6HDR_DADDR
	}
	return typeofExpr(exprPayload, payloadTypeof(12, 12)) // proto_ip, IPHDR_DADDR
}

// typeofKeyField is the typeof userdata of one field of a map key of packet fields and a
// numgen index: "ip daddr", "meta l4proto", "th dport" or "numgen random mod 256".
func typeofKeyField(fam nft.Family, t nft.Datatype) []byte {
	switch t {
	case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
		return typeofDaddr(fam)
	case nft.TypeInetProto:
		return typeofExpr(exprMeta, udataU32(nil, 0, unix.NFT_META_L4PROTO)) // NFTNL_UDATA_META_KEY
	case nft.TypeInetService:
		return typeofExpr(exprPayload, payloadTypeof(11, 2)) // proto_th, THDR_DPORT
	}
	var ng []byte // NFTNL_UDATA_NUMGEN_TYPE, _MODULUS, _OFFSET
	ng = udataU32(ng, 0, unix.NFT_NG_RANDOM)
	ng = udataU32(ng, 1, 256)
	ng = udataU32(ng, 2, 0)
	return typeofExpr(exprNumgen, ng)
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
