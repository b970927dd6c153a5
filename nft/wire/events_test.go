package wire

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// eventMsg is one nf_tables event as the kernel multicasts it.
func eventMsg(typ uint16, fam nft.Family, port uint32, attrs func(b *Batch)) []byte {
	b := &Batch{fam: fam}
	b.begin(typ, 0)
	attrs(b)
	b.finish()
	m := b.pages[0]
	binary.NativeEndian.PutUint32(m[12:16], port)
	return m
}

// TestEvents parses a datagram of object events and a NEWGEN: table and object names,
// the committing port, the generation and process; an event on a skipped port is not
// decoded; a broken length is ErrMalformed.
func TestEvents(t *testing.T) {
	var d []byte
	d = append(d, eventMsg(unix.NFT_MSG_DELSETELEM, nft.IPv4, 7, func(b *Batch) {
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, "nftproxy")
		b.str(unix.NFTA_SET_ELEM_LIST_SET, "service-ips")
	})...)
	d = append(d, eventMsg(unix.NFT_MSG_NEWRULE, nft.IPv6, 9, func(b *Batch) {
		b.str(unix.NFTA_RULE_TABLE, "nftproxy")
		b.str(unix.NFTA_RULE_CHAIN, "services")
	})...)
	d = append(d, eventMsg(unix.NFT_MSG_DELTABLE, nft.IPv4, 7, func(b *Batch) { b.str(unix.NFTA_TABLE_NAME, "other") })...)
	d = append(d, eventMsg(unix.NFT_MSG_NEWGEN, 0, 7, func(b *Batch) {
		b.u32(unix.NFTA_GEN_ID, 42)
		b.u32(unix.NFTA_GEN_PROC_PID, 1234)
		b.str(unix.NFTA_GEN_PROC_NAME, "nft")
	})...)
	var got []Event
	if err := Events(d, func(port uint32) bool { return port == 9 }, func(e Event) { got = append(got, e) }); err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Type: unix.NFT_MSG_DELSETELEM, Port: 7, Family: nft.IPv4, Table: "nftproxy", Name: "service-ips", Object: true},
		{Type: unix.NFT_MSG_NEWRULE, Port: 9, Family: nft.IPv6, Skipped: true, Object: true},
		{Type: unix.NFT_MSG_DELTABLE, Port: 7, Family: nft.IPv4, Table: "other", Object: true},
		{Type: unix.NFT_MSG_NEWGEN, Port: 7, Gen: 42, PID: 1234, Process: "nft"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	bad := eventMsg(unix.NFT_MSG_DELCHAIN, nft.IPv4, 7, func(b *Batch) { b.str(unix.NFTA_CHAIN_TABLE, "nftproxy") })
	binary.NativeEndian.PutUint32(bad[0:4], uint32(len(bad)+100))
	if err := Events(bad, nil, func(Event) {}); !errors.Is(err, ErrMalformed) {
		t.Errorf("a length past the datagram: %v, want ErrMalformed", err)
	}
}
