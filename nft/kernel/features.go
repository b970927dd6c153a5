package kernel

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Release is a kernel release, the first numbers of `uname -r`.
type Release struct {
	Major, Minor, Patch int
	Raw                 string // as uname reports it, e.g. 6.1.0-26-amd64
}

// ParseRelease reads the leading "X.Y[.Z]" of a kernel release string.
func ParseRelease(s string) (Release, error) {
	r := Release{Raw: s}
	fields := strings.SplitN(s, ".", 3)
	if len(fields) < 2 {
		return r, fmt.Errorf("kernel release %q is not X.Y[.Z]", s)
	}
	nums := []*int{&r.Major, &r.Minor, &r.Patch}
	for i, f := range fields {
		end := 0
		for end < len(f) && f[end] >= '0' && f[end] <= '9' {
			end++
		}
		if end == 0 {
			if i < 2 {
				return r, fmt.Errorf("kernel release %q is not X.Y[.Z]", s)
			}
			break
		}
		n, err := strconv.Atoi(f[:end])
		if err != nil {
			return r, fmt.Errorf("kernel release %q: %w", s, err)
		}
		*nums[i] = n
		if end < len(f) { // "6.1-rc3": stop at the suffix
			break
		}
	}
	return r, nil
}

// AtLeast reports whether r is major.minor or later.
func (r Release) AtLeast(major, minor int) bool {
	return r.Major > major || (r.Major == major && r.Minor >= minor)
}

func (r Release) String() string { return fmt.Sprintf("%d.%d", r.Major, r.Minor) }

// RunningRelease returns the release of the running kernel (uname).
func RunningRelease() (Release, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Release{}, fmt.Errorf("uname: %w", err)
	}
	return ParseRelease(unix.ByteSliceToString(u.Release[:]))
}

// Feature is an nf_tables capability the ruleset nftproxy programs relies on, and the
// mainline kernel that introduced it.
type Feature struct {
	Name         string
	Major, Minor int
	What         string // what nftproxy uses it for
	// Source is where the kernel version comes from: the kernel source trees checked
	// (the release before lacks it, the release has it) and/or the kernel commit or
	// the document naming the release.
	Source string
	// Verified is true when Source establishes the release itself (source trees of
	// the release and the one before, a tag, or a document stating the version).
	// False: only the commit is known and its release was inferred.
	Verified bool
}

