package nft

import (
	"net/netip"
	"testing"
	"unsafe"
)

func TestValue(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")
	mapped := netip.MustParseAddr("::ffff:10.96.0.1")
	for _, tc := range []struct {
		v    Value
		addr netip.Addr
		num  uint32
		str  string
	}{
		{Addr(v4), v4, 0, "10.96.0.1"},
		{Addr(v6), v6, 0, "fd00::1"},
		{Addr(mapped), mapped, 0, "::ffff:10.96.0.1"}, // stays IPv6
		{Num(0), netip.Addr{}, 0, "0"},
		{Num(443), netip.Addr{}, 443, "443"},
		{Num(1<<32 - 1), netip.Addr{}, 1<<32 - 1, "4294967295"},
	} {
		if got := tc.v.Addr(); got != tc.addr {
			t.Errorf("%v.Addr() = %v, want %v", tc.v, got, tc.addr)
		}
		if got := tc.v.Num(); got != tc.num {
			t.Errorf("%v.Num() = %d, want %d", tc.v, got, tc.num)
		}
		if got := tc.v.String(); got != tc.str {
			t.Errorf("String() = %q, want %q", got, tc.str)
		}
	}
	// equal values are ==, different kinds are not
	if Addr(v4) != Addr(netip.MustParseAddr("10.96.0.1")) || Addr(netip.IPv4Unspecified()) == Num(0) || Addr(v4) == Addr(mapped) {
		t.Error("Value equality does not follow the address or number")
	}
	// bytes only: 17 bytes, packed in arrays (a key of 5 fields is 85 bytes)
	if s, a := unsafe.Sizeof(Value{}), unsafe.Sizeof([5]Value{}); s != 17 || a != 85 {
		t.Errorf("a Value takes %d bytes (5: %d), want 17 (85)", s, a)
	}
}
