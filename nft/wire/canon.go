package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file gives what is read back a canonical form (RuleKey: equal keys, equal
// rules) and a human-readable one (DescribeExpr, VerdictString, RenderBytes, SetHeader).

// WithoutAttrs returns a copy of an expression's attributes without the given ones.
func WithoutAttrs(m map[uint16][]byte, drop ...uint16) map[uint16][]byte {
	out := make(map[uint16][]byte, len(m))
	for k, v := range m {
		if !slices.Contains(drop, k) {
			out[k] = v
		}
	}
	return out
}

// NAT flags the kernel sets by itself when registers are given (nft_nat_init).
const (
	natRangeMapIPs         = 0x1
	natRangeProtoSpecified = 0x2
)

// RuleKey is the canonical form of a rule: equal keys mean equal rules.
func RuleKey(r RuleState) string {
	var b strings.Builder
	for _, e := range r.Exprs {
		b.WriteString(e.Name)
		b.WriteByte('{')
		if e.Name != "counter" { // counter values change by themselves
			attrs := e.Attrs
			if e.Name == "nat" {
				attrs = WithoutAttrs(attrs)
				flags := be32(attrs[unix.NFTA_NAT_FLAGS])
				if attrs[unix.NFTA_NAT_REG_ADDR_MIN] != nil {
					flags |= natRangeMapIPs
				}
				if attrs[unix.NFTA_NAT_REG_PROTO_MIN] != nil {
					flags |= natRangeProtoSpecified
				}
				attrs[unix.NFTA_NAT_FLAGS] = binary.BigEndian.AppendUint32(nil, flags)
				// a range of one register: nft sends only the minimum (nft_nat_init makes
				// the maximum the minimum), google/nftables and our older statements both
				for _, mm := range [][2]uint16{{unix.NFTA_NAT_REG_ADDR_MIN, unix.NFTA_NAT_REG_ADDR_MAX},
					{unix.NFTA_NAT_REG_PROTO_MIN, unix.NFTA_NAT_REG_PROTO_MAX}} {
					if attrs[mm[1]] == nil && attrs[mm[0]] != nil {
						attrs[mm[1]] = attrs[mm[0]]
					}
				}
			}
			for _, t := range sortedKeys(attrs) {
				val := attrs[t]
				if allZero(val) && !keepZero(e.Name, t) {
					continue // absent and zero mean the same to the kernel
				}
				if isRegister(e.Name, t) {
					val = binary.BigEndian.AppendUint32(nil, reg32(be32(val)))
				}
				if isData(e.Name, t) {
					fmt.Fprintf(&b, "%d=%s;", t, DataString(val))
					continue
				}
				fmt.Fprintf(&b, "%d=%x;", t, val)
			}
		}
		b.WriteByte('}')
	}
	fmt.Fprintf(&b, "udata=%x", r.UserData)
	return b.String()
}

// isRegister reports whether an expression attribute names a register.
func isRegister(expr string, attr uint16) bool {
	regs := map[string][]uint16{
		"payload":   {unix.NFTA_PAYLOAD_DREG, unix.NFTA_PAYLOAD_SREG},
		"meta":      {unix.NFTA_META_DREG, unix.NFTA_META_SREG},
		"ct":        {unix.NFTA_CT_DREG, unix.NFTA_CT_SREG},
		"cmp":       {unix.NFTA_CMP_SREG},
		"bitwise":   {unix.NFTA_BITWISE_SREG, unix.NFTA_BITWISE_DREG},
		"lookup":    {unix.NFTA_LOOKUP_SREG, unix.NFTA_LOOKUP_DREG},
		"immediate": {unix.NFTA_IMMEDIATE_DREG},
		"numgen":    {unix.NFTA_NG_DREG},
		"hash":      {unix.NFTA_HASH_SREG, unix.NFTA_HASH_DREG},
		"fib":       {unix.NFTA_FIB_DREG},
		"nat":       {unix.NFTA_NAT_REG_ADDR_MIN, unix.NFTA_NAT_REG_ADDR_MAX, unix.NFTA_NAT_REG_PROTO_MIN, unix.NFTA_NAT_REG_PROTO_MAX},
		"masq":      {unix.NFTA_MASQ_REG_PROTO_MIN, unix.NFTA_MASQ_REG_PROTO_MAX},
		"dynset":    {unix.NFTA_DYNSET_SREG_KEY, unix.NFTA_DYNSET_SREG_DATA},
	}
	return slices.Contains(regs[expr], attr)
}

// reg32 is a register number as the index of a 32-bit register. The kernel stores
// registers that way and dumps one that starts a 16-byte register by the 16-byte name:
// NFT_REG32_04 (12), where an IPv6 concatenation's second field goes, reads back as
// NFT_REG_2 (2).
func reg32(r uint32) uint32 {
	switch {
	case r == 0: // the verdict register
		return 0
	case r <= 4: // NFT_REG_1 … NFT_REG_4
		return r * 4
	case r >= reg32base:
		return r - reg32base + 4
	}
	return r
}

// isData reports whether an expression attribute holds nested NFTA_DATA_* attributes,
// which are compared by content: the kernel's dump does not set NLA_F_NESTED where our
// encoder does.
func isData(expr string, attr uint16) bool {
	switch expr {
	case "immediate":
		return attr == unix.NFTA_IMMEDIATE_DATA
	case "cmp":
		return attr == unix.NFTA_CMP_DATA
	case "bitwise":
		return attr == unix.NFTA_BITWISE_MASK || attr == unix.NFTA_BITWISE_XOR
	}
	return false
}

// DataString is the canonical form of nested NFTA_DATA_VALUE / NFTA_DATA_VERDICT.
func DataString(b []byte) string {
	var out []string
	ad, err := decoder(b)
	if err != nil {
		return "0x" + hex.EncodeToString(b)
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_DATA_VALUE:
			out = append(out, "value "+hex.EncodeToString(ad.Bytes()))
		case unix.NFTA_DATA_VERDICT:
			out = append(out, VerdictString(decodeVerdict(ad.Bytes())))
		default:
			out = append(out, fmt.Sprintf("attr %d %x", ad.Type(), ad.Bytes()))
		}
	}
	if ad.Err() != nil {
		return "0x" + hex.EncodeToString(b)
	}
	return strings.Join(out, ",")
}

