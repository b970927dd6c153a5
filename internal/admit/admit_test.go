package admit

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// port is TCP port 80 of Service ns/name created at epoch+age, with a cluster IP and
// the given external IPs.
func port(ns, name string, age time.Duration, clusterIP string, external ...string) model.ServicePort {
	sp := model.ServicePort{
		Name:       model.ServicePortName{Namespace: ns, Name: name, Port: "http", Protocol: model.ProtoTCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)}, Port: 80, Created: epoch.Add(age),
		Endpoints: []model.Endpoint{{Addr: netip.MustParseAddr("10.244.1.1"), Port: 8080, Ready: true}},
	}
	for _, e := range external {
		sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(e))
	}
	return sp
}

func snapshot(sps ...model.ServicePort) *model.Snapshot {
	slices.SortFunc(sps, func(a, b model.ServicePort) int { return a.Name.Compare(b.Name) })
	return &model.Snapshot{Node: model.Node{Name: "node-1"}, Services: model.Ports(sps)}
}

// unit is the cost of every port: the budget counts ports.
func unit(*model.ServicePort) int { return 1 }

// decided is what d says of snap's ports, in words.
func decided(snap *model.Snapshot, d Decisions) string {
	out := ""
	for i, sp := range snap.Services {
		if !d.Programmed(i) {
			out += sp.Name.Name + ": aside; "
			continue
		}
		w := d.Claims(sp)
		out += fmt.Sprintf("%s: %v %v %d; ", sp.Name.Name, w.Internal, w.External, w.NodePort)
	}
	for _, p := range d.Problems {
		out += p.Namespace + "/" + p.Name + " " + p.Reason + "; "
	}
	return out
}

// The decisions are data: the older Service holds a contested external IP, one over
// the budget is set aside and reported, and the Admission that follows the changes
// decides what a fresh one decides.
func TestAdmit(t *testing.T) {
	a := New(nft.IPv4, Policy{Limits: Limits{MaxElements: 2}}, unit, nil)
	old := port("a", "old", 0, "10.96.0.1", "192.0.2.50")
	young := port("b", "young", time.Hour, "10.96.0.2", "192.0.2.50")
	snap := snapshot(old, young)
	d := a.Admit(snap)
	if !d.Renewed {
		t.Error("the first call is not Renewed")
	}
	got := decided(snap, d)
	want := `old: [10.96.0.1] [192.0.2.50] 0; young: [10.96.0.2] [] 0; b/young port "http": TCP 192.0.2.50:80 is in use by another Service, ignored; `
	if got != want {
		t.Errorf("two Services on one external IP:\n got %s\nwant %s", got, want)
	}
	if !d.ClusterIP(netip.MustParseAddr("10.96.0.2")) || d.ClusterIP(netip.MustParseAddr("192.0.2.50")) {
		t.Error("ClusterIP does not tell the cluster IPs")
	}

	// a third Service: over the budget of two, the newest in its namespace's share goes
	third := port("c", "third", 2*time.Hour, "10.96.0.3")
	snap = snapshot(old, young, third)
	d = a.Admit(snap)
	fresh := New(nft.IPv4, Policy{Limits: Limits{MaxElements: 2}}, unit, nil).Admit(snap)
	if got, want := decided(snap, d), decided(snap, fresh); got != want {
		t.Errorf("incremental decisions differ from a fresh Admission's:\n got %s\nwant %s", got, want)
	}
	if d.SetAside != 1 || d.Programmed(2) {
		t.Errorf("%d Services set aside, third programmed: %v; want the third alone set aside\n%s", d.SetAside, d.Programmed(2), decided(snap, d))
	}

	// without limits: the older Service goes, the younger one now holds the address,
	// and is affected (the claims follow the change, not made anew)
	b := New(nft.IPv4, Policy{}, unit, nil)
	both := snapshot(old, young)
	b.Admit(both)
	snap = &model.Snapshot{Node: both.Node, Services: both.Services[1:]} // the same young port
	d = b.Admit(snap)
	if w := d.Claims(snap.Services[0]); len(w.External) != 1 || d.Renewed || !d.Affected[snap.Services[0]] {
		t.Errorf("after the holder left: claims %+v, renewed %v, affected %v", w, d.Renewed, d.Affected)
	}
}
