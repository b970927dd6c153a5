package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
)

// keyMapRuleset has both maps DNATKeyMap reads (keyed by "daddr . l4proto . dport .
// index" and by "l4proto . dport . index") and rules reading them.
func keyMapRuleset(fam nft.Family) *nft.Ruleset {
	addr, ep1, ep2, svc := nft.TypeIPv4Addr, "10.244.1.5", "10.244.2.6", "10.96.0.10"
	if fam == nft.IPv6 {
		addr, ep1, ep2, svc = nft.TypeIPv6Addr, "fd00:1::5", "fd00:2::6", "fd00::10"
	}
	a := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
	return &nft.Ruleset{Family: fam, Table: "t", Sets: []*nft.Set{
		{Name: "endpoints", Key: []nft.Datatype{addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
			Data: []nft.Datatype{addr, nft.TypeInetService}, Elements: []nft.Element{
				{Key: []nft.Value{a(svc), nft.Num(6), nft.Num(80), nft.Num(0)}, Data: []nft.Value{a(ep1), nft.Num(8080)}},
				{Key: []nft.Value{a(svc), nft.Num(6), nft.Num(80), nft.Num(1)}, Data: []nft.Value{a(ep2), nft.Num(8080)}},
				{Key: []nft.Value{a(svc), nft.Num(17), nft.Num(53), nft.Num(0)}, Data: []nft.Value{a(ep2), nft.Num(5353)}},
			}},
		{Name: "nodeport-endpoints", Key: []nft.Datatype{nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
			Data: []nft.Datatype{addr, nft.TypeInetService}, Comment: "node ports", Elements: []nft.Element{
				{Key: []nft.Value{nft.Num(17), nft.Num(30053), nft.Num(0)}, Data: []nft.Value{a(ep1), nft.Num(53)}, Comment: "kube-system/dns:dns"},
				{Key: []nft.Value{nft.Num(6), nft.Num(30080), nft.Num(2)}, Data: []nft.Value{a(ep2), nft.Num(8080)}},
			}},
	}, Chains: []*nft.Chain{
		{Name: "c", Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 3, Map: "endpoints"}}},
			{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"}}},
			{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 256, Map: "nodeport-endpoints"}}},
			{Stmts: []nft.Stmt{nft.MatchCtStateNew{}, nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 7, Map: "endpoints"}}},
		}},
	}}
}

// mnlMsg is one netlink message as "nft --debug=mnl" prints it.
type mnlMsg struct {
	typ     uint16 // NFT_MSG_*
	payload []byte // after nfgenmsg
}

var (
	ansi        = regexp.MustCompile("\x1b\\[[0-9;]*m")
	mnlType     = regexp.MustCompile(`^\| (\d{5}) \| [-R][-M][-A][-E] \|`)
	mnlAttrHead = regexp.MustCompile(`^\|(\d{5})\|([-N])([-B])\|(\d{5})\|`)
	mnlData     = regexp.MustCompile(`^\| ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2})  \|\t\|      data      \|`)
)

// parseMnl rebuilds the messages nft sent from libmnl's debug print: attribute headers
// ("|len|flags|type|") and their data, four bytes a line, padding included.
func parseMnl(t *testing.T, out string) []mnlMsg {
	t.Helper()
	var msgs []mnlMsg
	var cur *mnlMsg
	for _, line := range strings.Split(ansi.ReplaceAllString(out, ""), "\n") {
		switch {
		case mnlType.MatchString(line):
			n, _ := strconv.Atoi(mnlType.FindStringSubmatch(line)[1])
			msgs = append(msgs, mnlMsg{typ: uint16(n) & 0xff})
			cur = &msgs[len(msgs)-1]
			if uint16(n)>>8 != unix.NFNL_SUBSYS_NFTABLES {
				cur = nil // batch begin and end
			}
		case cur == nil:
		case mnlAttrHead.MatchString(line):
			m := mnlAttrHead.FindStringSubmatch(line)
			l, _ := strconv.Atoi(m[1])
			typ, _ := strconv.Atoi(m[4])
			if m[2] == "N" {
				typ |= unix.NLA_F_NESTED
			}
			if m[3] == "B" {
				typ |= unix.NLA_F_NET_BYTEORDER
			}
			cur.payload = binary.NativeEndian.AppendUint16(cur.payload, uint16(l))
			cur.payload = binary.NativeEndian.AppendUint16(cur.payload, uint16(typ))
		case mnlData.MatchString(line):
			m := mnlData.FindStringSubmatch(line)
			b, _ := hex.DecodeString(m[1] + m[2] + m[3] + m[4])
			cur.payload = append(cur.payload, b...)
		}
	}
	if len(msgs) == 0 {
		t.Fatalf("no messages in nft's debug output:\n%s", out)
	}
	return msgs
}

