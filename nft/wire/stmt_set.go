package wire

import (
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// Set lookups and updates: a concatenation of fields loaded and looked up in, or added
// to, a named set.

// "ip daddr . meta l4proto . th dport @set": the loads, lookup.
var lookupCodec = codec[nft.Lookup]{
	enc: func(b *Batch, fam nft.Family, s nft.Lookup) error {
		b.loadFields(fam, s.Fields)
		b.lookup(s.Set, reg1, nil)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.Lookup {
		fields, i := leadingFields(fam, es)
		if e := at(es, i); e.Name == "lookup" {
			return []nft.Lookup{{Fields: fields, Set: cstring(e.Attrs[unix.NFTA_LOOKUP_SET])}}
		}
		return nil
	},
}

// "ip daddr . meta l4proto . th dport vmap @map": the loads, lookup into the verdict
// register.
var vmapCodec = codec[nft.VMap]{
	enc: func(b *Batch, fam nft.Family, s nft.VMap) error {
		b.loadFields(fam, s.Fields)
		verdictReg := uint32(0) // NFT_REG_VERDICT
		b.lookup(s.Map, reg1, &verdictReg)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.VMap {
		fields, i := leadingFields(fam, es)
		e := at(es, i)
		if _, ok := e.Attrs[unix.NFTA_LOOKUP_DREG]; e.Name == "lookup" && ok {
			return []nft.VMap{{Fields: fields, Map: cstring(e.Attrs[unix.NFTA_LOOKUP_SET])}}
		}
		return nil
	},
}

// "update @set { ip saddr }": payload saddr, dynset update.
var updateSaddrCodec = codec[nft.UpdateSaddr]{
	enc: func(b *Batch, fam nft.Family, s nft.UpdateSaddr) error {
		off, n := addrField(fam, nft.FieldSaddr)
		b.payload(reg1, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
		b.expr("dynset", func() {
			b.u32(unix.NFTA_DYNSET_SREG_KEY, reg1)
			b.u32(unix.NFTA_DYNSET_OP, unix.NFT_DYNSET_OP_UPDATE)
			b.str(unix.NFTA_DYNSET_SET_NAME, s.Set)
			b.u32(unix.NFTA_DYNSET_SET_ID, 0)
			b.u32(unix.NFTA_DYNSET_FLAGS, 0)
		})
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.UpdateSaddr {
		_, i := leadingFields(fam, es)
		if e := at(es, i); e.Name == "dynset" {
			return []nft.UpdateSaddr{{Set: cstring(e.Attrs[unix.NFTA_DYNSET_SET_NAME])}}
		}
		return nil
	},
}
