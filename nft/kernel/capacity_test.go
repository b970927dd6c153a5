package kernel_test

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// capacityRuleset is a table with one set of n addresses and one of 10.
func capacityRuleset(n int) *nft.Ruleset {
	addrs := func(n int, base [4]byte) []nft.Element {
		out := make([]nft.Element, n)
		for i := range out {
			a := base
			a[2], a[3] = byte(i>>8), byte(i)
			out[i] = nft.Element{Key: []nft.Value{nft.Addr(netip.AddrFrom4(a))}}
		}
		return out
	}
	return &nft.Ruleset{Family: nft.IPv4, Table: "captest", Sets: []*nft.Set{
		{Name: "big", Key: []nft.Datatype{nft.TypeIPv4Addr}, Elements: addrs(n, [4]byte{10, 1})},
		{Name: "small", Key: []nft.Datatype{nft.TypeIPv4Addr}, Elements: addrs(10, [4]byte{10, 2})},
	}}
}

// kernelSet is what nft lists of a set: its size (0: none) and element count.
func kernelSet(t *testing.T, ns *testnetns.NS, name string) (size, elems int) {
	t.Helper()
	var out struct {
		Nftables []struct {
			Set *struct {
				Size int               `json:"size"`
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(ns.MustRun(t, "", "nft", "-j", "list", "set", "ip", "captest", name)), &out); err != nil {
		t.Fatal(err)
	}
	for _, o := range out.Nftables {
		if o.Set != nil {
			return o.Set.Size, len(o.Set.Elem)
		}
	}
	t.Fatalf("set %s not listed", name)
	return 0, 0
}

// TestSetCapacity follows one set through the capacity rules of capacity.go on the
// kernel: a full write sizes a big set at 1.5 times its elements and leaves a small one
// unsized; a sync may fill it exactly to its capacity (the kernel's own limit agrees);
// one more element rewrites the table with the set unsized, which then grows by
// deltas; a resync sizes it again. The small set is never sized.
func TestSetCapacity(t *testing.T) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	steps := []struct {
		name       string
		n          int
		resync     bool
		full       bool
		overfilled []string
		size       int
	}{
		{"cold start", 2000, false, true, nil, 3000},
		{"filled to capacity by a delta", 3000, false, false, nil, 3000},
		{"one more: written anew, unsized", 3001, false, true, []string{"big"}, 0},
		{"grows by deltas while unsized", 5000, false, false, nil, 0},
		{"shrinks by deltas", 1500, false, false, nil, 0},
		{"resync: sized again", 1500, true, true, nil, 2250},
		{"below the threshold at a resync: unsized", 1000, true, true, nil, 0},
	}
	for _, s := range steps {
		if s.resync {
			a.Resync()
		}
		st, err := a.Apply(capacityRuleset(s.n))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if st.Full != s.full || !slices.Equal(st.Overfilled, s.overfilled) {
			t.Errorf("%s: full %v, overfilled %v; want %v, %v", s.name, st.Full, st.Overfilled, s.full, s.overfilled)
		}
		if size, n := kernelSet(t, ns, "big"); size != s.size || n != s.n {
			t.Errorf("%s: kernel set has size %d and %d elements, want %d and %d", s.name, size, n, s.size, s.n)
		}
		if size, n := kernelSet(t, ns, "small"); size != 0 || n != 10 {
			t.Errorf("%s: small set has size %d and %d elements, want unsized with 10", s.name, size, n)
		}
	}
}
