package compile

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// nftRelease is the nft of one Debian release, in a minimal root built by
// e2e/hack/nft-roots.sh.
type nftRelease struct {
	suite, root string
	// parsesKeyMaps: the release reads numgen inside a concatenation ("ip daddr . meta
	// l4proto . th dport . numgen random mod 3 map @endpoints"), which nft before 1.0
	// refuses. Only then can it load the rendered text.
	parsesKeyMaps bool
}

// releases lists the nft versions the table must list with: Debian 11's 0.9.8, 12's
// 1.0.6 and 13's 1.1.3 (kind's node images).
var releases = []nftRelease{
	{suite: "bullseye"},
	{suite: "bookworm", parsesKeyMaps: true},
	{suite: "trixie", parsesKeyMaps: true},
}

// unparsableKeyMaps is how nft 0.9.8 refuses a numgen index in a concatenation.
const unparsableKeyMaps = "can not use variable sized data types (integer) in concat expressions"

// TestNftVersions programs every golden scenario (both families) through the applier,
// as nftproxy does, into a throwaway namespace, and lists it with the nft of each
// Debian release: the listing must succeed (no assertion, no error) and show every set
// and chain, in text and in JSON. Where that nft reads the syntax it must also accept
// the rendered text (nft -c -f), list the table it loads from that text as it lists
// ours, and accept its own listing of ours back. nft 0.9.8, which cannot read numgen in
// a concatenation, must refuse the text for that reason.
func TestNftVersions(t *testing.T) {
	empty := testnetns.New(t) // skips without root and nft, unless kernel tests are required
	rels := nftReleases(t)
	type scenario struct {
		snap *model.Snapshot
		cfg  func(nft.Family) Config
	}
	all := map[string]scenario{"many-services": {manyServices(), configFor}}
	for name, snap := range scenarios() {
		all[name] = scenario{snap, configFor}
	}
	for name, sc := range localModeScenarios() {
		all[name] = scenario{sc.snap, sc.config}
	}
	// nftproxy's own options: hashing for every port, no masquerade to a range, SNAT to
	// the node's address
	all["all-kinds-with-options"] = scenario{scenarios()["all-kinds"], func(fam nft.Family) Config {
		cfg := configFor(fam)
		cfg.DefaultBalancing, cfg.MasqueradeToNodeIP = model.BalancingMaglev, true
		cfg.NoMasquerade = []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24"), netip.MustParsePrefix("fd00:244:5::/64")}
		return cfg
	}}
	// A table loaded from the text by nft (or written by an older nftproxy) types the
	// maps' index "integer", which nft 0.9.8 cannot list; nftproxy's first sync after
	// it starts rewrites the maps.
	t.Run("takes-over-nft-written-table", func(t *testing.T) {
		var loader, old nftRelease
		for _, r := range rels {
			if r.parsesKeyMaps && loader.root == "" {
				loader = r
			}
			if !r.parsesKeyMaps && old.root == "" {
				old = r
			}
		}
		rs, _ := Compile(scenarios()["clusterip-2ep"], configFor(nft.IPv4), NewSlots())
		ns := testnetns.New(t)
		if out, err := loader.nft(t, ns, nft.Render(rs), "-f", "-"); err != nil {
			t.Fatalf("nft -f with the nft of %s: %v\n%s", loader.suite, err, out)
		}
		if out, err := old.nft(t, ns, "", "list", "ruleset"); err == nil && !strings.Contains(out, "Assertion") {
			t.Logf("nft of %s lists the table nft wrote (expected it to abort):\n%s", old.suite, lastLines(out, 5))
		}
		if _, err := kernel.New(kernel.WithNetNS(ns.FD)).Apply(rs); err != nil {
			t.Fatalf("netlink apply: %v", err)
		}
		checkListing(t, old, old.list(t, ns), rs)
	})
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			sc := all[name]
			var rulesets []*nft.Ruleset
			var text strings.Builder
			for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
				rs, _ := Compile(sc.snap, sc.cfg(fam), NewSlots())
				rulesets = append(rulesets, rs)
				text.WriteString(nft.Render(rs))
			}
			viaNetlink := testnetns.New(t)
			if _, err := kernel.New(kernel.WithNetNS(viaNetlink.FD)).Apply(rulesets...); err != nil {
				t.Fatalf("netlink apply: %v", err)
			}
			for _, rel := range rels {
				t.Run(rel.suite, func(t *testing.T) {
					ours := rel.list(t, viaNetlink)
					// what tools read (firewalld, knftables): the same decoding, in JSON
					if out, err := rel.nft(t, viaNetlink, "", "--json", "list", "ruleset"); err != nil || !json.Valid([]byte(out)) {
						t.Errorf("nft --json list ruleset with the nft of %s: exit %v\n%s", rel.suite, err, lastLines(out, 20))
					}
					for _, rs := range rulesets {
						checkListing(t, rel, ours, rs)
					}
					if !rel.parsesKeyMaps {
						out, err := rel.nft(t, empty, text.String(), "-c", "-f", "-")
						if err == nil || !strings.Contains(out, unparsableKeyMaps) {
							t.Errorf("nft of %s: the rendered text was expected to fail with %q (exit %v):\n%s", rel.suite, unparsableKeyMaps, err, firstLines(out, 5))
						}
						return
					}
					if out, err := rel.nft(t, empty, text.String(), "-c", "-f", "-"); err != nil {
						t.Fatalf("nft -c -f of the rendered text: %v\n%s", err, firstLines(out, 20))
					}
					if out, err := rel.nft(t, empty, ours, "-c", "-f", "-"); err != nil {
						t.Errorf("nft -c -f of its own listing of the netlink-written table: %v\n%s", err, firstLines(out, 20))
					}
					viaText := testnetns.New(t)
					if out, err := rel.nft(t, viaText, text.String(), "-f", "-"); err != nil {
						t.Fatalf("nft -f of the rendered text: %v\n%s", err, firstLines(out, 20))
					}
					// the Applier gives large sets a capacity (nft/kernel capacity.go), the
					// text none
					if theirs, ours := withoutSize(rel.list(t, viaText)), withoutSize(ours); theirs != ours {
						t.Errorf("nft of %s lists the netlink-written table differently from the one it loaded from the text:\n%s", rel.suite, lineDiff(theirs, ours))
					}
				})
			}
		})
	}
}

