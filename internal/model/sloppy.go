package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ParsePrefixSloppy parses a CIDR as leniently as kube-proxy reads
// loadBalancerSourceRanges: surrounding spaces are ignored, and IPv4 octets and the
// prefix length may have leading zeros, which count as decimal ("010.000.0.0/08" is
// 10.0.0.0/8), as Go's net package accepted before 1.17 and objects stored then may
// still hold. The result is not masked.
func ParsePrefixSloppy(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		return netip.PrefixFrom(p.Addr().Unmap(), unmappedBits(p)), nil
	}
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q has no prefix length", s)
	}
	n, err := decimal(bits, 128)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q: bad prefix length", s)
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		ip, err = sloppyIPv4(addr)
	}
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q: bad address", s)
	}
	p := netip.PrefixFrom(ip, n)
	if !p.IsValid() {
		return netip.Prefix{}, fmt.Errorf("%q: prefix length out of range", s)
	}
	return netip.PrefixFrom(p.Addr().Unmap(), unmappedBits(p)), nil
}

// unmappedBits is the prefix length of p once an IPv4-mapped address is taken as IPv4.
func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return max(p.Bits()-96, 0)
	}
	return p.Bits()
}

// sloppyIPv4 parses dotted decimal IPv4 with leading zeros in the octets.
func sloppyIPv4(s string) (netip.Addr, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, fmt.Errorf("%q is not an IPv4 address", s)
	}
	var b [4]byte
	for i, part := range parts {
		n, err := decimal(part, 255)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%q is not an IPv4 address", s)
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), nil
}

// decimal parses 1 to 10 decimal digits (leading zeros allowed) no greater than limit.
func decimal(s string, limit int) (int, error) {
	if s == "" || len(s) > 10 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a small decimal number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > limit {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return n, nil
}
