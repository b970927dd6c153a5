package wire

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// An ElemWriter told how many elements are coming makes room for them once, after the
// first, and writes the same messages as without: the first page is not grown again
// (without Expect it doubles from a few kilobytes), later pages start at their size.
func TestElemWriterExpect(t *testing.T) {
	s := &nft.Set{Name: "endpoints", Key: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
		Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}}
	const n = 60000 // about 2.6 MB: three pages
	write := func(expect bool) (b *Batch, firstPageCaps int) {
		b = NewBatch(nft.IPv4, "nftproxy")
		w := b.Stream(s, false)
		if expect {
			w.Expect(n)
		}
		caps := map[int]bool{}
		for i := range n {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
			e := nft.Element{Key: []nft.Value{nft.Addr(a), nft.Num(6), nft.Num(80), nft.Num(uint32(i % 10))},
				Data: []nft.Value{nft.Addr(a), nft.Num(8080)}}
			if err := w.Add(&e); err != nil {
				t.Fatal(err)
			}
			if len(b.pages) == 1 {
				caps[cap(b.w)] = true
			}
		}
		w.Close()
		return b, len(caps)
	}
	with, grownWith := write(true)
	without, grownWithout := write(false)
	var got, want [][]byte
	_ = with.each(func(_ uint16, p []byte) error { got = append(got, p); return nil })
	_ = without.each(func(_ uint16, p []byte) error { want = append(want, p); return nil })
	if len(got) != len(want) || len(got) != (n+elemChunk-1)/elemChunk || with.Bytes() != without.Bytes() {
		t.Fatalf("%d messages (%d bytes) with Expect, %d (%d bytes) without", len(got), with.Bytes(), len(want), without.Bytes())
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("message %d differs", i)
		}
	}
	if grownWith != 1 || grownWithout < 4 {
		t.Fatalf("first page had %d capacities with Expect (want 1), %d without", grownWith, grownWithout)
	}
	if len(with.pages) < 2 {
		t.Fatalf("%d pages", len(with.pages))
	}
	for i, p := range with.pages[1:] {
		if cap(p) != pageSize+pageSize/4 {
			t.Fatalf("page %d: capacity %d", i+1, cap(p))
		}
	}
}
