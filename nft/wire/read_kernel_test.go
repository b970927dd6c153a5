package wire_test

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// swappingSets is a table of n sets named prefix-0 … prefix-(n-1), each with a few
// elements, so that a ruleset with another prefix replaces every set.
func swappingSets(prefix string, n int) *nft.Ruleset {
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "nftproxy"}
	for i := range n {
		s := &nft.Set{Name: fmt.Sprintf("%s-%d", prefix, i), Key: []nft.Datatype{nft.TypeIPv4Addr}}
		for j := range 8 {
			s.Elements = append(s.Elements, nft.Element{Key: []nft.Value{nft.Addr(netip.AddrFrom4([4]byte{10, byte(i), 0, byte(j)}))}})
		}
		rs.Sets = append(rs.Sets, s)
	}
	return rs
}

// TestReadTableWhileSetsComeAndGo reads a table while another connection replaces all of
// its sets, a transaction every few milliseconds: a set listed and then deleted before
// the dump of its elements answers ENOENT, which ReadTable must take as the ruleset
// changing under it and read again. Every read succeeds and sees one generation's sets,
// all "a-…" or all "b-…", never a mix. (The code before this test failed at its first
// read; a churner with no pause at all starves every reader.)
func TestReadTableWhileSetsComeAndGo(t *testing.T) {
	ns := testnetns.New(t)
	const n = 40
	a, b := swappingSets("a", n), swappingSets("b", n)
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	if _, err := applier.Apply(a); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var churnErr error
	commits := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rs := b
			if i%2 == 1 {
				rs = a
			}
			if _, err := applier.Apply(rs); err != nil {
				churnErr = err
				return
			}
			commits++
			time.Sleep(3 * time.Millisecond) // a busy proxy, not one that starves every reader
		}
	}()

	reads, deadline := 0, time.Now().Add(15*time.Second)
	for ; reads < 300 && time.Now().Before(deadline); reads++ {
		st, err := wire.ReadTable(ns.FD, nft.IPv4, "nftproxy")
		if err != nil {
			t.Errorf("read %d: %v", reads, err)
			break
		}
		names := make([]string, 0, len(st.Sets))
		for name := range st.Sets {
			names = append(names, name)
		}
		sort.Strings(names)
		if len(names) != n || names[0][0] != names[len(names)-1][0] || !strings.HasSuffix(names[0], "-0") {
			t.Errorf("read %d saw a mix of two generations: %v", reads, names)
			break
		}
	}
	close(stop)
	wg.Wait()
	if churnErr != nil {
		t.Fatalf("replacing the sets: %v", churnErr)
	}
	if commits < 10 {
		t.Errorf("only %d transactions ran during %d reads: the reads were not raced", commits, reads)
	}
	t.Logf("%d reads during %d transactions", reads, commits)
}
