package wire

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// Keys and values of every datatype nftproxy uses, alone and concatenated, encode and
// decode back to themselves, their types recovered from the set's type id and length.
func TestValuesRoundTrip(t *testing.T) {
	a4, a6 := nft.Addr(netip.MustParseAddr("10.96.0.1")), nft.Addr(netip.MustParseAddr("fd00::a"))
	for _, tc := range []struct {
		types []nft.Datatype
		vals  []nft.Value
	}{
		{[]nft.Datatype{nft.TypeIPv4Addr}, []nft.Value{a4}},
		{[]nft.Datatype{nft.TypeIPv6Addr}, []nft.Value{a6}},
		{[]nft.Datatype{nft.TypeInetService}, []nft.Value{nft.Num(30080)}},
		{[]nft.Datatype{nft.TypeNumgen}, []nft.Value{nft.Num(7)}},
		{[]nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, []nft.Value{a4, nft.Num(17), nft.Num(53)}},
		{[]nft.Datatype{nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen}, []nft.Value{a6, nft.Num(6), nft.Num(443), nft.Num(2)}},
		{[]nft.Datatype{nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen}, []nft.Value{nft.Num(132), nft.Num(1), nft.Num(0)}},
	} {
		b, err := AppendValues(nil, tc.types, tc.vals)
		if err != nil {
			t.Fatalf("%v: %v", tc.types, err)
		}
		if len(b) != KeyLen(tc.types) {
			t.Errorf("%v: %d bytes, KeyLen %d", tc.types, len(b), KeyLen(tc.types))
		}
		got, ok := decodeValues(tc.types, b)
		if !ok || !reflect.DeepEqual(got, tc.vals) {
			t.Errorf("%v: decoded %v (ok %v), want %v", tc.types, got, ok, tc.vals)
		}
		id, n := concatType(tc.types)
		if back := TypesOf(id, n); !reflect.DeepEqual(back, tc.types) {
			t.Errorf("TypesOf(%#x, %d) = %v, want %v", id, n, back, tc.types)
		}
		if !SameKeyType(id, id) {
			t.Errorf("%v: key type %#x is not itself", tc.types, id)
		}
		if _, ok := decodeValues(tc.types, b[:len(b)-1]); ok {
			t.Errorf("%v: decoded from a byte short", tc.types)
		}
	}
	if _, err := AppendValues(nil, []nft.Datatype{nft.TypeIPv4Addr}, []nft.Value{a6}); err == nil {
		t.Error("an IPv6 address encoded as an IPv4 key")
	}
	if got := RenderBytes([]nft.Datatype{nft.TypeIPv4Addr}, []byte{1, 2}); got != "0x0102" {
		t.Errorf("bytes that are no address: %q", got)
	}
	if got := RenderBytes([]nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}, []byte{10, 0, 0, 1, 0, 80, 0, 0}); got != "10.0.0.1 . 80" {
		t.Errorf("a concatenation rendered %q", got)
	}
}

// A numgen index in a concatenation has nftproxy's type or nft's, and both are the
// same key type; other differences are not.
func TestSameKeyType(t *testing.T) {
	ours, _ := concatType([]nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService, nft.TypeNumgen})
	nfts := ours&^0x3f | typeMark
	other, _ := concatType([]nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService, nft.TypeInetService})
	if !SameKeyType(ours, nfts) || !SameKeyType(nfts, ours) {
		t.Errorf("%#x and %#x differ", ours, nfts)
	}
	if SameKeyType(ours, other) {
		t.Errorf("%#x and %#x are the same", ours, other)
	}
	if SameKeyType(typeID(nft.TypeIPv4Addr), typeID(nft.TypeIPv6Addr)) {
		t.Error("IPv4 and IPv6 addresses are the same key type")
	}
}

// Verdicts and comments as the kernel dumps them.
func TestVerdictsAndComments(t *testing.T) {
	for _, tc := range []struct {
		v    nft.Verdict
		want string
	}{
		{nft.Verdict{Kind: nft.Accept}, "accept"}, {nft.Verdict{Kind: nft.Drop}, "drop"},
		{nft.Verdict{Kind: nft.Return}, "return"}, {nft.Verdict{Kind: nft.Jump, Chain: "c"}, "jump c"},
		{nft.Verdict{Kind: nft.Goto, Chain: "d"}, "goto d"},
	} {
		code, chain, err := verdictCode(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		e := ElemState{Verdict: true, VerdictCode: code, VerdictChain: chain}
		if got := VerdictString(e); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.v, got, tc.want)
		}
		if got := decodeVerdictKind(e); got != tc.v {
			t.Errorf("%q decoded as %v", tc.want, got)
		}
	}
	if got := VerdictString(ElemState{VerdictCode: 0xfffffffe}); got != "verdict -2" {
		t.Errorf("an unknown verdict: %q", got)
	}
	u := udataString(udataU32(nil, 5, 1), udataComment, "default/web:http")
	if got := CommentOf(u); got != "default/web:http" {
		t.Errorf("comment after another TLV: %q", got)
	}
	if got := CommentOf(u[:len(u)-3]); got != "" {
		t.Errorf("a truncated comment: %q", got)
	}
	if got := DataString([]byte{1, 2, 3}); got != "0x010203" {
		t.Errorf("data that is no attribute: %q", got)
	}
}
