package wire

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// Actions: verdicts, reject, counter, and setting the packet's mark.

// "accept", "drop", "return", "jump c", "goto c": an immediate verdict.
var verdictCodec = codec[nft.Verdict]{
	enc: func(b *Batch, fam nft.Family, s nft.Verdict) error {
		code, chain, err := verdictCode(s)
		if err != nil {
			return err
		}
		b.verdictExpr(code, chain)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.Verdict {
		if es[0].Name != "immediate" {
			return nil
		}
		return one(immediateVerdictOf(es[0]))
	},
}

// "reject": ICMP port unreachable (ICMPv6 in an ip6 table).
var rejectCodec = codec[nft.Reject]{
	enc: func(b *Batch, fam nft.Family, s nft.Reject) error {
		code := uint8(3) // ICMP_PORT_UNREACH
		if fam == nft.IPv6 {
			code = 4 // ICMPV6_PORT_UNREACH
		}
		b.expr("reject", func() {
			b.u32(unix.NFTA_REJECT_TYPE, unix.NFT_REJECT_ICMP_UNREACH)
			b.attr(unix.NFTA_REJECT_ICMP_CODE, []byte{code})
		})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.Reject { return one(nft.Reject{}, es[0].Name == "reject") },
}

// "counter": a counter expression (its values are the kernel's).
var counterCodec = codec[nft.Counter]{
	enc: func(b *Batch, fam nft.Family, s nft.Counter) error {
		b.expr("counter", func() {
			b.u64(unix.NFTA_COUNTER_BYTES, 0)
			b.u64(unix.NFTA_COUNTER_PACKETS, 0)
		})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.Counter { return one(nft.Counter{}, es[0].Name == "counter") },
}

// "meta mark set mark or 0x4000", "meta mark set mark xor 0x4000": meta mark,
// bitwise, meta set mark.
var setMarkCodec = codec[nft.SetMarkBits]{
	enc: func(b *Batch, fam nft.Family, s nft.SetMarkBits) error {
		mask, xor := ^s.Bits, s.Bits
		if s.Xor {
			mask = 0xffffffff
		}
		b.meta(unix.NFT_META_MARK, reg1, false)
		b.bitwise(reg1, 4, le32(mask), le32(xor))
		b.meta(unix.NFT_META_MARK, reg1, true)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.SetMarkBits {
		_, xor, ok := markBitwise(es)
		if !ok {
			return nil
		}
		bits := binary.LittleEndian.Uint32(xor)
		return []nft.SetMarkBits{{Bits: bits}, {Bits: bits, Xor: true}}
	},
}
