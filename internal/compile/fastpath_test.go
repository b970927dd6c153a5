package compile

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
)

// TestFastPath: with devices the table has the flowtable on them and one forward rule
// after the filter priority that offloads established flows DNATed to a cluster IP;
// without, neither. Changing the devices keeps every compiled part.
func TestFastPath(t *testing.T) {
	snap := scenarios()["clusterip-2ep"]
	cc := NewCompiler(testConfig(), NewSlots())
	rs, _ := cc.Compile(snap)
	if len(rs.Flowtables) != 0 || chainNamed(rs, ChainFilterForwardFastPath) != nil {
		t.Fatalf("without devices: flowtables %v, fast path chain %v", rs.Flowtables, chainNamed(rs, ChainFilterForwardFastPath))
	}
	cc.SetFastPath(FastPath{Devices: []string{"veth2", "eth0", "veth2"}})
	rs2, _ := cc.Compile(snap)
	if want := []*nft.Flowtable{{Name: FlowtableFastPath, Devices: []string{"eth0", "veth2"}}}; !reflect.DeepEqual(rs2.Flowtables, want) {
		t.Errorf("flowtables %+v, want %+v", rs2.Flowtables, want)
	}
	ch := chainNamed(rs2, ChainFilterForwardFastPath)
	if ch == nil || ch.Hook == nil || ch.Hook.Hook != nft.Forward || ch.Hook.Priority <= 0 || len(ch.Rules) != 1 {
		t.Fatalf("fast path chain %+v", ch)
	}
	if got, want := nft.RenderRule(nft.IPv4, ch.Rules[0]), "ct state established ct status dnat ct original ip daddr @cluster-ips flow add @fastpath"; got != want {
		t.Errorf("rule %q, want %q", got, want)
	}
	if p := purpose.Of(ch.Rules[0].Tag); p != purpose.FastPath {
		t.Errorf("rule purpose %v", p)
	}
	for i := range rs.Parts {
		if rs.Parts[i] != rs2.Parts[i] {
			t.Errorf("part %s compiled again for a change of devices", rs.Parts[i].Owner)
		}
	}
	if r := nft.Render(rs2); !strings.Contains(r, "flowtable fastpath {") {
		t.Errorf("rendering lacks the flowtable:\n%s", r)
	}
	cc.SetFastPath(FastPath{})
	if rs3, _ := cc.Compile(snap); len(rs3.Flowtables) != 0 || chainNamed(rs3, ChainFilterForwardFastPath) != nil {
		t.Errorf("devices gone: the fast path stays")
	}
}