// list runs "nft list ruleset" in ns; it must exit 0 and print no error or assertion.
func (r nftRelease) list(t *testing.T, ns *testnetns.NS) string {
	t.Helper()
	out, err := r.nft(t, ns, "", "list", "ruleset")
	if err != nil || strings.Contains(out, "Assertion") || strings.Contains(out, "Error:") || strings.Contains(out, "BUG") {
		t.Fatalf("nft list ruleset with the nft of %s: exit %v\n%s", r.suite, err, lastLines(out, 20))
	}
	return out
}

// nft runs the release's nft inside ns. "-f -" reads /dev/stdin, so the root gets /dev
// and /proc, mounted in a mount namespace of the command's own.
func (r nftRelease) nft(t *testing.T, ns *testnetns.NS, stdin string, args ...string) (string, error) {
	t.Helper()
	const script = `mount --bind /dev "$0/dev" && mount -t proc proc "$0/proc" && exec chroot "$0" nft "$@"`
	return ns.Run(t, stdin, append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, r.root}, args...)...)
}

// checkListing: every set and chain of rs is in the listing of its table, and every
// element of the endpoint maps (one line each in nft's listing).
func checkListing(t *testing.T, rel nftRelease, listing string, rs *nft.Ruleset) {
	t.Helper()
	start := strings.Index(listing, fmt.Sprintf("table %s %s {\n", rs.Family, rs.Table))
	if start < 0 {
		t.Errorf("nft of %s does not list table %s %s", rel.suite, rs.Family, rs.Table)
		return
	}
	table := listing[start:]
	if end := strings.Index(table, "\n}\n"); end >= 0 {
		table = table[:end]
	}
	for _, s := range rs.Flatten().Sets {
		kind := "set"
		if s.IsMap() {
			kind = "map"
		}
		at := strings.Index(table, fmt.Sprintf("\t%s %s {\n", kind, s.Name))
		if at < 0 {
			t.Errorf("nft of %s: %s %s %s not listed", rel.suite, rs.Family, kind, s.Name)
			continue
		}
		body := table[at:]
		if end := strings.Index(body, "\n\t}\n"); end >= 0 {
			body = body[:end]
		}
		if nft.IsKeyNumgenMap(s) {
			n := 0
			if _, elems, ok := strings.Cut(body, "elements = {"); ok {
				n = strings.Count(elems, " : ")
			}
			if n != len(s.Elements) {
				t.Errorf("nft of %s: %s map %s lists %d elements, it has %d", rel.suite, rs.Family, s.Name, n, len(s.Elements))
			}
		}
	}
	for _, c := range rs.Chains {
		if !strings.Contains(table, fmt.Sprintf("\tchain %s {\n", c.Name)) {
			t.Errorf("nft of %s: %s chain %s not listed", rel.suite, rs.Family, c.Name)
		}
	}
}

