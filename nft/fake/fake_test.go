package fake_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/fake"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// base is a small valid table: a chain jumping to another, a verdict map going to it,
// a plain set and an address map.
func base() *nft.Ruleset {
	return &nft.Ruleset{Family: nft.IPv4, Table: "t",
		Sets: []*nft.Set{
			{Name: "vm", Key: []nft.Datatype{nft.TypeIPv4Addr}, Data: []nft.Datatype{nft.TypeVerdict},
				Elements: []nft.Element{{Key: []nft.Value{nft.Addr(netip.MustParseAddr("10.0.0.1"))}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "target"}}}},
			{Name: "s", Key: []nft.Datatype{nft.TypeIPv4Addr},
				Elements: []nft.Element{{Key: []nft.Value{nft.Addr(netip.MustParseAddr("10.0.0.2"))}}}},
		},
		Chains: []*nft.Chain{
			{Name: "target", Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Counter{}}}}},
			{Name: "entry", Rules: []nft.Rule{
				{Stmts: []nft.Stmt{nft.VMap{Fields: []nft.Field{nft.FieldDaddr}, Map: "vm"}}},
				{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: "s"}, nft.Verdict{Kind: nft.Jump, Chain: "target"}}},
			}},
		},
	}
}

func clone(rs *nft.Ruleset) *nft.Ruleset {
	out := *rs
	out.Sets, out.Chains = nil, nil
	for _, s := range rs.Sets {
		c := *s
		c.Elements = slices.Clone(s.Elements)
		out.Sets = append(out.Sets, &c)
	}
	for _, c := range rs.Chains {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		out.Chains = append(out.Chains, &cc)
	}
	return &out
}

func chain(rs *nft.Ruleset, name string) *nft.Chain {
	for _, c := range rs.Chains {
		if c.Name == name {
			return c
		}
	}
	panic(name)
}

func set(rs *nft.Ruleset, name string) *nft.Set {
	for _, s := range rs.Sets {
		if s.Name == name {
			return s
		}
	}
	panic(name)
}

// refusals are transactions the kernel refuses on top of base, and the errno it gives.
var refusals = []struct {
	name  string
	edit  func(rs *nft.Ruleset)
	errno syscall.Errno
	// encoder: the real Applier refuses it itself, before the kernel sees it
	encoder bool
}{
	{"jump to a missing chain", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "missing"}}})
	}, syscall.ENOENT, false},
	{"goto a missing chain from a verdict map", func(rs *nft.Ruleset) {
		s := set(rs, "vm")
		s.Elements = append(s.Elements, nft.Element{Key: []nft.Value{nft.Addr(netip.MustParseAddr("10.0.0.9"))}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "missing"}})
	}, syscall.ENOENT, false},
	{"lookup of a missing set", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: "missing"}}})
	}, syscall.ENOENT, false},
	{"vmap of a set without verdicts", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.VMap{Fields: []nft.Field{nft.FieldSaddr}, Map: "s"}}})
	}, syscall.EINVAL, false},
	{"dnat through a missing key map", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{keyMapDNAT("missing")}})
	}, syscall.ENOENT, false},
	{"dnat through a key map that is a set", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{keyMapDNAT("s")}})
	}, syscall.EINVAL, false},
	{"dnat through a verdict map", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{keyMapDNAT("vm")}})
	}, syscall.EINVAL, false},
	{"element of the wrong family", func(rs *nft.Ruleset) {
		s := set(rs, "s")
		s.Elements = append(s.Elements, nft.Element{Key: []nft.Value{nft.Addr(netip.MustParseAddr("fd00::1"))}})
	}, syscall.EINVAL, true},
	{"jump loop from a base chain", func(rs *nft.Ruleset) {
		c := chain(rs, "target")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "entry"}}})
		rs.Chains = append(rs.Chains, &nft.Chain{Name: "hooked", Hook: &nft.Hook{Type: nft.TypeFilter, Hook: nft.Input},
			Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "entry"}}}}})
	}, syscall.EMLINK, false},
	{"flow add to a missing flowtable", func(rs *nft.Ruleset) {
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.FlowOffload{Flowtable: "missing"}}})
	}, syscall.ENOENT, false},
	{"name too long", func(rs *nft.Ruleset) {
		rs.Chains = append(rs.Chains, &nft.Chain{Name: strings.Repeat("c", 256)})
	}, syscall.ERANGE, false},
}

