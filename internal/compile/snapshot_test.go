package compile

import (
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// The node port addresses come with the snapshot: they fill nodeport-ips and protect
// nftproxy's own ports, and a change of them alone compiles the service ports again.
func TestSnapshotNodePortAddrs(t *testing.T) {
	cfg := Config{Family: nft.IPv4, MasqueradeBit: 14, Policy: admit.Policy{ServedPorts: []uint16{10256}}}
	services := []model.ServicePort{{
		Name:       spn("web", "health", model.ProtoTCP),
		ClusterIPs: ips("10.96.0.1"), ExternalIPs: ips("192.0.2.20"), Port: 10256,
		Endpoints: eps(8080, "10.244.1.2"),
	}}
	snapAt := func(addr string) *model.Snapshot {
		return &model.Snapshot{Node: model.Node{Name: "node-1"}, Services: model.Ports(services), NodePortAddrs: ips(addr)}
	}
	cc := NewCompiler(cfg, NewSlots())
	for _, tc := range []struct {
		addr     string
		external bool // the externalIP is programmed
	}{
		{"192.0.2.20", false}, // the node's own address: port 10256 is nftproxy's
		{"192.0.2.30", true},
		{"192.0.2.20", false},
	} {
		snap := snapAt(tc.addr)
		rs, problems := cc.Compile(snap)
		flat := rs.Flatten()
		if got := elements(t, flat, SetNodePortIPs); len(got) != 1 || !hasKey(got, tc.addr) {
			t.Errorf("%s: nodeport-ips %v", tc.addr, got)
		}
		if got := hasKey(elements(t, flat, MapServiceIPs), "192.0.2.20 . 6 . 10256"); got != tc.external {
			t.Errorf("%s: externalIP programmed %v, want %v (problems %v)", tc.addr, got, tc.external, problems)
		}
		want, _ := Compile(snap, cfg, NewSlots())
		if !reflect.DeepEqual(flat, want) {
			t.Errorf("%s: the incremental result differs from a fresh compile", tc.addr)
		}
	}
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }
