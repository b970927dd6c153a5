package wire

import (
	"encoding/binary"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// Matches: statements that compare something of the packet or its connection.

// ctStateBitNew is NF_CT_STATE_BIT(IP_CT_NEW).
const ctStateBitNew = 8

// "ip saddr 10.0.0.0/8", "ip daddr != 10.96.0.1": payload [bitwise] cmp.
var prefixCodec = codec[nft.MatchPrefix]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchPrefix) error { b.prefixMatch(fam, s); return nil },
	dec: func(fam nft.Family, es []ExprState) []nft.MatchPrefix {
		if es[0].Name != "payload" {
			return nil
		}
		if f, ok := loadField(fam, es[0]); ok && (f == nft.FieldSaddr || f == nft.FieldDaddr) {
			return one(prefixFrom(fam, f, es))
		}
		return nil
	},
}

// "iifname "cni0"", "iifname != "veth*"": meta iifname, cmp.
var iifnameCodec = codec[nft.MatchIifname]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchIifname) error {
		if len(s.Name) > 15 || s.Name == "" {
			return fmt.Errorf("iifname %q: not 1 to 15 bytes", s.Name)
		}
		name := []byte(s.Name) // a prefix compares only its bytes
		if !s.Prefix {
			name = make([]byte, 16) // a whole name compares the NUL-padded IFNAMSIZ bytes
			copy(name, s.Name)
		}
		op := uint32(unix.NFT_CMP_EQ)
		if s.Op == nft.OpNeq {
			op = unix.NFT_CMP_NEQ
		}
		b.meta(unix.NFT_META_IIFNAME, reg1, false)
		b.cmp(op, reg1, name)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchIifname {
		if !isMeta(es[0], unix.NFT_META_IIFNAME) {
			return nil
		}
		d := cmpValue(at(es, 1))
		if len(d) == 0 {
			return nil
		}
		name, prefix := strings.TrimRight(string(d), "\x00"), len(d) < 16
		return []nft.MatchIifname{{Op: nft.OpEq, Name: name, Prefix: prefix}, {Op: nft.OpNeq, Name: name, Prefix: prefix}}
	},
}

// "meta l4proto tcp": meta l4proto, cmp.
var l4protoCodec = codec[nft.MatchL4Proto]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchL4Proto) error {
		b.meta(unix.NFT_META_L4PROTO, reg1, false)
		b.cmp(unix.NFT_CMP_EQ, reg1, []byte{s.Proto})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchL4Proto {
		if d := cmpValue(at(es, 1)); isMeta(es[0], unix.NFT_META_L4PROTO) && len(d) == 1 {
			return []nft.MatchL4Proto{{Proto: d[0]}}
		}
		return nil
	},
}

// "meta mark & 0x4000 == 0": meta mark, bitwise, cmp.
var markUnsetCodec = codec[nft.MatchMarkUnset]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchMarkUnset) error {
		b.meta(unix.NFT_META_MARK, reg1, false)
		b.bitwise(reg1, 4, le32(s.Bits), le32(0))
		b.cmp(unix.NFT_CMP_EQ, reg1, le32(0))
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchMarkUnset {
		if mask, _, ok := markBitwise(es); ok {
			return []nft.MatchMarkUnset{{Bits: binary.LittleEndian.Uint32(mask)}}
		}
		return nil
	},
}

// markBitwise reads "meta mark, bitwise" at the start of es: the mask and xor.
func markBitwise(es []ExprState) (mask, xor []byte, ok bool) {
	if !isMeta(es[0], unix.NFT_META_MARK) {
		return nil, nil, false
	}
	b := at(es, 1)
	mask, xor = bitwiseValue(b, unix.NFTA_BITWISE_MASK), bitwiseValue(b, unix.NFTA_BITWISE_XOR)
	return mask, xor, len(mask) == 4 && len(xor) == 4
}

// "ct state new": ct state, bitwise, cmp.
var ctStateNewCodec = codec[nft.MatchCtStateNew]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchCtStateNew) error {
		b.ctBit(unix.NFT_CT_STATE, ctStateBitNew)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchCtStateNew {
		return one(nft.MatchCtStateNew{}, es[0].Name == "ct")
	},
}

// "ct status dnat": ct status, bitwise, cmp.
var ctStatusDNATCodec = codec[nft.MatchCtStatusDNAT]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchCtStatusDNAT) error {
		b.ctBit(unix.NFT_CT_STATUS, 1<<5 /* IPS_DST_NAT */)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchCtStatusDNAT {
		return one(nft.MatchCtStatusDNAT{}, es[0].Name == "ct")
	},
}

// "fib daddr type local": fib, cmp.
var fibDaddrCodec = codec[nft.MatchFibDaddrLocal]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchFibDaddrLocal) error {
		b.fib(unix.NFTA_FIB_F_DADDR)
		b.cmp(unix.NFT_CMP_EQ, reg1, le32(unix.RTN_LOCAL))
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchFibDaddrLocal {
		return one(nft.MatchFibDaddrLocal{}, es[0].Name == "fib")
	},
}

// "fib saddr type local": fib, cmp.
var fibSaddrCodec = codec[nft.MatchFibSaddrLocal]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchFibSaddrLocal) error {
		b.fib(unix.NFTA_FIB_F_SADDR)
		b.cmp(unix.NFT_CMP_EQ, reg1, le32(unix.RTN_LOCAL))
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchFibSaddrLocal {
		return one(nft.MatchFibSaddrLocal{}, es[0].Name == "fib")
	},
}

// "numgen random mod 2 == 0": numgen, cmp.
var matchNumgenCodec = codec[nft.MatchNumgen]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchNumgen) error {
		b.numgen(s.Mod, 0)
		b.cmp(unix.NFT_CMP_EQ, reg1, le32(0))
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchNumgen {
		return one(nft.MatchNumgen{Mod: be32(es[0].Attrs[unix.NFTA_NG_MODULUS])}, es[0].Name == "numgen")
	},
}

// isMeta reports whether e loads the meta key.
func isMeta(e ExprState, key uint32) bool {
	return e.Name == "meta" && be32(e.Attrs[unix.NFTA_META_KEY]) == key
}