// acceptances are transactions on top of base that look wrong but the kernel accepts.
var acceptances = []struct {
	name string
	edit func(rs *nft.Ruleset)
}{
	{"jump loop no base chain reaches", func(rs *nft.Ruleset) {
		c := chain(rs, "target")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "entry"}}})
	}},
	{"dnat through key maps", func(rs *nft.Ruleset) {
		a := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
		rs.Sets = append(rs.Sets,
			&nft.Set{Name: "endpoints", Key: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
				Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}, Elements: []nft.Element{
					{Key: []nft.Value{a("10.96.0.10"), nft.Num(6), nft.Num(80), nft.Num(0)}, Data: []nft.Value{a("10.244.1.5"), nft.Num(8080)}}}},
			&nft.Set{Name: "nodeport-endpoints", Key: []nft.Datatype{nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
				Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}, Elements: []nft.Element{
					{Key: []nft.Value{nft.Num(6), nft.Num(30080), nft.Num(0)}, Data: []nft.Value{a("10.244.1.5"), nft.Num(8080)}}}})
		c := chain(rs, "entry")
		c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{keyMapDNAT("endpoints")}},
			nft.Rule{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"}}})
	}},
	{"an element added twice", func(rs *nft.Ruleset) {
		s := set(rs, "s")
		s.Elements = append(s.Elements, s.Elements[0])
	}},
}

// keyMapDNAT is "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @m".
func keyMapDNAT(m string) nft.Stmt {
	return nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: m}
}

// TestFakeAccepts: what the kernel accepts, the fake accepts.
func TestFakeAccepts(t *testing.T) {
	for _, tc := range acceptances {
		f := fake.New()
		rs := clone(base())
		tc.edit(rs)
		if _, err := f.Apply(rs); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestFakeRefuses: each refusal is a *kernel.RejectedError with the kernel's errno, and
// the table stays as it was.
func TestFakeRefuses(t *testing.T) {
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			f := fake.New()
			if _, err := f.Apply(base()); err != nil {
				t.Fatal(err)
			}
			before := f.Render(nft.IPv4, "t")
			bad := clone(base())
			tc.edit(bad)
			_, err := f.Apply(bad)
			var rejected *kernel.RejectedError
			switch {
			case tc.encoder && (err == nil || errors.As(err, &rejected)):
				t.Fatalf("Apply: %v, want the Applier's encoder to refuse it", err)
			case !tc.encoder && (!errors.As(err, &rejected) || !errors.Is(err, tc.errno)):
				t.Fatalf("Apply: %v, want a RejectedError with %v", err, tc.errno)
			}
			if got := f.Render(nft.IPv4, "t"); got != before {
				t.Errorf("refused transaction changed the table:\n%s\nwas:\n%s", got, before)
			}
		})
	}
}

// TestFakeIsAtomic: a transaction of two tables, one refused, changes neither.
func TestFakeIsAtomic(t *testing.T) {
	f := fake.New()
	good := base()
	six := &nft.Ruleset{Family: nft.IPv6, Table: "t", Chains: []*nft.Chain{{Name: "x"}}}
	bad := &nft.Ruleset{Family: nft.IPv6, Table: "t", Chains: []*nft.Chain{{Name: "x", Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "nowhere"}}}}}}}
	if _, err := f.Apply(good, six); err != nil {
		t.Fatal(err)
	}
	changed := clone(good)
	chain(changed, "target").Rules = nil
	if _, err := f.Apply(changed, bad); err == nil {
		t.Fatal("a transaction with a dangling goto was accepted")
	}
	if got := f.Ruleset(nft.IPv4, "t"); len(chain(got, "target").Rules) != 1 {
		t.Error("the refused transaction's IPv4 change was committed")
	}
	if got := f.Ruleset(nft.IPv6, "t"); len(got.Chains) != 1 || len(got.Chains[0].Rules) != 0 {
		t.Errorf("the IPv6 table changed: %+v", got.Chains)
	}
	if applies, refusals, _ := f.Counts(); applies != 2 || refusals != 1 {
		t.Errorf("counts %d applies, %d refusals; want 2, 1", applies, refusals)
	}
}

// TestFakeDeltaMeetsForeignChange: the fake, like the Applier, sends only what changed
// since its last write; an element another process deleted makes the delta that deletes
// it again fail (ENOENT), and after Resync the rewrite succeeds.
func TestFakeDeltaMeetsForeignChange(t *testing.T) {
	f := fake.New()
	rs := base()
	if _, err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if err := f.Foreign(nft.IPv4, "t", func(rs *nft.Ruleset) { set(rs, "s").Elements = nil }); err != nil {
		t.Fatal(err)
	}
	if err := f.Foreign(nft.IPv4, "t", func(rs *nft.Ruleset) {
		chain(rs, "entry").Rules = []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "gone"}}}}
	}); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("another process's dangling goto: %v, want ENOENT", err)
	}
	next := clone(rs)
	set(next, "s").Elements = nil
	if _, err := f.Apply(next); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("deleting an element that is gone: %v, want ENOENT", err)
	}
	f.Resync()
	st, err := f.Apply(next)
	if err != nil || !st.Full {
		t.Fatalf("rewrite after Resync: %+v, %v", st, err)
	}
	if st, err := f.Apply(next); err != nil || st.Full || st.Elements != 0 || st.Chains != 0 {
		t.Fatalf("unchanged sync: %+v, %v; want an empty delta", st, err)
	}
}

