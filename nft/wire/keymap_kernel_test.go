package wire_test

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// keyMaps has both maps DNATKeyMap reads and rules reading them.
func keyMaps(fam nft.Family) *nft.Ruleset {
	addr, ep1, ep2, svc := nft.TypeIPv4Addr, "10.244.1.5", "10.244.2.6", "10.96.0.10"
	if fam == nft.IPv6 {
		addr, ep1, ep2, svc = nft.TypeIPv6Addr, "fd00:1::5", "fd00:2::6", "fd00::10"
	}
	a := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
	return &nft.Ruleset{Family: fam, Table: "nftproxy", Sets: []*nft.Set{
		{Name: "endpoints", Key: []nft.Datatype{addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
			Data: []nft.Datatype{addr, nft.TypeInetService}, Elements: []nft.Element{
				{Key: []nft.Value{a(svc), nft.Num(6), nft.Num(80), nft.Num(0)}, Data: []nft.Value{a(ep1), nft.Num(8080)}},
				{Key: []nft.Value{a(svc), nft.Num(6), nft.Num(80), nft.Num(1)}, Data: []nft.Value{a(ep2), nft.Num(8080)}},
			}},
		{Name: "nodeport-endpoints", Key: []nft.Datatype{nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
			Data: []nft.Datatype{addr, nft.TypeInetService}, Elements: []nft.Element{
				{Key: []nft.Value{nft.Num(17), nft.Num(30053), nft.Num(0)}, Data: []nft.Value{a(ep1), nft.Num(53)}, Comment: "kube-system/dns:dns"},
			}},
	}, Chains: []*nft.Chain{
		{Name: "services", Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: "endpoints"}}},
			{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"}}, Comment: "node ports"},
		}},
		// the NAT rules are validated for a nat chain only where a nat base chain reaches them
		{Name: "nat-prerouting", Hook: &nft.Hook{Type: nft.TypeNAT, Hook: nft.Prerouting, Priority: -100}, Rules: []nft.Rule{
			{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "services"}}},
		}},
	}}
}

// TestKeyMapKernelRoundTrip applies the key maps and DNATKeyMap rules through netlink in
// one throwaway namespace and loads the rendered text with "nft -f" in another: nft lists
// both exactly as the renderer wrote them, the kernel holds the same bytes for both, the
// listing loads again ("nft -c -f") in an empty namespace, and what the kernel holds
// decodes and verifies as the ruleset.
func TestKeyMapKernelRoundTrip(t *testing.T) {
	viaNetlink, viaText, empty := testnetns.New(t), testnetns.New(t), testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(viaNetlink.FD))
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			rs := keyMaps(fam)
			text := strings.Replace(nft.Render(rs), "priority -100;", "priority dstnat;", 1) // as nft lists it
			if _, err := applier.Apply(rs); err != nil {
				t.Fatalf("netlink apply: %v", err)
			}
			viaText.MustRun(t, text, "nft", "-f", "-")
			listed := viaNetlink.MustRun(t, "", "nft", "list", "table", fam.String(), rs.Table)
			if listed != text {
				t.Errorf("nft list of what we wrote:\n%s\nrendered:\n%s", listed, text)
			}
			if fromText := viaText.MustRun(t, "", "nft", "list", "table", fam.String(), rs.Table); fromText != text {
				t.Errorf("nft list of the text nft loaded:\n%s\nrendered:\n%s", fromText, text)
			}
			empty.MustRun(t, listed, "nft", "-c", "-f", "-")
			if out := empty.MustRun(t, "", "nft", "list", "ruleset"); out != "" {
				t.Errorf("nft -c left a ruleset: %s", out)
			}

			ours, err := wire.ReadTable(viaNetlink.FD, fam, rs.Table)
			if err != nil {
				t.Fatal(err)
			}
			nfts, err := wire.ReadTable(viaText.FD, fam, rs.Table)
			if err != nil {
				t.Fatal(err)
			}
			for name, s := range nfts.Sets {
				if o := ours.Sets[name]; o != nil && wire.SameKeyType(o.KeyType, s.KeyType) {
					c := *s // nft types the index "integer", nftproxy "mark": the same key
					c.KeyType = o.KeyType
					s = &c
				}
				if !reflect.DeepEqual(ours.Sets[name], s) {
					t.Errorf("set %s: kernel holds\n%+v\nfor us, and for nft\n%+v", name, ours.Sets[name], s)
				}
			}
			for name, c := range nfts.Chains {
				if !reflect.DeepEqual(ours.Chains[name], c) {
					t.Errorf("chain %s: kernel holds\n%+v\nfor us, and for nft\n%+v", name, ours.Chains[name], c)
				}
			}
			for _, st := range []*wire.TableState{ours, nfts} {
				if d, err := readback.Compare(st, rs); err != nil || !d.Empty() {
					t.Errorf("verify: %v\n%s", err, d)
				}
				dec, undecoded := wire.Decode(st)
				if len(undecoded) > 0 {
					t.Fatalf("undecoded: %v", undecoded)
				}
				if got := nft.Render(dec); !strings.Contains(got, nft.RenderRule(fam, rs.Chains[0].Rules[0])) ||
					!reflect.DeepEqual(dec.Chains[0].Rules, rs.Chains[0].Rules) {
					t.Errorf("decoded:\n%s", got)
				}
				if !reflect.DeepEqual(dec.Sets, rs.Sets) {
					t.Errorf("decoded sets:\n%s", nft.Render(&nft.Ruleset{Family: fam, Table: "t", Sets: dec.Sets}))
				}
			}
		})
	}
}