// Features lists what nftproxy's ruleset needs from nf_tables, oldest first. The
// highest entry is the floor (FloorMajor.FloorMinor).
//
// The list was made from what nft/wire sends (expressions: bitwise, cmp, counter, ct,
// dynset, fib, immediate, lookup, masq, meta, nat, numgen, payload, reject; set
// attributes: flags map/timeout/eval, key and data types and lengths, id, desc size,
// timeout, userdata, NFTA_SET_EXPR; element attributes: key, data, userdata,
// NFTA_SET_ELEM_EXPR; lookups by set id; rule userdata) and from the compiled
// rulesets (internal/compile/testdata).
//
// Releases were checked in kernel source trees (include/uapi/linux/netfilter/
// nf_tables.h, net/netfilter): a feature is dated X.Y when the X.Y tree has it and
// the one before does not. The trees are public snapshots of release or stable
// tarballs (3.13.10, 3.14.1, 3.15.5, 3.16.0, 3.17.0, 3.18.30, 4.0.5, 4.1.3, 4.4.11,
// 4.5.7, 4.8.15, 4.9.0, 4.10.0, 5.6.4, 5.7.14); stable updates do not add such
// uapi, so a feature in X.Y.z is in X.Y.
//
// Newer attributes nftproxy only reads, never sends: NFTA_SET_EXPRESSIONS and
// NFTA_SET_ELEM_EXPRESSIONS (commit 8cfd9b0f8515 "netfilter: nftables: generalize set
// expressions support", after 5.7; release not checked), and NFTA_GEN_PROC_PID on
// NEWGEN events (absent in 4.5.7; nftproxy tells its own events by netlink port id).
// NEWGEN events themselves are in 4.2.8, not in 3.17.0 (not pinned further, below
// the floor either way). Reject is used only in filter input/forward/output (reject
// in prerouting needs 5.9, per kube-proxy's pkg/proxy/nftables/README.md); no chain
// comments or table owner flag (newer kernels) are sent.
//
// An older kernel does not always refuse what it lacks: attributes it does not know
// are ignored by its netlink parser (read in the 5.6.4 source: it ignores
// NFTA_SET_EXPR and keeps elements without their NFTA_SET_ELEM_EXPR), so below the
// floor the counters would silently be missing. That is why the release is checked at startup.
var Features = []Feature{
	{
		Name: "nf_tables", Major: 3, Minor: 13,
		What: "tables, filter and nat base chains, verdict maps with jump/goto, payload incl. th (transport header), meta mark, ct state/status, counter, dnat from registers (address and port), reject",
		Source: "nf_tables in 3.13 (Kernel Recipes 2014, \"What's new in nftables\": introduced in the 3.13 kernel; merge commit 96518518cc41 \"netfilter: add nftables\"); " +
			"3.13.10 tree: NFT_CT_STATUS, NFTA_NAT_REG_PROTO_MIN, NFT_PAYLOAD_TRANSPORT_HEADER, nft_reject_ipv4",
		Verified: true,
	},
	{
		Name: "meta-l4proto", Major: 3, Minor: 14,
		What:     "meta l4proto in every service key (ip daddr . meta l4proto . th dport); ip6 reject (nft_reject_ipv6)",
		Source:   "NFT_META_L4PROTO and nft_reject_ipv6: not in the 3.13.10 tree, in 3.14.1",
		Verified: true,
	},
	{
		Name: "rule-comments", Major: 3, Minor: 15,
		What:     "rule comments (NFTA_RULE_USERDATA): the service on every dnat rule, read back by verify and list",
		Source:   "NFTA_RULE_USERDATA: not in the 3.14.1 tree, in 3.15.5",
		Verified: true,
	},
	{
		Name: "set-ids", Major: 3, Minor: 16,
		What:     "sets created and used by rules in one transaction (NFTA_SET_ID, NFTA_LOOKUP_SET_ID); set size hints (NFTA_SET_DESC_SIZE)",
		Source:   "NFTA_SET_ID, NFTA_LOOKUP_SET_ID, NFTA_SET_DESC_SIZE: not in the 3.15.5 tree, in 3.16.0",
		Verified: true,
	},
	{
		Name: "masquerade", Major: 3, Minor: 18,
		What: "masquerade fully-random for hairpin and off-cluster traffic",
		Source: "nft_masq with NFTA_MASQ_FLAGS: not in the 3.17.0 tree, in 3.18.30; " +
			"nftables wiki, Performing Network Address Translation: \"masquerade is available starting with Linux Kernel 3.18\"",
		Verified: true,
	},
	{
		Name: "concatenations", Major: 4, Minor: 1,
		What: "set and map keys like ip daddr . meta l4proto . th dport; map data address . port for dnat (32-bit registers, data longer than 16 bytes for IPv6)",
		Source: "NFT_REG32_00 and NFT_DATA_VALUE_MAXLEN: not in the 4.0.5 tree, in 4.1.3; " +
			"nftables wiki, Concatenations: \"Since Linux kernel 4.1, nftables supports concatenations\"",
		Verified: true,
	},
	{
		Name: "set-timeouts", Major: 4, Minor: 1,
		What: "session-affinity sets: dynamic, element timeouts, update from the packet path; element comments (NFTA_SET_ELEM_USERDATA)",
		Source: "nft_dynset, NFTA_SET_TIMEOUT, NFTA_SET_ELEM_USERDATA: not in the 4.0.5 tree, in 4.1.3; " +
			"commit 22fe54d5fefc \"netfilter: nf_tables: add support for dynamic set updates\"",
		Verified: true,
	},
	{
		Name: "set-comments", Major: 4, Minor: 5,
		What: "comments on sets (NFTA_SET_USERDATA): each set's purpose, and the typeof data nft needs to list the endpoint map",
		Source: "NFTA_SET_USERDATA: not in the 4.4.11 tree, in 4.5.7; " +
			"commit e6d8ecac9e68 \"netfilter: nf_tables: Add new attributes into nft_set to store user data.\"",
		Verified: true,
	},
	{
		Name: "numgen", Major: 4, Minor: 9,
		What: "numgen random mod N (offset O): picking an endpoint, inside the endpoints map key of a flat frontend and in a chained service's slots",
		// An older kernel would refuse the unknown numgen expression outright; the
		// offset (NFTA_NG_OFFSET) is in the same release.
		Source: "nft_numgen with NFTA_NG_OFFSET: not in the 4.8.15 tree, in 4.9.0; " +
			"nftables \"src: add numgen expression\" (13eeed6ea6f0, 2016-08-26, v0.7)",
		Verified: true,
	},
	{
		Name: "fib", Major: 4, Minor: 10,
		What: "fib saddr type local: short-circuit of local traffic for externalTrafficPolicy Local",
		Source: "nft_fib (NFT_FIB_RESULT_ADDRTYPE): not in the 4.9.0 tree, in 4.10.0; " +
			"commit f6d0cbcf09c5 \"netfilter: nf_tables: add fib expression\"",
		Verified: true,
	},
	{
		Name: "set-counters", Major: 5, Minor: 7,
		What: "counter on sets and their elements (NFTA_SET_EXPR, NFTA_SET_ELEM_EXPR): per-service packet and byte metrics",
		Source: "NFTA_SET_EXPR and element expressions from the control plane: not in the 5.6.4 tree, in 5.7.14; " +
			"commit 65038428b2c6 \"netfilter: nf_tables: allow to specify stateful expression in set definition\", v5.7-rc1 (nftables tests/shell/features/set_expr.sh); " +
			"commit 409444522976 \"netfilter: nf_tables: add elements with stateful expressions\", in the nf-next pull of 2020-03-18 merged for 5.7",
		Verified: true,
	},
}