// walkMnl calls fn with each attribute (type without flags) and its value, which fn
// may change in place; nested ones it descends into when fn says so.
func walkMnl(b []byte, fn func(typ uint16, val []byte) (descend bool)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:])
		if l < 4 || l > len(b) {
			return
		}
		if fn(typ&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l]) {
			walkMnl(b[4:l], fn)
		}
		b = b[min((l+3)&^3, len(b)):]
	}
}

// withoutBatchIDs zeroes what refers to a set by its id within nft's batch (the set's
// NFTA_SET_ID, a lookup's NFTA_LOOKUP_SET_ID, an element list's NFTA_SET_ELEM_LIST_SET_ID):
// nftproxy refers to sets by name only.
func withoutBatchIDs(m mnlMsg) []byte {
	p := bytes.Clone(m.payload)
	zero := func(v []byte) {
		for i := range v {
			v[i] = 0
		}
	}
	switch m.typ {
	case unix.NFT_MSG_NEWSET:
		walkMnl(p, func(typ uint16, v []byte) bool {
			if typ == unix.NFTA_SET_ID {
				zero(v)
			}
			return false
		})
	case unix.NFT_MSG_NEWSETELEM:
		walkMnl(p, func(typ uint16, v []byte) bool {
			if typ == unix.NFTA_SET_ELEM_LIST_SET_ID {
				zero(v)
			}
			return false
		})
	case unix.NFT_MSG_NEWRULE:
		walkMnl(p, func(typ uint16, v []byte) bool {
			if typ != unix.NFTA_RULE_EXPRESSIONS {
				return false
			}
			walkMnl(v, func(_ uint16, el []byte) bool {
				var name string
				walkMnl(el, func(typ uint16, v []byte) bool {
					switch {
					case typ == unix.NFTA_EXPR_NAME:
						name = cstring(v)
					case typ == unix.NFTA_EXPR_DATA && name == "lookup":
						walkMnl(v, func(typ uint16, v []byte) bool {
							if typ == unix.NFTA_LOOKUP_SET_ID {
								zero(v)
							}
							return false
						})
					}
					return false
				})
				return false
			})
			return false
		})
	}
	return p
}

// indexTypedAsMark rewrites a set message's key type as nftproxy sends it: nft types a
// numgen index "integer", nftproxy "mark" (concatTypeID), the one attribute in which the
// two differ on purpose.
func indexTypedAsMark(p []byte) []byte {
	walkMnl(p, func(typ uint16, v []byte) bool {
		if typ == unix.NFTA_SET_KEY_TYPE && len(v) == 4 {
			id := binary.BigEndian.Uint32(v)
			if id > 0x3f && id&0x3f == typeID(nft.TypeNumgen) {
				binary.BigEndian.PutUint32(v, id&^0x3f|typeMark)
			}
		}
		return false
	})
	return p
}