// nextWithoutS is base without set s and the rule that looks it up.
func nextWithoutS() *nft.Ruleset {
	next := clone(base())
	next.Sets = next.Sets[:1] // vm only
	c := chain(next, "entry")
	c.Rules = c.Rules[:1]
	return next
}

// TestFakeForeignReferenceBlocksDelete: another process's rule looks up our set; the
// delta that deletes the set fails with EBUSY, as in the kernel.
func TestFakeForeignReferenceBlocksDelete(t *testing.T) {
	f := fake.New()
	if _, err := f.Apply(base()); err != nil {
		t.Fatal(err)
	}
	if err := f.Foreign(nft.IPv4, "t", func(rs *nft.Ruleset) {
		rs.Chains = append(rs.Chains, &nft.Chain{Name: "intruder", Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: "s"}}}}})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(nextWithoutS()); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("deleting a set another process's rule uses: %v, want EBUSY", err)
	}
	f.Resync() // a rewrite flushes and deletes every chain, the intruder's too
	if _, err := f.Apply(nextWithoutS()); err != nil {
		t.Fatal(err)
	}
}

// TestFakeIncrementalEqualsFresh drives one fake with the incremental compiler's
// rulesets through service changes: after each step it holds what a fresh fake holds
// after one apply of the same ruleset.
func TestFakeIncrementalEqualsFresh(t *testing.T) {
	f := fake.New()
	cc := compile.NewCompiler(testrules.Config(), compile.NewSlots())
	cur := map[string]model.ServicePort{}
	for step := range 30 {
		name := fmt.Sprintf("s%d", step%7)
		if step%5 == 4 {
			delete(cur, name)
		} else {
			cur[name] = testrules.Service(name, fmt.Sprintf("10.96.0.%d", 1+step%7), uint16(30000+step%7), step, 1+step%4)
		}
		snap := &model.Snapshot{}
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range cur {
				if !yield(k) {
					return
				}
			}
		}) {
			sp := cur[k]
			snap.Services = append(snap.Services, &sp)
		}
		rs, err := cc.Compile(snap)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Apply(rs); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		fresh := fake.New()
		if _, err := fresh.Apply(rs); err != nil {
			t.Fatal(err)
		}
		if got, want := f.Render(nft.IPv4, rs.Table), fresh.Render(nft.IPv4, rs.Table); got != want {
			t.Fatalf("step %d: incremental:\n%s\nfresh:\n%s", step, got, want)
		}
	}
}

// TestFakeAgreesWithKernel applies base and each refusal to the kernel, in a throwaway
// network namespace, through the real Applier: the kernel refuses exactly what the fake
// refuses, with the same errno, and accepts base.
func TestFakeAgreesWithKernel(t *testing.T) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	if _, err := a.Apply(base()); err != nil {
		t.Fatalf("the kernel refused base: %v", err)
	}
	for _, tc := range acceptances {
		rs := clone(base())
		tc.edit(rs)
		a.Resync()
		if _, err := a.Apply(rs); err != nil {
			t.Errorf("%s: the kernel refused it: %v", tc.name, err)
		}
	}
	a.Resync()
	if _, err := a.Apply(base()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range refusals {
		bad := clone(base())
		tc.edit(bad)
		a.Resync() // one transaction per case, from what the kernel has
		_, err := a.Apply(bad)
		var rejected *kernel.RejectedError
		switch {
		case tc.encoder && (err == nil || errors.As(err, &rejected)):
			t.Errorf("%s: the Applier's encoder let it through: %v", tc.name, err)
		case !tc.encoder && (!errors.As(err, &rejected) || !errors.Is(err, tc.errno)):
			t.Errorf("%s: kernel said %v, the fake says %v", tc.name, err, tc.errno)
		}
	}

	// an element deleted by another process: the delta deleting it fails in both
	a.Resync()
	if _, err := a.Apply(base()); err != nil {
		t.Fatal(err)
	}
	ns.MustRun(t, "", "nft", "delete", "element", "ip", "t", "s", "{ 10.0.0.2 }")
	next := clone(base())
	set(next, "s").Elements = nil
	if _, err := a.Apply(next); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("deleting an element that is gone: kernel said %v, the fake says ENOENT", err)
	}

	// another process's rule uses our set: the delta deleting it fails in both
	a.Resync()
	if _, err := a.Apply(base()); err != nil {
		t.Fatal(err)
	}
	ns.MustRun(t, "", "nft", "add", "chain", "ip", "t", "intruder")
	ns.MustRun(t, "", "nft", "add", "rule", "ip", "t", "intruder", "ip", "saddr", "@s")
	if _, err := a.Apply(nextWithoutS()); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("deleting a set another process's rule uses: kernel said %v, the fake says EBUSY", err)
	}
	a.Resync()
	if _, err := a.Apply(nextWithoutS()); err != nil {
		t.Errorf("rewrite over the intruder: %v", err)
	}
}
