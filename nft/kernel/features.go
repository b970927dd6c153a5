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
}

// Features lists what nftproxy's ruleset needs from nf_tables, oldest first. The
// highest entry is the floor (FloorMajor.FloorMinor).
var Features = []Feature{
	{"nf_tables", 3, 13, "tables, base chains, verdict maps, ct state/status, reject in filter input/forward/output"},
	{"masquerade", 3, 18, "masquerade fully-random for hairpin and off-cluster traffic"},
	{"concatenations", 4, 1, "set and map keys like ip daddr . meta l4proto . th dport, dnat to address . port"},
	{"set-timeouts", 4, 1, "session-affinity sets: dynamic, element timeouts, update from the packet path"},
	{"numgen", 4, 9, "numgen random: picking an endpoint"},
	{"fib", 4, 10, "fib saddr type local: short-circuit of local traffic for externalTrafficPolicy Local"},
	{"set-counters", 5, 7, "counters on set elements: per-service packet and byte metrics"},
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
