package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// NAT: masquerading and the three ways of DNAT nftproxy writes.

// "masquerade", "masquerade fully-random".
var masqCodec = codec[nft.Masquerade]{
	enc: func(b *Batch, fam nft.Family, s nft.Masquerade) error {
		b.expr("masq", func() {
			if s.FullyRandom {
				b.u32(unix.NFTA_MASQ_FLAGS, unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY)
			}
		})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.Masquerade {
		if es[0].Name != "masq" {
			return nil
		}
		return []nft.Masquerade{{FullyRandom: true}, {}}
	},
}

// "dnat to numgen random mod 3 offset 7 map @endpoints-P": numgen, lookup into
// registers, nat.
var dnatNumgenCodec = codec[nft.DNATNumgenMap]{
	enc: func(b *Batch, fam nft.Family, s nft.DNATNumgenMap) error {
		b.numgen(s.Mod, s.Offset)
		b.lookup(s.Map, reg1, &[]uint32{reg1}[0])
		b.dnat(fam, natPortReg(fam))
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.DNATNumgenMap {
		if es[0].Name != "numgen" || at(es, 1).Name != "lookup" {
			return nil
		}
		return []nft.DNATNumgenMap{{Mod: be32(es[0].Attrs[unix.NFTA_NG_MODULUS]), Offset: be32(es[0].Attrs[unix.NFTA_NG_OFFSET]),
			Map: cstring(es[1].Attrs[unix.NFTA_LOOKUP_SET])}}
	},
}

// "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints":
// the loads, numgen into the next register, lookup into registers, nat.
var dnatKeyMapCodec = codec[nft.DNATKeyMap]{
	enc: func(b *Batch, fam nft.Family, s nft.DNATKeyMap) error {
		if s.Mod == 0 || len(s.Fields) == 0 {
			return fmt.Errorf("dnat to %v . numgen random mod %d map @%s: no key fields or modulus 0", s.Fields, s.Mod, s.Map)
		}
		used := b.loadKey(fam, s.Fields)
		if used+4 > maxKeyBytes {
			return fmt.Errorf("dnat map @%s: a key of %d bytes does not fit the registers", s.Map, used+4)
		}
		b.numgenTo(nftReg(used/4), s.Mod, 0)
		b.lookup(s.Map, reg1, &[]uint32{reg1}[0])
		b.expr("nat", func() { // as nft sends it: the kernel makes max = min and sets the flags
			b.u32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
			b.u32(unix.NFTA_NAT_FAMILY, uint32(fam))
			b.u32(unix.NFTA_NAT_REG_ADDR_MIN, reg1)
			b.u32(unix.NFTA_NAT_REG_PROTO_MIN, natPortReg(fam))
		})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.DNATKeyMap {
		fields, i := leadingFields(fam, es)
		if ng, l := at(es, i), at(es, i+1); ng.Name == "numgen" && l.Name == "lookup" && len(fields) > 0 {
			return []nft.DNATKeyMap{{Fields: fields, Mod: be32(ng.Attrs[unix.NFTA_NG_MODULUS]), Map: cstring(l.Attrs[unix.NFTA_LOOKUP_SET])}}
		}
		return nil
	},
}

// "dnat to 10.244.1.2:8080": immediate address, immediate port, nat.
var dnatToCodec = codec[nft.DNATTo]{
	enc: func(b *Batch, fam nft.Family, s nft.DNATTo) error {
		b.immediate(reg1, s.Addr.AsSlice())
		b.immediate(reg2, binary.BigEndian.AppendUint16(nil, s.Port))
		b.dnat(fam, reg2)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.DNATTo {
		if es[0].Name != "immediate" {
			return nil
		}
		if _, isVerdict := immediateVerdictOf(es[0]); isVerdict {
			return nil
		}
		a, ok := netip.AddrFromSlice(dataValue(es[0].Attrs[unix.NFTA_IMMEDIATE_DATA]))
		port := dataValue(at(es, 1).Attrs[unix.NFTA_IMMEDIATE_DATA])
		if !ok || len(port) != 2 {
			return nil
		}
		return []nft.DNATTo{{Addr: a, Port: binary.BigEndian.Uint16(port)}}
	},
}

// "dnat ip to jhash ip saddr . th sport mod 4093 seed 0x6e667470 offset 256 map
// @endpoints-P": the source address, the source port in the next 32-bit register, the
// jhash of both into reg 1, lookup into registers, nat. The seed is always sent: without
// it the kernel draws one of its own, and nodes would hash apart.
var dnatHashCodec = codec[nft.DNATHashMap]{
	enc: func(b *Batch, fam nft.Family, s nft.DNATHashMap) error {
		if s.Mod == 0 {
			return fmt.Errorf("dnat to jhash mod 0 map @%s", s.Map)
		}
		off, n := addrField(fam, nft.FieldSaddr)
		b.payload(reg1, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
		b.payload(nftReg(n/4), unix.NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2)
		b.expr("hash", func() {
			b.u32(unix.NFTA_HASH_SREG, reg1)
			b.u32(unix.NFTA_HASH_DREG, reg1)
			b.u32(unix.NFTA_HASH_LEN, n+4)
			b.u32(unix.NFTA_HASH_MODULUS, s.Mod)
			b.u32(unix.NFTA_HASH_SEED, s.Seed)
			b.u32(unix.NFTA_HASH_OFFSET, s.Offset)
			b.u32(unix.NFTA_HASH_TYPE, unix.NFT_HASH_JENKINS)
		})
		b.lookup(s.Map, reg1, &[]uint32{reg1}[0])
		b.dnat(fam, natPortReg(fam))
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.DNATHashMap {
		if f, ok := loadField(fam, es[0]); !ok || f != nft.FieldSaddr {
			return nil
		}
		h, l := at(es, 2), at(es, 3)
		if h.Name != "hash" || l.Name != "lookup" {
			return nil
		}
		return []nft.DNATHashMap{{Mod: be32(h.Attrs[unix.NFTA_HASH_MODULUS]), Seed: be32(h.Attrs[unix.NFTA_HASH_SEED]),
			Offset: be32(h.Attrs[unix.NFTA_HASH_OFFSET]), Map: cstring(l.Attrs[unix.NFTA_LOOKUP_SET])}}
	},
}

// "snat ip to 192.0.2.10 fully-random": immediate address, nat.
var snatToCodec = codec[nft.SNATTo]{
	enc: func(b *Batch, fam nft.Family, s nft.SNATTo) error {
		b.immediate(reg1, s.Addr.AsSlice())
		b.expr("nat", func() {
			b.u32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_SNAT)
			b.u32(unix.NFTA_NAT_FAMILY, uint32(fam))
			b.u32(unix.NFTA_NAT_REG_ADDR_MIN, reg1)
			b.u32(unix.NFTA_NAT_REG_ADDR_MAX, reg1)
			b.u32(unix.NFTA_NAT_FLAGS, unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY)
		})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.SNATTo {
		if es[0].Name != "immediate" || at(es, 1).Name != "nat" || be32(at(es, 1).Attrs[unix.NFTA_NAT_TYPE]) != unix.NFT_NAT_SNAT {
			return nil
		}
		a, ok := netip.AddrFromSlice(dataValue(es[0].Attrs[unix.NFTA_IMMEDIATE_DATA]))
		if !ok {
			return nil
		}
		return []nft.SNATTo{{Addr: a}}
	},
}