// TestKeyMapBytesAsNft holds the encoding of DNATKeyMap and of the maps it reads to the
// messages nft 1.0.6 sends for the rendered text (as "nft --debug=mnl" prints them),
// byte for byte but for the ids nft gives sets within its batch and the index's type.
func TestKeyMapBytesAsNft(t *testing.T) {
	ns := testnetns.New(t)
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			rs := keyMapRuleset(fam)
			out := ns.MustRun(t, nft.Render(rs), "nft", "--debug=mnl", "-f", "-")
			var theirs [][]byte
			var kinds []uint16
			for _, m := range parseMnl(t, out) {
				switch m.typ {
				case unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWRULE:
					p := withoutBatchIDs(m)
					if m.typ == unix.NFT_MSG_NEWSET {
						p = indexTypedAsMark(p)
					}
					theirs = append(theirs, p)
					kinds = append(kinds, m.typ)
				}
			}
			b := NewBatch(fam, rs.Table)
			for _, s := range rs.Sets {
				b.AddSet(s)
			}
			for _, c := range rs.Chains {
				for _, r := range c.Rules {
					if err := b.AddRule(c.Name, r); err != nil {
						t.Fatal(err)
					}
				}
			}
			var ours [][]byte
			_ = b.each(func(typ uint16, p []byte) error {
				ours = append(ours, withoutBatchIDs(mnlMsg{typ, p}))
				return nil
			})
			if len(ours) != len(theirs) {
				t.Fatalf("%d set and rule messages, nft sent %d", len(ours), len(theirs))
			}
			for i := range ours {
				if !bytes.Equal(ours[i], theirs[i]) {
					what := "rule " + nft.RenderRule(fam, rs.Chains[0].Rules[max(i-len(rs.Sets), 0)])
					if kinds[i] == unix.NFT_MSG_NEWSET {
						what = "set " + rs.Sets[i].Name
					}
					t.Errorf("%s: encoded\n%x\nnft sent\n%x", what, ours[i], theirs[i])
				}
			}
		})
	}
}

// TestKeyMapElementsAsNft compares the elements of the key maps with nft's: the key and
// value bytes of every element (nft may order and chunk them differently).
func TestKeyMapElementsAsNft(t *testing.T) {
	ns := testnetns.New(t)
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		rs := keyMapRuleset(fam)
		out := ns.MustRun(t, nft.Render(rs), "nft", "--debug=mnl", "-f", "-")
		elems := func(p []byte) []string {
			var set string
			var out []string
			walkMnl(p, func(typ uint16, v []byte) bool {
				switch typ {
				case unix.NFTA_SET_ELEM_LIST_SET:
					set = cstring(v)
				case unix.NFTA_SET_ELEM_LIST_ELEMENTS:
					walkMnl(v, func(_ uint16, el []byte) bool {
						e, err := decodeElem(el)
						if err != nil {
							t.Fatal(err)
						}
						out = append(out, set+" "+hex.EncodeToString(e.Key)+" : "+hex.EncodeToString(e.Data)+" "+CommentOf(e.UserData))
						return false
					})
				}
				return false
			})
			return out
		}
		var theirs, ours []string
		for _, m := range parseMnl(t, out) {
			if m.typ == unix.NFT_MSG_NEWSETELEM {
				theirs = append(theirs, elems(m.payload)...)
			}
		}
		b := NewBatch(fam, rs.Table)
		for _, s := range rs.Sets {
			es := make([]*nft.Element, len(s.Elements))
			for i := range s.Elements {
				es[i] = &s.Elements[i]
			}
			if err := b.Elems(s, es, false); err != nil {
				t.Fatal(err)
			}
		}
		_ = b.each(func(typ uint16, p []byte) error {
			ours = append(ours, elems(p)...)
			return nil
		})
		slices.Sort(theirs)
		slices.Sort(ours)
		if strings.Join(ours, "\n") != strings.Join(theirs, "\n") || len(ours) != 5 {
			t.Errorf("%s elements:\n%s\nnft sent:\n%s", fam, strings.Join(ours, "\n"), strings.Join(theirs, "\n"))
		}
	}
}
