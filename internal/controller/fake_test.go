package controller

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/nft"
	nftfake "github.com/nftproxy/nftproxy/nft/fake"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/monitor"
)

// The controller against nft/fake: an in-memory nf_tables with the kernel's commit
// semantics (atomic transactions, dangling references refused), so sync, isolation of
// refused service ports and repair run without root and check what the "kernel" holds.

// recordingFake is a fake nf_tables that remembers the last rulesets it accepted.
type recordingFake struct {
	*nftfake.Applier
	mu   sync.Mutex
	last []*nft.Ruleset
}

func (r *recordingFake) Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error) {
	st, err := r.Applier.Apply(rulesets...)
	if err == nil {
		r.mu.Lock()
		r.last = rulesets
		r.mu.Unlock()
	}
	return st, err
}

// table is what the fake holds in nftproxy's IPv4 table, in nft syntax.
func (r *recordingFake) table() string { return r.Render(nft.IPv4, compile.TableName) }

// danglingGoto adds, to every part carrying endpoint 10.244.9.9, a chain that goes to
// a chain that does not exist: the compiler never writes that, and the kernel (and so
// the fake) refuses it.
type danglingGoto struct{ Dataplane }

func (d danglingGoto) Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error) {
	return d.Dataplane.Apply(poisoned(rulesets)...)
}

// TestFakeSync: the first sync and later changes reach the fake, whose table after the
// incremental syncs is the one a fresh write of the last ruleset gives.
func TestFakeSync(t *testing.T) {
	f := &recordingFake{Applier: nftfake.New()}
	client, _ := startProxyWith(t, f, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	waitFor(t, "first sync in the fake", func() bool { return strings.Contains(f.table(), "10.244.1.2 . 8080") })
	ctx := context.Background()
	if _, err := client.CoreV1().Services("default").Create(ctx, service("b", "10.96.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("b", "b-1", "10.244.1.7", "10.244.1.8"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("a", "a-1", "10.244.1.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b and a's new endpoint in the fake", func() bool {
		out := f.table()
		return strings.Contains(out, "10.244.1.8 . 8080") && strings.Contains(out, "10.244.1.3 . 8080") && !strings.Contains(out, "10.244.1.2 . 8080")
	})
	if applies, refusals, _ := f.Counts(); refusals != 0 || applies < 2 {
		t.Fatalf("%d applies, %d refused; want several, none refused", applies, refusals)
	}
	f.mu.Lock()
	last := f.last
	f.mu.Unlock()
	fresh := nftfake.New()
	if _, err := fresh.Apply(last...); err != nil {
		t.Fatal(err)
	}
	if got, want := f.table(), fresh.Render(nft.IPv4, compile.TableName); got != want {
		t.Errorf("after incremental syncs:\n%s\na fresh write of the same ruleset:\n%s", got, want)
	}
	// b's frontend, as the fake holds it, leads to its two endpoints
	if got := fate(f.Ruleset(nft.IPv4, compile.TableName), "10.244.0.5", "10.96.0.2:80"); got != "10.244.1.7:8080 50%, 10.244.1.8:8080 50%" {
		t.Errorf("b's frontend leads to %s, want its two endpoints:\n%s", got, f.table())
	}
}

// TestFakeRefusalIsIsolated: the fake refuses a service port's rules (a goto to a
// missing chain, as the kernel does); the controller finds it, keeps its last accepted
// rules, and programs every other change.
func TestFakeRefusalIsIsolated(t *testing.T) {
	f := &recordingFake{Applier: nftfake.New()}
	client, _ := startProxyWith(t, danglingGoto{f},
		service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"),
		service("bad", "10.96.0.3"), slice("bad", "bad-1", "10.244.1.4"))
	waitFor(t, "first sync in the fake", func() bool { return strings.Contains(f.table(), "10.244.1.4 . 8080") })
	ctx := context.Background()
	for _, s := range []struct{ svc, name, addr string }{{"bad", "bad-1", "10.244.9.9"}, {"a", "a-1", "10.244.1.5"}} {
		if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice(s.svc, s.name, s.addr), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a's change despite bad's refused rules", func() bool { return strings.Contains(f.table(), "10.244.1.5 . 8080") })
	out := f.table()
	if strings.Contains(out, "10.244.9.9") || strings.Contains(out, "poison-") || !strings.Contains(out, "10.244.1.4 . 8080") {
		t.Fatalf("want bad's previous endpoint kept and the refused rules absent:\n%s", out)
	}
	if _, refusals, _ := f.Counts(); refusals == 0 {
		t.Fatal("the fake refused nothing: the test did not exercise isolation")
	}
	waitFor(t, "a warning event on the refused service", func() bool {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "bad" && e.Reason == "NftproxyRefused" {
				return true
			}
		}
		return false
	})
	// bad is fixed: programmed
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("bad", "bad-1", "10.244.1.6"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fixed bad programmed", func() bool {
		out := f.table()
		return strings.Contains(out, "10.244.1.6 . 8080") && !strings.Contains(out, "10.244.1.4 . 8080")
	})
}

// TestFakeRepair: another process changes the table in the fake (deletes a service's
// dispatch element and adds a chain); the monitor's report makes the controller
// rewrite the table, which is then as before.
func TestFakeRepair(t *testing.T) {
	f := &recordingFake{Applier: nftfake.New()}
	_, p := startProxyWith(t, f, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	waitFor(t, "first sync in the fake", func() bool { return strings.Contains(f.table(), "10.244.1.2 . 8080") })
	before := f.table()
	err := f.Foreign(nft.IPv4, compile.TableName, func(rs *nft.Ruleset) {
		for _, s := range rs.Sets {
			if s.Name == "service-ips" || s.Name == "cluster-frontends" { // a's dispatch, chained or flat
				s.Elements = nil
			}
		}
		rs.Chains = append(rs.Chains, &nft.Chain{Name: "intruder"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if tampered := f.table(); tampered == before || !strings.Contains(tampered, "chain intruder") {
		t.Fatalf("the foreign change did not land:\n%s", tampered)
	}
	if got := fate(f.Ruleset(nft.IPv4, compile.TableName), "10.244.0.5", "10.96.0.1:80"); got == "10.244.1.2:8080 100%" {
		t.Fatalf("a's frontend still leads to its endpoint after its dispatch element was deleted:\n%s", f.table())
	}
	_, _, resyncs := f.Counts()
	r := NewRepairer(p, RepairBackoff{Initial: time.Millisecond})
	r.Changed(monitor.Change{Reason: "table ip nftproxy: element deleted from set service-ips, by pid 1 (nft)"})
	waitFor(t, "the table repaired", func() bool { return f.table() == before })
	if got := fate(f.Ruleset(nft.IPv4, compile.TableName), "10.244.0.5", "10.96.0.1:80"); got != "10.244.1.2:8080 100%" {
		t.Errorf("after the repair a's frontend leads to %s", got)
	}
	if _, _, n := f.Counts(); n <= resyncs {
		t.Errorf("repaired without a Resync (%d, before %d): the rewrite must not trust the applier's memory", n, resyncs)
	}
}
