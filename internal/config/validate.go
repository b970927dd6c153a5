package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The checks below are shared by the configuration file and the command line; their
// errors do not name the field, the caller does.

// ParseClusterCIDRs parses a clusterCIDR value: comma-separated CIDRs, at most one per
// IP family. An empty value means none.
func ParseClusterCIDRs(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	var seen4, seen6 bool
	for _, part := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", part)
		}
		if (p.Addr().Is4() && seen4) || (p.Addr().Is6() && seen6) {
			return nil, fmt.Errorf("at most one CIDR per IP family, got %q", s)
		}
		seen4, seen6 = seen4 || p.Addr().Is4(), seen6 || p.Addr().Is6()
		out = append(out, p.Masked())
	}
	return out, nil
}

// Keywords of nodePortAddresses, as kube-proxy's.
const (
	NodePortPrimary   = "primary"
	NodePortAll       = "all"
	NodePortLocalhost = "localhost"
)

// CheckNodePortAddress checks one entry a of the nodePortAddresses list all.
func CheckNodePortAddress(a string, all []string) error {
	switch a {
	case NodePortPrimary:
		if len(all) > 1 {
			return fmt.Errorf("%q must be used alone in nftproxy (it cannot be combined with CIDRs or other keywords yet)", a)
		}
		return nil
	case NodePortAll:
		return nil
	case NodePortLocalhost:
		if len(all) == 1 {
			return fmt.Errorf("%q alone: nftproxy does not serve node ports on loopback addresses", a)
		}
		return nil
	}
	if _, err := netip.ParsePrefix(a); err != nil {
		return fmt.Errorf("%q is not a CIDR or one of the keywords primary, all, localhost", a)
	}
	return nil
}

// NormalizeNodePortAddresses expands a checked nodePortAddresses list into what the
// proxy understands: nothing or "primary" (the node's primary IPs), or CIDRs. "all"
// becomes 0.0.0.0/0 and ::/0; "localhost" is dropped (node ports are never served on
// loopback addresses here), with a note.
func NormalizeNodePortAddresses(in []string) (out []string, notes []string) {
	for _, a := range in {
		switch a {
		case NodePortAll:
			out = append(out, "0.0.0.0/0", "::/0")
		case NodePortLocalhost:
			notes = append(notes, `nodePortAddresses: "localhost" has no effect: nftproxy does not serve node ports on loopback addresses`)
		default:
			out = append(out, a)
		}
	}
	return slices.Compact(out), notes
}

// CheckBindAddress checks a server address: empty (disabled) or IP:port.
func CheckBindAddress(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q must be IP:port", addr)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q: %q is not an IP address", addr, host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: %q is not a port (1-65535)", addr, port)
	}
	return nil
}

// CheckDetectLocalMode accepts kube-proxy's default, ClusterCIDR.
func CheckDetectLocalMode(mode string) error {
	switch mode {
	case "", "ClusterCIDR":
		return nil
	case "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
		return fmt.Errorf("%q is not supported by nftproxy (only ClusterCIDR)", mode)
	}
	return fmt.Errorf("%q is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix", mode)
}

// CheckLoggingFormat accepts "text" and "json".
func CheckLoggingFormat(f string) error {
	if f != "text" && f != "json" {
		return fmt.Errorf("%q is not text or json", f)
	}
	return nil
}

// CheckMasqueradeBit accepts 0..31.
func CheckMasqueradeBit(b int32) error {
	if b < 0 || b > 31 {
		return fmt.Errorf("%d is not in 0..31", b)
	}
	return nil
}