func decodeVerdict(b []byte) ElemState {
	e := ElemState{Verdict: true}
	ad, err := decoder(b)
	if err != nil {
		return e
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			e.VerdictCode = ad.Uint32()
		case unix.NFTA_VERDICT_CHAIN:
			e.VerdictChain = ad.String()
		}
	}
	return e
}

// keepZero names zero-valued attributes whose presence matters: a lookup with a
// destination register (register 0: a verdict map) differs from one without.
func keepZero(expr string, attr uint16) bool {
	return expr == "lookup" && attr == unix.NFTA_LOOKUP_DREG
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func be32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func cstring(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }

func sortedKeys[K ~string | ~uint16, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func ImmediateVerdict(data []byte) (string, bool) {
	ad, err := decoder(data)
	if err != nil {
		return "", false
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_DATA_VERDICT {
			return VerdictString(decodeVerdict(ad.Bytes())), true
		}
	}
	return "", false
}

func VerdictString(e ElemState) string {
	switch e.VerdictCode {
	case nfAccept:
		return "accept"
	case nfDrop:
		return "drop"
	case verdictReturn:
		return "return"
	case verdictJump:
		return "jump " + e.VerdictChain
	case verdictGoto:
		return "goto " + e.VerdictChain
	}
	return fmt.Sprintf("verdict %d", int32(e.VerdictCode))
}

// CommentOf extracts the comment TLV of rule or element userdata.
func CommentOf(u []byte) string {
	for len(u) >= 2 {
		typ, n := u[0], int(u[1])
		if len(u) < 2+n {
			break
		}
		if typ == udataComment {
			return cstring(u[2 : 2+n])
		}
		u = u[2+n:]
	}
	return ""
}

// SameKeyType reports whether two set key types name the same key: equal, or equal but
// for the numgen index of a concatenation, which nft types "integer" and nftproxy "mark"
// (concatTypeID), as nft loads the rendered text and as nftproxy writes it.
func SameKeyType(a, b uint32) bool {
	if a <= 0x3f || b <= 0x3f { // not concatenations
		return a == b
	}
	for a != 0 || b != 0 {
		x, y := a&0x3f, b&0x3f
		if x == typeID(nft.TypeNumgen) {
			x = typeMark
		}
		if y == typeID(nft.TypeNumgen) {
			y = typeMark
		}
		if x != y {
			return false
		}
		a, b = a>>6, b>>6
	}
	return true
}

// TypesOf reverses concatType for the datatypes nftproxy uses.
func TypesOf(id, length uint32) []nft.Datatype {
	all := []nft.Datatype{nft.TypeIPv4Addr, nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen}
	var out []nft.Datatype
	concat := id > 0x3f
	for id != 0 {
		found := false
		for _, t := range all {
			if typeID(t) == id&0x3f || concat && concatTypeID(t) == id&0x3f {
				out = append([]nft.Datatype{t}, out...)
				found = true
			}
		}
		if !found {
			return nil
		}
		id >>= 6
	}
	if _, l := concatType(out); l != length {
		return nil
	}
	return out
}

// RenderBytes decodes key or value bytes with their datatypes; hex when they do not fit.
func RenderBytes(types []nft.Datatype, b []byte) string {
	vals, ok := decodeValues(types, b)
	if !ok {
		return "0x" + hex.EncodeToString(b)
	}
	return nft.RenderElementKey(&nft.Set{Key: types}, nft.Element{Key: vals})
}

// decodeValues reverses AppendValues.
func decodeValues(types []nft.Datatype, b []byte) ([]nft.Value, bool) {
	if len(types) == 0 {
		return nil, false
	}
	var out []nft.Value
	for _, t := range types {
		n := int(typeLen(t))
		width := n
		if len(types) > 1 {
			width = (n + 3) &^ 3
		}
		if len(b) < width {
			return nil, false
		}
		f := b[:n]
		switch t {
		case nft.TypeIPv4Addr:
			out = append(out, nft.Addr(netip.AddrFrom4([4]byte(f))))
		case nft.TypeIPv6Addr:
			out = append(out, nft.Addr(netip.AddrFrom16([16]byte(f))))
		case nft.TypeInetProto:
			out = append(out, nft.Num(uint32(f[0])))
		case nft.TypeInetService:
			out = append(out, nft.Num(uint32(binary.BigEndian.Uint16(f))))
		case nft.TypeNumgen:
			out = append(out, nft.Num(binary.LittleEndian.Uint32(f)))
		default:
			return nil, false
		}
		b = b[width:]
	}
	return out, len(b) == 0
}

// SetHeader is a set's definition without elements in nft syntax, on one line.
func SetHeader(fam nft.Family, s *SetState) string {
	d := decodeSet(&SetState{Name: s.Name, Flags: s.Flags, KeyType: s.KeyType, KeyLen: s.KeyLen, DataType: s.DataType,
		DataLen: s.DataLen, Timeout: s.Timeout, Size: s.Size, UserData: s.UserData, Exprs: s.Exprs})
	text := nft.Render(&nft.Ruleset{Family: fam, Table: "t", Sets: []*nft.Set{d}})
	lines := strings.Split(text, "\n")
	var out []string
	for _, l := range lines[1:] { // the table line
		if l = strings.TrimSpace(l); l != "" && l != "}" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return out[0] + " " + strings.Join(out[1:], "; ") + " }"
}

// DescribeExpr describes an expression by its name and main operands, for one that is
// not an encoding of any statement.
func DescribeExpr(e ExprState) string {
	p := e.Name
	switch e.Name {
	case "payload":
		base := [...]string{"link", "network", "transport", "inner"}[min(be32(e.Attrs[unix.NFTA_PAYLOAD_BASE]), 3)]
		p += fmt.Sprintf(" %s+%d/%d", base, be32(e.Attrs[unix.NFTA_PAYLOAD_OFFSET]), be32(e.Attrs[unix.NFTA_PAYLOAD_LEN]))
	case "meta", "ct":
		p += fmt.Sprintf(" key %d", be32(e.Attrs[unix.NFTA_META_KEY]))
	case "cmp":
		op := [...]string{"==", "!=", "<", "<=", ">", ">="}[min(be32(e.Attrs[unix.NFTA_CMP_OP]), 5)]
		p += " " + op + " " + strings.TrimPrefix(DataString(e.Attrs[unix.NFTA_CMP_DATA]), "value ")
	case "lookup":
		p += " @" + cstring(e.Attrs[unix.NFTA_LOOKUP_SET])
	case "numgen":
		p += fmt.Sprintf(" mod %d", be32(e.Attrs[unix.NFTA_NG_MODULUS]))
		if off, ok := e.Attrs[unix.NFTA_NG_OFFSET]; ok {
			p += fmt.Sprintf(" offset %d", be32(off))
		}
	case "hash":
		p += fmt.Sprintf(" mod %d seed 0x%08x offset %d", be32(e.Attrs[unix.NFTA_HASH_MODULUS]), be32(e.Attrs[unix.NFTA_HASH_SEED]), be32(e.Attrs[unix.NFTA_HASH_OFFSET]))
	case "immediate":
		if v, ok := ImmediateVerdict(e.Attrs[unix.NFTA_IMMEDIATE_DATA]); ok {
			p += " " + v
		}
	}
	return p
}

// NumgenLookup reads "numgen random mod N offset K" followed by a lookup of its number
// in a map: the map's name, N and K.
// The lookup's key must be the number alone (numgen and lookup on the same register): a
// number that ends a concatenated key (DNATKeyMap) is not a slot.
func NumgenLookup(ng, lk ExprState) (set string, mod, offset uint32, ok bool) {
	if ng.Name != "numgen" || lk.Name != "lookup" ||
		reg32(be32(ng.Attrs[unix.NFTA_NG_DREG])) != reg32(be32(lk.Attrs[unix.NFTA_LOOKUP_SREG])) {
		return "", 0, 0, false
	}
	return cstring(lk.Attrs[unix.NFTA_LOOKUP_SET]), be32(ng.Attrs[unix.NFTA_NG_MODULUS]), be32(ng.Attrs[unix.NFTA_NG_OFFSET]), true
}

// attrSelected is a pseudo-attribute (no kernel attribute has this number) that carries
// what a lookup selects, in place of the map's name.
const attrSelected = 0xffff

// Selecting returns a NumgenLookup pair rewritten to compare by what it selects: the
// numgen without its offset, the lookup without its map's name and id but with
// selected, which RuleKey compares and Selected returns.
func Selecting(ng, lk ExprState, selected string) (ExprState, ExprState) {
	ng = ExprState{Name: ng.Name, Attrs: WithoutAttrs(ng.Attrs, unix.NFTA_NG_OFFSET)}
	lk = ExprState{Name: lk.Name, Attrs: WithoutAttrs(lk.Attrs, unix.NFTA_LOOKUP_SET, unix.NFTA_LOOKUP_SET_ID)}
	lk.Attrs[attrSelected] = []byte(selected)
	return ng, lk
}

// Selected returns what a lookup rewritten by Selecting selects.
func Selected(e ExprState) (string, bool) {
	sel, ok := e.Attrs[attrSelected]
	return string(sel), ok
}
