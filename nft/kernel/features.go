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
	// Source is where the kernel version comes from: the kernel commit (id and title)
	// and, when found, the document that places it in a release.
	Source string
	// Verified is true when Source names the release itself (a tag, or a release note
	// or documentation page stating the kernel version). False: the commit is known but
	// its release was inferred (from dates) and not checked against a tag.
	Verified bool
}

// Features lists what nftproxy's ruleset needs from nf_tables, oldest first. The
// highest entry is the floor (FloorMajor.FloorMinor).
//
// The list was made from what nft/wire sends (expressions: bitwise, cmp, counter, ct,
// dynset, fib, immediate, lookup, masq, meta, nat, numgen, payload, reject; set
// attributes: flags map/timeout/eval, key and data types and lengths, desc size,
// timeout, userdata, NFTA_SET_EXPR; element attributes: key, data, userdata,
// NFTA_SET_ELEM_EXPR) and from the compiled rulesets (internal/compile/testdata).
// Newer kernel attributes nftproxy only reads, never sends: NFTA_SET_EXPRESSIONS and
// NFTA_SET_ELEM_EXPRESSIONS (commit 8cfd9b0f8515 "netfilter: nftables: generalize set
// expressions support", after 5.7; release not checked), so they do not raise the
// floor. Nor does reject, which nftproxy only uses in filter input/forward/output
// (reject in prerouting needs 5.9, per kube-proxy's pkg/proxy/nftables/README.md), and
// no chain comments or table owner flag (newer kernels too) are sent.
//
// An older kernel does not always refuse what it lacks: attributes it does not know
// are ignored by its netlink parser, so below the floor counters or numgen offsets
// would silently be missing. That is why the release is checked at startup.
var Features = []Feature{
	{
		Name: "nf_tables", Major: 3, Minor: 13,
		What: "tables, base chains (filter and nat hooks), verdict maps with jump/goto, payload incl. th (transport header), meta mark/l4proto, ct state/status, counter, bitwise/cmp/immediate/lookup, dnat from registers (address and port), reject",
		// The nftables merge (commit 96518518cc41 "netfilter: add nftables") is in 3.13.
		// Unverified details, all well below the floor: meta l4proto and the inet
		// family came in a 3.14-era series, sets and chains joined the transaction
		// batches in 3.16.
		Source:   "Kernel Recipes 2014, \"What's new in nftables\" (https://kernel-recipes.org/en/2014/whats-new-in-nftables/): introduced in the 3.13 kernel",
		Verified: true,
	},
	{
		Name: "masquerade", Major: 3, Minor: 18,
		What: "masquerade fully-random for hairpin and off-cluster traffic",
		// NFTA_MASQ_FLAGS (fully-random) coming with the masq expression itself is not
		// checked against its commit.
		Source:   "nftables wiki, Performing Network Address Translation: \"masquerade is available starting with Linux Kernel 3.18\"",
		Verified: true,
	},
	{
		Name: "concatenations", Major: 4, Minor: 1,
		What: "set and map keys like ip daddr . meta l4proto . th dport; map data address . port for dnat (32-bit registers, data longer than 16 bytes for IPv6)",
		// The concatenated map data (address . port, 20 bytes for IPv6) relies on the
		// same 4.1 register and variable-length data work; not separately checked.
		Source:   "nftables wiki, Concatenations: \"Since Linux kernel 4.1, nftables supports concatenations\"",
		Verified: true,
	},
	{
		Name: "set-timeouts", Major: 4, Minor: 1,
		What:   "session-affinity sets: dynamic, element timeouts, update from the packet path",
		Source: "commit 22fe54d5fefc \"netfilter: nf_tables: add support for dynamic set updates\" (with the set timeout support of the same series); release 4.1 not checked against a tag",
	},
	{
		Name: "set-comments", Major: 4, Minor: 6,
		What: "comments (userdata) on sets and elements: service names on counter elements and in verify/list",
		// Element userdata (NFTA_SET_ELEM_USERDATA) is older (4.1-era set extensions,
		// unverified); the set's own userdata is the later of the two.
		Source: "commit e6d8ecac9e68 \"netfilter: nf_tables: Add new attributes into nft_set to store user data.\"; its release was not found: 4.6 is an estimate",
	},
	{
		Name: "numgen", Major: 4, Minor: 9,
		What:   "numgen random: picking an endpoint",
		Source: "kernel nft_numgen (Laura Garcia, 2016); nftables \"src: add numgen expression\" (13eeed6ea6f0, 2016-08-26, v0.7); release 4.9 inferred from the dates, not checked against a tag",
	},
	{
		Name: "numgen-offset", Major: 4, Minor: 10,
		What: "numgen random mod N offset O: each service's slots in the shared endpoint map",
		// Added after numgen itself (libnftnl's first numgen had no offset). An older
		// kernel ignores NFTA_NG_OFFSET, so every service would pick slot 0's endpoints.
		Source: "NFTA_NG_OFFSET, nft_numgen offset support (Laura Garcia); release 4.10 not checked against a tag",
	},
	{
		Name: "fib", Major: 4, Minor: 10,
		What: "fib saddr type local: short-circuit of local traffic for externalTrafficPolicy Local",
		// The commit message folds in a compile fix posted after the 4.9 merge window
		// (patchwork 688615, nf-next rebase), so the 4.10 cycle.
		Source: "commit f6d0cbcf09c5 \"netfilter: nf_tables: add fib expression\"; release 4.10 inferred from the commit text, not checked against a tag",
	},
	{
		Name: "set-counters", Major: 5, Minor: 7,
		What: "counter on sets and their elements (NFTA_SET_EXPR, NFTA_SET_ELEM_EXPR): per-service packet and byte metrics",
		Source: "commit 65038428b2c6 \"netfilter: nf_tables: allow to specify stateful expression in set definition\", v5.7-rc1 (nftables tests/shell/features/set_expr.sh); " +
			"commit 409444522976 \"netfilter: nf_tables: add elements with stateful expressions\", in the nf-next pull of 2020-03-18 (\"Add stateful expression support to elements via control plane\") merged for 5.7",
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