// FloorMajor and FloorMinor are the oldest kernel nftproxy runs on: the newest entry
// of Features.
const (
	FloorMajor = 5
	FloorMinor = 7
)

// TestedMajor and TestedMinor are kube-proxy's own floor for its nftables mode: nothing
// older is tested by either project. nftproxy runs below it (down to the floor) with a
// warning.
const (
	TestedMajor = 5
	TestedMinor = 13
)

// Available returns the names of the Features r has, in order.
func Available(r Release) []string {
	var out []string
	for _, f := range Features {
		if r.AtLeast(f.Major, f.Minor) {
			out = append(out, f.Name)
		}
	}
	return out
}

// CheckRelease refuses a kernel older than the floor, naming the features it lacks.
// warning is set for a kernel between the floor and kube-proxy's floor.
func CheckRelease(r Release) (warning string, err error) {
	if !r.AtLeast(FloorMajor, FloorMinor) {
		var missing []string
		for _, f := range Features {
			if !r.AtLeast(f.Major, f.Minor) {
				missing = append(missing, fmt.Sprintf("%s (%d.%d: %s)", f.Name, f.Major, f.Minor, f.What))
			}
		}
		return "", fmt.Errorf("kernel %s is older than %d.%d, the oldest nftproxy's ruleset runs on; it lacks %s",
			r.Raw, FloorMajor, FloorMinor, strings.Join(missing, ", "))
	}
	if !r.AtLeast(TestedMajor, TestedMinor) {
		return fmt.Sprintf("kernel %s has every nf_tables feature nftproxy uses but is older than %d.%d, kube-proxy's floor for its nftables mode; nftproxy is not tested on it",
			r.Raw, TestedMajor, TestedMinor), nil
	}
	return "", nil
}
