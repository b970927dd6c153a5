package kernel_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// snapshotOf returns a snapshot of the given service ports, in name order.
func snapshotOf(cur map[string]model.ServicePort) *model.Snapshot {
	snap := &model.Snapshot{}
	for _, sp := range cur {
		snap.Services = append(snap.Services, &sp)
	}
	sort.Slice(snap.Services, func(i, j int) bool { return snap.Services[i].Name.Less(snap.Services[j].Name) })
	return snap
}

// withoutChanges returns a copy of rs without its change set: the applier compares
// every part.
func withoutChanges(rs *nft.Ruleset) *nft.Ruleset {
	c := *rs
	c.Changes = nft.PartChanges{}
	return &c
}

// TestChangeSetEqualsComparison drives two Appliers with the incremental compiler's
// rulesets through a random walk: one is given the rulesets with their change sets
// (nft.PartChanges), the other the same rulesets without (every part compared). After
// every step both kernels hold the same table, equal to a fresh apply.
func TestChangeSetEqualsComparison(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	withNS, withoutNS := testnetns.New(t), testnetns.New(t)
	with, without := kernel.New(kernel.WithNetNS(withNS.FD)), kernel.New(kernel.WithNetNS(withoutNS.FD))
	cc := compile.NewCompiler(cfg(), compile.NewSlots())
	cur := map[string]model.ServicePort{}
	derived := 0
	var prev *nft.Ruleset
	for step := range 30 {
		for range 1 + r.IntN(3) {
			name := fmt.Sprintf("s%d", r.IntN(10))
			if _, ok := cur[name]; ok && r.IntN(4) == 0 {
				delete(cur, name)
				continue
			}
			sp := svc(name, fmt.Sprintf("10.96.0.%d", 1+r.IntN(10)), uint16(30000+r.IntN(4)), r.IntN(6), r.IntN(5))
			if r.IntN(4) == 0 {
				sp.AffinityTimeout = uint32(10 + r.IntN(2))
			}
			cur[name] = sp
		}
		rs, _ := cc.Compile(snapshotOf(cur))
		if rs.DerivedFrom(prev) {
			derived++
		}
		prev = rs
		if _, err := with.Apply(rs); err != nil {
			t.Fatalf("step %d: with change set: %v", step, err)
		}
		if _, err := without.Apply(withoutChanges(rs)); err != nil {
			t.Fatalf("step %d: without change set: %v", step, err)
		}
		got, want := listTable(t, withNS), listTable(t, withoutNS)
		if got != want {
			t.Fatalf("step %d: table applied with the change set differs\n--- compared:\n%s\n--- with change set:\n%s", step, want, got)
		}
		if step%10 == 9 {
			fresh := testnetns.New(t)
			if _, err := kernel.New(kernel.WithNetNS(fresh.FD)).Apply(rs.Flatten()); err != nil {
				t.Fatalf("step %d fresh apply: %v", step, err)
			}
			if want := listTable(t, fresh); got != want {
				t.Fatalf("step %d: differs from a fresh apply\n--- fresh:\n%s\n--- with change set:\n%s", step, want, got)
			}
		}
	}
	if derived < 25 {
		t.Fatalf("only %d of 30 rulesets carried a change set from the previous one", derived)
	}
}

