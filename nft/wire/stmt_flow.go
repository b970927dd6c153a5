package wire

import (
	"slices"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// The fast path for established flows: "ct state established", "flow add @ft" (the
// kernel's flow_offload expression), and the flowtable object itself (NEWFLOWTABLE,
// DELFLOWTABLE), which x/sys/unix has no attribute names for.

// Flowtable attributes (enum nft_flowtable_attributes, nft_flowtable_hook_attributes,
// nft_devices_attributes) and the flow_offload expression's (enum
// nft_flow_offload_attributes).
const (
	nftaFlowtableTable = 1
	nftaFlowtableName  = 2
	nftaFlowtableHook  = 3
	nftaFlowtableFlags = 7

	nftaFlowtableHookNum      = 1
	nftaFlowtableHookPriority = 2
	nftaFlowtableHookDevs     = 3

	nftaDeviceName = 1

	nftaFlowTableName = 1 // NFTA_FLOW_TABLE_NAME of the flow_offload expression

	nfNetdevIngress = 0 // NF_NETDEV_INGRESS
)

// ctStateBitEstablished is NF_CT_STATE_BIT(IP_CT_ESTABLISHED).
const ctStateBitEstablished = 2

// "ct state established": ct state, bitwise, cmp.
var ctStateEstablishedCodec = codec[nft.MatchCtStateEstablished]{
	enc: func(b *Batch, fam nft.Family, s nft.MatchCtStateEstablished) error {
		b.ctBit(unix.NFT_CT_STATE, ctStateBitEstablished)
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.MatchCtStateEstablished {
		return one(nft.MatchCtStateEstablished{}, es[0].Name == "ct")
	},
}

// "flow add @ft": flow_offload.
var flowOffloadCodec = codec[nft.FlowOffload]{
	enc: func(b *Batch, fam nft.Family, s nft.FlowOffload) error {
		b.expr("flow_offload", func() { b.str(nftaFlowTableName, s.Flowtable) })
		return nil
	},
	dec: func(fam nft.Family, es []ExprState) []nft.FlowOffload {
		return one(nft.FlowOffload{Flowtable: cstring(es[0].Attrs[nftaFlowTableName])}, es[0].Name == "flow_offload")
	},
}

// ctOrigDaddr loads the connection's original destination address into reg ("ct
// original ip daddr"), as nft 1.0.6 does: the typed key of the family, direction
// original. It returns the bytes loaded.
func (b *Batch) ctOrigDaddr(fam nft.Family, reg uint32) uint32 {
	key, n := uint32(unix.NFT_CT_DST_IP), uint32(4)
	if fam == nft.IPv6 {
		key, n = unix.NFT_CT_DST_IP6, 16
	}
	b.expr("ct", func() {
		b.u32(unix.NFTA_CT_KEY, key)
		b.u32(unix.NFTA_CT_DREG, reg)
		b.attr(unix.NFTA_CT_DIRECTION, []byte{0}) // IP_CT_DIR_ORIGINAL
	})
	return n
}

// isCtOrigDaddr reports whether e loads the original destination of the family.
func isCtOrigDaddr(fam nft.Family, e ExprState) bool {
	if e.Name != "ct" {
		return false
	}
	want := uint32(unix.NFT_CT_DST_IP)
	if fam == nft.IPv6 {
		want = unix.NFT_CT_DST_IP6
	}
	dir, ok := e.Attrs[unix.NFTA_CT_DIRECTION]
	return be32(e.Attrs[unix.NFTA_CT_KEY]) == want && ok && len(dir) >= 1 && dir[0] == 0
}

// AddFlowtable creates the flowtable, or adds the devices it lacks to the one of that
// name (the kernel keeps the devices it has: a device leaves a flowtable when it is
// deleted, or with the flowtable).
func (b *Batch) AddFlowtable(ft *nft.Flowtable) {
	b.begin(unix.NFT_MSG_NEWFLOWTABLE, nlmCreate)
	b.str(nftaFlowtableTable, b.table)
	b.str(nftaFlowtableName, ft.Name)
	h := b.nest(nftaFlowtableHook)
	b.u32(nftaFlowtableHookNum, nfNetdevIngress)
	b.u32(nftaFlowtableHookPriority, uint32(ft.Priority))
	if len(ft.Devices) > 0 {
		d := b.nest(nftaFlowtableHookDevs)
		for _, dev := range ft.Devices {
			b.str(nftaDeviceName, dev)
		}
		b.close(d)
	}
	b.close(h)
	b.u32(nftaFlowtableFlags, 0)
	b.finish()
}

// DelFlowtable deletes a flowtable no rule refers to any more.
func (b *Batch) DelFlowtable(name string) {
	b.named(unix.NFT_MSG_DELFLOWTABLE, nftaFlowtableTable, nftaFlowtableName, name)
}

// FlowtableState is a flowtable in comparable form: its ingress hook's priority and
// devices (sorted).
type FlowtableState struct {
	Name     string
	Hooknum  uint32
	Priority int32
	Devices  []string
	Flags    uint32
}

// parseFlowtable parses a NEWFLOWTABLE message or dump entry (DELFLOWTABLE: the name).
func parseFlowtable(payload []byte) (table string, ft *FlowtableState, err error) {
	ad, err := decoder(payload)
	if err != nil {
		return "", nil, err
	}
	ft = &FlowtableState{}
	for ad.Next() {
		switch ad.Type() {
		case nftaFlowtableTable:
			table = ad.String()
		case nftaFlowtableName:
			ft.Name = ad.String()
		case nftaFlowtableFlags:
			ft.Flags = ad.Uint32()
		case nftaFlowtableHook:
			ad.Nested(func(h *netlink.AttributeDecoder) error {
				for h.Next() {
					switch h.Type() {
					case nftaFlowtableHookNum:
						ft.Hooknum = h.Uint32()
					case nftaFlowtableHookPriority:
						ft.Priority = int32(h.Uint32())
					case nftaFlowtableHookDevs:
						h.Nested(func(d *netlink.AttributeDecoder) error {
							for d.Next() {
								if d.Type() == nftaDeviceName {
									ft.Devices = append(ft.Devices, d.String())
								}
							}
							return nil
						})
					}
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		return "", nil, err
	}
	slices.Sort(ft.Devices)
	return table, ft, nil
}

// decodeFlowtable is the flowtable of a FlowtableState.
func decodeFlowtable(ft *FlowtableState) *nft.Flowtable {
	return &nft.Flowtable{Name: ft.Name, Priority: ft.Priority, Devices: slices.Clone(ft.Devices)}
}
