package compile

import (
	"sort"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestKernelDifferential is the guarantee that what we write over netlink is what nft
// shows: each golden scenario is loaded from the renderer's text with "nft -f" in one
// namespace and applied through netlink in another, and "nft list ruleset" of both must
// be identical.
func TestKernelDifferential(t *testing.T) {
	names := make([]string, 0)
	for name := range scenarios() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(name+"/"+fam.String(), func(t *testing.T) { differential(t, scenarios()[name], configFor(fam)) })
		}
	}
	// the --detect-local-mode goldens: source ranges and iifname matches
	for name, sc := range localModeScenarios() {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(name+"/"+fam.String(), func(t *testing.T) { differential(t, sc.snap, sc.config(fam)) })
		}
	}
}

func differential(t *testing.T, snap *model.Snapshot, cfg Config) {
	rs, _ := Compile(snap, cfg, NewSlots())
	text, viaNetlink := testnetns.New(t), testnetns.New(t)
	text.MustRun(t, nft.Render(rs), "nft", "-f", "-")
	if _, err := kernel.New(kernel.WithNetNS(viaNetlink.FD)).Apply(rs); err != nil {
		t.Fatalf("netlink apply: %v", err)
	}
	want := text.MustRun(t, "", "nft", "list", "ruleset")
	got := viaNetlink.MustRun(t, "", "nft", "list", "ruleset")
	if got != want {
		t.Errorf("nft list differs\n--- nft -f of rendered text:\n%s\n--- netlink:\n%s", want, got)
	}
}
