package config

import (
	"errors"
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

// ParseCIDRs parses a list of CIDRs (--external-ip-cidrs): any number, of either
// family. An IPv4-mapped IPv6 CIDR is refused (the API stores IPv4 addresses as such).
func ParseCIDRs(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range list {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", part)
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("%q is an IPv4-mapped IPv6 CIDR; give the IPv4 CIDR", part)
		}
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

// NodePortAddresses is a parsed nodePortAddresses list (--nodeport-addresses), with
// kube-proxy v1.37's meaning in nftables mode: per IP family, node ports answer on the
// local addresses inside the family's ranges ("primary": the node's primary IP); a
// family the list does not name at all answers on every local address of it; loopback
// addresses never answer.
type NodePortAddresses struct {
	// Primary: the list has "primary" (also the default, an empty list): the node's
	// primary IPs, from its Node object, answer.
	Primary bool
	// CIDRs are the list's ranges, "all" (0.0.0.0/0, ::/0) and "localhost"
	// (127.0.0.0/8, ::1/128) expanded, masked, without duplicates.
	CIDRs []netip.Prefix
	// Localhost: the list has "localhost" (kept for the note that it has no effect).
	Localhost bool
}

// ParseNodePortAddresses checks and parses a nodePortAddresses list as kube-proxy v1.37
// does: CIDRs and the keywords primary, localhost and all, in any combination, each
// keyword at most once. An empty list is "primary" (the nftables mode default). Errors
// name each bad entry as name[index].
func ParseNodePortAddresses(name string, list []string) (NodePortAddresses, error) {
	var out NodePortAddresses
	if len(list) == 0 {
		out.Primary = true
		return out, nil
	}
	seen := map[string]bool{}
	var errs []error
	add := func(ps ...string) {
		for _, s := range ps {
			p := netip.MustParsePrefix(s)
			if !slices.Contains(out.CIDRs, p) {
				out.CIDRs = append(out.CIDRs, p)
			}
		}
	}
	for i, a := range list {
		switch a {
		case NodePortPrimary, NodePortAll, NodePortLocalhost:
			if seen[a] {
				errs = append(errs, fmt.Errorf("%s[%d]: %q is given twice", name, i, a))
			}
			seen[a] = true
		}
		switch a {
		case NodePortPrimary:
			out.Primary = true
		case NodePortAll:
			add("0.0.0.0/0", "::/0")
		case NodePortLocalhost:
			out.Localhost = true
			add("127.0.0.0/8", "::1/128")
		default:
			p, err := netip.ParsePrefix(strings.TrimSpace(a))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %q is not a CIDR or one of the keywords primary, localhost, all", name, i, a))
				continue
			}
			add(p.Masked().String())
		}
	}
	return out, errors.Join(errs...)
}

// Notes are kube-proxy's warnings about a nodePortAddresses list, and what it means
// here: loopback addresses never take node ports (kube-proxy v1.37's nftables mode,
// without the alpha gate KubeProxyNFTablesLocalhostNodePorts), and a family the list
// leaves out answers on all its local addresses.
func (n NodePortAddresses) Notes() []string {
	var notes []string
	if n.Localhost {
		notes = append(notes, `nodePortAddresses: "localhost" has no effect: node ports are never served on loopback addresses (as in kube-proxy's nftables mode)`)
	}
	if n.Primary {
		return notes
	}
	for _, fam := range []struct {
		name  string
		v6    bool
		other string
	}{{"IPv4", false, "IPv6"}, {"IPv6", true, "IPv4"}} {
		if !slices.ContainsFunc(n.CIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() == fam.v6 }) {
			notes = append(notes, fmt.Sprintf("nodePortAddresses contains only %s addresses; NodePort connections will be accepted on all local %s IPs", fam.other, fam.name))
		}
	}
	return notes
}

// NodePortFamily is what a NodePortAddresses means in one IP family.
type NodePortFamily struct {
	// AllLocal: every local address of the family answers (a /0 range, or a family
	// the list leaves out).
	AllLocal bool
	// Addrs are the addresses that answer otherwise (never loopback).
	Addrs []netip.Addr
}

// Resolve gives, for one family (v6), the addresses node ports answer on: the node's
// primary IP of that family when Primary, and the local addresses (listed by local,
// called only when needed; nil: none known) inside CIDRs.
func (n NodePortAddresses) Resolve(v6 bool, nodeIPs []netip.Addr, local func() ([]netip.Addr, error)) (NodePortFamily, error) {
	var out NodePortFamily
	var cidrs []netip.Prefix
	for _, p := range n.CIDRs {
		if p.Addr().Is6() == v6 {
			cidrs = append(cidrs, p)
		}
	}
	var primary []netip.Addr
	if n.Primary {
		for _, ip := range nodeIPs {
			if ip.Is6() == v6 && !ip.IsLoopback() {
				primary = append(primary, ip)
			}
		}
	}
	if len(cidrs) == 0 && len(primary) == 0 || slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		out.AllLocal = true
		return out, nil
	}
	out.Addrs = primary
	if len(cidrs) == 0 || local == nil {
		return out, nil
	}
	addrs, err := local()
	if err != nil {
		return out, fmt.Errorf("listing local addresses for nodePortAddresses: %w", err)
	}
	for _, a := range addrs {
		a = a.Unmap()
		if a.IsLoopback() || slices.Contains(out.Addrs, a) {
			continue
		}
		if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			out.Addrs = append(out.Addrs, a)
		}
	}
	return out, nil
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

// Modes of detectLocalMode (--detect-local-mode), as kube-proxy's.
const (
	LocalModeClusterCIDR         = "ClusterCIDR"
	LocalModeNodeCIDR            = "NodeCIDR"
	LocalModeBridgeInterface     = "BridgeInterface"
	LocalModeInterfaceNamePrefix = "InterfaceNamePrefix"
)

// CheckDetectLocalMode accepts kube-proxy's modes ("" is ClusterCIDR).
func CheckDetectLocalMode(mode string) error {
	switch mode {
	case "", LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix:
		return nil
	}
	return fmt.Errorf("%q is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix", mode)
}

// CheckInterfaceName checks the interface name (or name prefix) that BridgeInterface
// and InterfaceNamePrefix need: not empty (as kube-proxy) and short enough to be an
// interface name (15 bytes), so that the kernel cannot refuse the rule.
func CheckInterfaceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case len(name) > 15:
		return fmt.Errorf("%q is longer than an interface name (15 bytes)", name)
	case strings.ContainsAny(name, "\x00/ \t\n\"*"):
		return fmt.Errorf("%q is not an interface name", name)
	}
	return nil
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