// manyServices has 60 services with 1 to 20 endpoints each, half of them with node
// ports: enough elements that nft sorts long lists of every key map.
func manyServices() *model.Snapshot {
	var sps []model.ServicePort
	for i := range 60 {
		var eps []model.Endpoint
		for j := range i%20 + 1 {
			eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", i, j+1), 8080), ep(fmt.Sprintf("fd00:244:%x::%x", i, j+1), 8080))
		}
		sp := model.ServicePort{
			Name:       model.ServicePortName{Namespace: "bulk", Name: fmt.Sprintf("svc-%02d", i), Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip(fmt.Sprintf("10.96.1.%d", i+1)), ip(fmt.Sprintf("fd00:96::1:%x", i+1))}, Port: 80,
			Endpoints: eps,
		}
		if i%2 == 0 {
			sp.NodePort = uint16(30000 + i)
		}
		sps = append(sps, sp)
	}
	return &model.Snapshot{Node: model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10"), ip("2001:db8::10")}}, Services: model.Ports(sps)}
}

// nftReleases builds (on first use, minutes) or finds the cached roots with
// e2e/hack/nft-roots.sh. Without debootstrap the test is skipped, or failed when
// kernel tests are required.
func nftReleases(t *testing.T) []nftRelease {
	t.Helper()
	if _, err := exec.LookPath("debootstrap"); err != nil {
		if testnetns.Required() {
			t.Fatal("the nft versions test needs debootstrap (make deps installs it)")
		}
		t.Skip("needs debootstrap (set NFTPROXY_KERNEL_TESTS=1 to require it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-time.Minute))
	}
	defer cancel()
	script, err := filepath.Abs(filepath.Join("..", "..", "e2e", "hack", "nft-roots.sh"))
	if err != nil {
		t.Fatal(err)
	}
	suites := make([]string, len(releases))
	for i, r := range releases {
		suites[i] = r.suite
	}
	cmd := exec.CommandContext(ctx, script, suites...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("built the nft roots in %v:\n%s", time.Since(start).Round(time.Second), stderr.String())
	}
	roots := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if suite, root, ok := strings.Cut(sc.Text(), " "); ok {
			roots[suite] = root
		}
	}
	out2 := make([]nftRelease, len(releases))
	for i, r := range releases {
		r.root = roots[r.suite]
		if _, err := os.Stat(filepath.Join(r.root, "usr", "sbin", "nft")); r.root == "" || err != nil {
			t.Fatalf("%s printed no usable root for %s:\n%s", script, r.suite, out)
		}
		out2[i] = r
	}
	return out2
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// withoutSize drops the "size N" lines of a listing.
func withoutSize(listing string) string {
	lines := strings.Split(listing, "\n")
	out := lines[:0]
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "size" {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
