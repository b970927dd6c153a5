package pipeline

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/nft"
)

// TestFastPathFollowsInterfaces: --fast-path-interfaces is matched against the
// interfaces listed at each compile; the flowtable's devices follow them while the
// compilers (and their parts) stay.
func TestFastPathFollowsInterfaces(t *testing.T) {
	ifs := []string{"lo", "eth0", "veth1", "cni0"}
	cfg := Config{Compile: compile.Config{MasqueradeBit: 14}, FastPathInterfaces: []string{"eth0", "veth*"},
		Interfaces: func() ([]string, error) { return ifs, nil }}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	pl := New()
	devices := func() []string {
		t.Helper()
		_, rss, _, err := pl.Full(cfg, nil, nil, node)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, rs := range rss {
			for _, ft := range rs.Flowtables {
				out = append(out, rs.Family.String()+":"+strings.Join(ft.Devices, ","))
			}
		}
		return out
	}
	if got, want := devices(), []string{"ip:eth0,veth1", "ip6:eth0,veth1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices %v, want %v", got, want)
	}
	first := pl.compilers[nft.IPv4].c
	ifs = append(ifs, "veth2")
	if got, want := devices(), []string{"ip:eth0,veth1,veth2", "ip6:eth0,veth1,veth2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after veth2 appeared: devices %v, want %v", got, want)
	}
	if pl.compilers[nft.IPv4].c != first {
		t.Errorf("a new interface made a new compiler")
	}
	ifs = []string{"lo", "cni0"}
	if got := devices(); len(got) != 0 {
		t.Errorf("no matching interface: flowtables %v", got)
	}
	cfg.FastPathInterfaces = nil
	if fp, _ := fastPathDevices(cfg); !reflect.DeepEqual(fp, compile.FastPath{}) {
		t.Errorf("off: %+v", fp)
	}
}