// TestChangeSetTrustedOnlySinceLastWritten: the applier wrote rs1; rs3's change set
// speaks for rs2 → rs3 only (rs2 was compiled, never applied), so it must be ignored:
// trusting it would miss service a's change in rs2. And the applier does trust a change
// set derived from what it wrote: a lying one (a part changed but not named) leaves the
// part as it was.
func TestChangeSetTrustedOnlySinceLastWritten(t *testing.T) {
	ns := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	cc := compile.NewCompiler(cfg(), compile.NewSlots())
	cur := map[string]model.ServicePort{
		"a": svc("a", "10.96.0.1", 30001, 0, 2),
		"b": svc("b", "10.96.0.2", 30002, 10, 2),
	}
	rs1, _ := cc.Compile(snapshotOf(cur))
	if _, err := applier.Apply(rs1); err != nil {
		t.Fatal(err)
	}
	cur["a"] = svc("a", "10.96.0.1", 30001, 0, 4)
	rs2, _ := cc.Compile(snapshotOf(cur))
	cur["b"] = svc("b", "10.96.0.2", 30002, 10, 3)
	rs3, _ := cc.Compile(snapshotOf(cur))
	if !rs3.DerivedFrom(rs2) || rs3.DerivedFrom(rs1) || len(rs3.Changes.Parts) != 1 {
		t.Fatalf("rs3's change set: derived from rs2 %v, from rs1 %v, %d parts; want rs2 only, 1 part",
			rs3.DerivedFrom(rs2), rs3.DerivedFrom(rs1), len(rs3.Changes.Parts))
	}
	if _, err := applier.Apply(rs3); err != nil {
		t.Fatal(err)
	}
	fresh := testnetns.New(t)
	if _, err := kernel.New(kernel.WithNetNS(fresh.FD)).Apply(rs3.Flatten()); err != nil {
		t.Fatal(err)
	}
	want := listTable(t, fresh)
	if got := listTable(t, ns); got != want {
		t.Fatalf("change set not since the last written ruleset was trusted\n--- want:\n%s\n--- got:\n%s", want, got)
	}

	// a change set derived from rs3 that does not name a changed part: trusted, the
	// kernel keeps the part as written from rs3
	lie := *rs3
	lie.Parts = slices.Clone(rs3.Parts)
	other, _ := compile.NewCompiler(cfg(), compile.NewSlots()).Compile(snapshotOf(map[string]model.ServicePort{
		"a": svc("a", "10.96.0.1", 30001, 0, 1),
	}))
	for i, p := range lie.Parts {
		if p.Owner == other.Parts[0].Owner {
			lie.Parts[i] = other.Parts[0]
		}
	}
	lie.Changes = nft.ChangesSince(rs3, lie.Parts, map[string]*nft.Part{})
	if !lie.DerivedFrom(rs3) {
		t.Fatal("the lying change set is not derived from rs3")
	}
	if _, err := applier.Apply(&lie); err != nil {
		t.Fatal(err)
	}
	if got := listTable(t, ns); got != want {
		t.Fatalf("the applier compared parts although the change set derived from what it wrote named none\n--- want (rs3):\n%s\n--- got:\n%s", want, got)
	}
}

// BenchmarkApplyChangeSet is the Applier's share of a one-endpoint change at 30,000
// services, with the compiler's change set (the named parts only) and without it (every
// part compared by identity). Only Apply is timed; kernel-µs is the kernel's part of it.
func BenchmarkApplyChangeSet(b *testing.B) {
	const n = 30000
	for _, trusted := range []bool{true, false} {
		b.Run(fmt.Sprintf("changeset=%v", trusted), func(b *testing.B) {
			ns := testnetns.New(b)
			a := kernel.New(kernel.WithNetNS(ns.FD))
			cc := compile.NewCompiler(cfg(), compile.NewSlots())
			snap := &model.Snapshot{Services: services(n, 10)}
			rs, _ := cc.Compile(snap)
			if _, err := a.Apply(rs); err != nil {
				b.Fatal(err)
			}
			var kernelTime time.Duration
			i := 0
			for b.Loop() {
				b.StopTimer()
				i++
				k := (n/2 + i*7919) % n
				target := new(*snap.Services[k]) // service ports are never modified: change a copy
				snap.Services[k] = target
				eps := slices.Clone(target.Endpoints)
				eps[0] = model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 250, byte(i / 256), byte(i)}), Port: 8080, Ready: true, Serving: true}
				target.Endpoints = eps
				rs, _ := cc.Compile(snap)
				if !trusted {
					rs = withoutChanges(rs)
				}
				b.StartTimer()
				st, err := a.Apply(rs)
				if err != nil {
					b.Fatal(err)
				}
				kernelTime += st.Kernel
			}
			b.ReportMetric(float64(kernelTime.Microseconds())/float64(i), "kernel-µs")
		})
	}
}
