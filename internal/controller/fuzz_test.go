package controller_test

// Hostile input fuzzing: random Services, EndpointSlices and Nodes (fuzz_input_test.go)
// must never make the model builder or the compiler panic, and every ruleset compiled
// from them must be consistent (fuzz_check_test.go). `go test` runs the seed corpus in
// testdata/fuzz/<target>/ as ordinary tests; `make fuzz` explores further.

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
)

// FuzzCompile compiles the final state of an input from scratch, through the controller
// (model.Build + compile.Compile for both families) and through the incremental
// compiler, and checks every invariant of the result.
func FuzzCompile(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		worlds := decode(data)
		w := worlds[len(worlds)-1]
		slots := map[nft.Family]*compile.Slots{}
		snap, rulesets, ok := compileWorld(t, w, slots)
		if !ok {
			return
		}
		checkSnapshot(t, w, snap)
		for _, rs := range rulesets {
			mustBeValid(t, w, "pipeline.Compile", rs, rs.Family)
		}

		// The listers return objects in no particular order.
		_, rev, _, _ := pipeline.Compile(w.cfg.Pipeline, map[nft.Family]*compile.Slots{},
			reversed(w.svcs), reversed(w.slices), w.node)
		for i := range rulesets {
			if a, b := nft.Render(rulesets[i]), nft.Render(rev[i]); a != b {
				t.Fatalf("the ruleset depends on the order of the objects\n%s\n--- in order:\n%s\n--- reversed:\n%s", describe(w), a, b)
			}
		}
		// A sync without a change compiles the same ruleset (and the kernel diff is empty).
		_, again, _, _ := pipeline.Compile(w.cfg.Pipeline, slots, w.svcs, w.slices, w.node)
		for i := range rulesets {
			if a, b := nft.Render(rulesets[i]), nft.Render(again[i]); a != b {
				t.Fatalf("compiling the same input twice gives different rulesets\n%s\n--- first:\n%s\n--- second:\n%s", describe(w), a, b)
			}
		}

		// The incremental compiler: parts that are consistent, and all of them reused
		// (the same pointers) when nothing changed.
		for _, fam := range pipeline.Families {
			cc := compile.NewCompiler(compileConfig(w.cfg, snap.Node, fam), compile.NewSlots())
			first, _ := cc.Compile(snap)
			mustBeValidParts(t, w, "Compiler.Compile", first, fam)
			second, _ := cc.Compile(snap)
			if len(first.Parts) != len(second.Parts) {
				t.Fatalf("%s: %d parts, then %d for the same snapshot\n%s", fam, len(first.Parts), len(second.Parts), describe(w))
			}
			for i := range first.Parts {
				if first.Parts[i] != second.Parts[i] {
					t.Fatalf("%s: part %q was recompiled although nothing changed\n%s", fam, second.Parts[i].Owner, describe(w))
				}
			}
			if a, b := nft.Render(first), nft.Render(second); a != b {
				t.Fatalf("%s: Compiler gives a different ruleset for the same snapshot\n%s\n--- first:\n%s\n--- second:\n%s", fam, describe(w), a, b)
			}
		}
	})
}

// FuzzCompileIncremental compiles every state of an input in turn, as the controller's
// syncs do: with the same slot allocators (pipeline.Compile) and the same incremental
// compilers. Each ruleset must be consistent and program the same as a compilation from
// scratch of that state (compared without slot numbers).
func FuzzCompileIncremental(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		slots := map[nft.Family]*compile.Slots{}
		compilers := map[nft.Family]*compile.Compiler{}
		compilerCfg := map[nft.Family]compile.Config{}
		compilerSlots := map[nft.Family]*compile.Slots{}
		// the controller's path: a model cache whose change sets the compilers trust
		cache := model.NewCache()
		cached := map[nft.Family]*compile.Compiler{}
		cachedCfg := map[nft.Family]compile.Config{}
		for step, w := range decode(data) {
			snap, rulesets, ok := compileWorld(t, w, slots)
			if !ok {
				continue
			}
			_, fresh, _, _ := pipeline.Compile(w.cfg.Pipeline, map[nft.Family]*compile.Slots{}, w.svcs, w.slices, w.node)
			csnap, _ := cache.BuildFrom(model.Inputs{Services: w.svcs, Slices: w.slices, Node: w.node, ServiceCIDRs: snap.ServiceCIDRs, NodePortAddrs: snap.NodePortAddrs})
			for i, rs := range rulesets {
				what := fmt.Sprintf("sync %d: pipeline.Compile", step)
				mustBeValid(t, w, what, rs, rs.Family)
				if a, b := normalize(rs), normalize(fresh[i]); a != b {
					t.Fatalf("%s: %s ruleset differs from a fresh compilation\n%s\n%s", what, rs.Family, describe(w), diffLines(b, a))
				}
			}
			for _, fam := range pipeline.Families {
				what := fmt.Sprintf("sync %d: Compiler.Compile", step)
				cfg := compileConfig(w.cfg, snap.Node, fam)
				if compilerSlots[fam] == nil {
					compilerSlots[fam] = compile.NewSlots()
				}
				if compilers[fam] == nil || !reflect.DeepEqual(cfg, compilerCfg[fam]) {
					// A new configuration (node port addresses follow the node's IPs)
					// takes a new compiler; the slot allocator stays.
					compilers[fam], compilerCfg[fam] = compile.NewCompiler(cfg, compilerSlots[fam]), cfg
				}
				inc, _ := compilers[fam].Compile(snap)
				flat := mustBeValidParts(t, w, what, inc, fam)
				want, _ := compile.Compile(snap, cfg, compile.NewSlots())
				if a, b := normalize(flat), normalize(want); a != b {
					t.Fatalf("%s: %s ruleset differs from a fresh compilation\n%s\n%s", what, fam, describe(w), diffLines(b, a))
				}
				// the node port addresses come with the snapshot, as in the controller
				ccfg := cfg
				ccfg.NodePortAddrs = nil
				if cached[fam] == nil || !reflect.DeepEqual(ccfg, cachedCfg[fam]) {
					cached[fam], cachedCfg[fam] = compile.NewCompiler(ccfg, compile.NewSlots()), ccfg
				}
				inc, _ = cached[fam].Compile(csnap)
				flat = mustBeValidParts(t, w, what+" (model cache)", inc, fam)
				if a, b := normalize(flat), normalize(want); a != b {
					t.Fatalf("%s (model cache): %s ruleset differs from a fresh compilation\n%s\n%s", what, fam, describe(w), diffLines(b, a))
				}
			}
		}
	})
}

// compileWorld runs pipeline.Compile, which must accept every configuration (the
// options boundary refuses bad --nodeport-addresses; the Config holds parsed values).
func compileWorld(t *testing.T, w world, slots map[nft.Family]*compile.Slots) (*model.Snapshot, []*nft.Ruleset, bool) {
	t.Helper()
	snap, rulesets, _, err := pipeline.Compile(w.cfg.Pipeline, slots, w.svcs, w.slices, w.node)
	if err != nil {
		t.Fatalf("pipeline.Compile: error %v with --nodeport-addresses %+v", err, w.cfg.Pipeline.NodePortAddresses)
	}
	if err != nil {
		return nil, nil, false
	}
	if len(rulesets) != len(pipeline.Families) {
		t.Fatalf("pipeline.Compile returned %d rulesets for %d families", len(rulesets), len(pipeline.Families))
	}
	for i, fam := range pipeline.Families {
		if rulesets[i].Family != fam {
			t.Fatalf("ruleset %d is of family %s, want %s", i, rulesets[i].Family, fam)
		}
	}
	return snap, rulesets, true
}

// checkSnapshot checks what the model promises its consumers.
func checkSnapshot(t *testing.T, w world, snap *model.Snapshot) {
	t.Helper()
	for i, sp := range snap.Services {
		if i > 0 && sp.Name.Less(snap.Services[i-1].Name) {
			t.Fatalf("snapshot not sorted: %v after %v\n%s", sp.Name, snap.Services[i-1].Name, describe(w))
		}
		if sp.Port == 0 || len(sp.ClusterIPs) == 0 {
			t.Fatalf("service port %v: port %d, cluster IPs %v\n%s", sp.Name, sp.Port, sp.ClusterIPs, describe(w))
		}
		for _, a := range slices.Concat(sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs) {
			if !a.IsValid() || a.Is4In6() {
				t.Fatalf("service port %v: address %v\n%s", sp.Name, a, describe(w))
			}
		}
		for _, e := range sp.Endpoints {
			if !e.Addr.IsValid() || e.Addr.Is4In6() || e.Port == 0 {
				t.Fatalf("service port %v: endpoint %v\n%s", sp.Name, e.AddrPort(), describe(w))
			}
		}
		if sp.AffinityTimeout > model.MaxAffinityTimeout {
			t.Fatalf("service port %v: affinity timeout %d\n%s", sp.Name, sp.AffinityTimeout, describe(w))
		}
	}
}

func mustBeValid(t *testing.T, w world, what string, rs *nft.Ruleset, fam nft.Family) {
	t.Helper()
	if errs := checkRuleset(rs, fam); len(errs) > 0 {
		t.Fatalf("%s: invalid %s ruleset:\n%s\n%s\n--- ruleset:\n%s", what, fam, firstErrors(errs), describe(w), nft.Render(rs))
	}
	if text := nft.Render(rs); !strings.HasPrefix(text, fmt.Sprintf("table %s %s {\n", fam, compile.TableName)) {
		t.Fatalf("%s: rendered %s ruleset does not start with its table:\n%s", what, fam, text)
	}
}

// mustBeValidParts checks a ruleset with parts before and after flattening, and returns
// the flat one.
func mustBeValidParts(t *testing.T, w world, what string, rs *nft.Ruleset, fam nft.Family) *nft.Ruleset {
	t.Helper()
	if errs := checkParts(rs); len(errs) > 0 {
		t.Fatalf("%s: inconsistent %s parts:\n%s\n%s", what, fam, firstErrors(errs), describe(w))
	}
	flat := rs.Flatten()
	mustBeValid(t, w, what+" (flattened)", flat, fam)
	return flat
}

func firstErrors(errs []string) string {
	if len(errs) > 20 {
		errs = append(errs[:20], fmt.Sprintf("… and %d more", len(errs)-20))
	}
	return "\t" + strings.Join(errs, "\n\t")
}

// describe prints an input's objects for a failure message.
func describe(w world) string {
	j, _ := json.MarshalIndent(struct {
		Config   any
		Node     any
		Services any
		Slices   any
	}{
		map[string]any{"detectLocal": w.cfg.Pipeline.Compile.DetectLocal, "nodePortAddresses": w.cfg.Pipeline.NodePortAddresses,
			"serviceCIDRs": w.cfg.Pipeline.ServiceCIDRs, "masqueradeAll": w.cfg.Pipeline.Compile.MasqueradeAll, "masqueradeBit": w.cfg.Pipeline.Compile.MasqueradeBit},
		w.node, w.svcs, w.slices,
	}, "", " ")
	return "--- input:\n" + string(j)
}

// diffLines lists the lines only in want (-) or only in got (+).
func diffLines(want, got string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	w, g := in(want), in(got)
	var out []string
	for _, l := range strings.Split(want, "\n") {
		if g[l] < w[l] {
			out = append(out, "- "+l)
			w[l]--
		}
	}
	w = in(want)
	for _, l := range strings.Split(got, "\n") {
		if w[l] < g[l] {
			out = append(out, "+ "+l)
			g[l]--
		}
	}
	return "--- fresh (-) vs incremental (+):\n" + strings.Join(out, "\n")
}

// compileConfig is the compile.Config pipeline.Compile uses for fam: the pipeline's own
// builder (pipeline.Config.CompileConfig) for the settings, and kube-proxy's
// nodePortAddresses semantics written out independently for the node port addresses,
// which the pipeline resolves into the snapshot and this gives the compiler as fixed
// ones. Per family (IPv4 first): the node's primary IP ("primary") and the local
// addresses in the family's CIDRs, never loopback; a family without any entry, or with
// a /0, answers on all local addresses.
func compileConfig(cfg controller.Config, node model.Node, fam nft.Family) compile.Config {
	npa := cfg.Pipeline.NodePortAddresses
	local, _ := cfg.Pipeline.LocalAddrs()
	allLocal := false
	var fixed []netip.Addr
	for _, f := range pipeline.Families {
		v6 := f == nft.IPv6
		var cidrs []netip.Prefix
		all := false
		for _, p := range npa.CIDRs {
			if p.Addr().Is6() == v6 {
				cidrs = append(cidrs, p)
				all = all || p.Bits() == 0
			}
		}
		var addrs []netip.Addr
		if npa.Primary {
			for _, a := range node.IPs {
				if a.Is6() == v6 && !a.IsLoopback() {
					addrs = append(addrs, a)
				}
			}
		}
		if all || (len(cidrs) == 0 && len(addrs) == 0) {
			allLocal = allLocal || f == fam
			continue
		}
		for _, a := range local {
			if !a.IsLoopback() && !slices.Contains(addrs, a) && slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
				addrs = append(addrs, a)
			}
		}
		fixed = append(fixed, addrs...)
	}
	cc := cfg.Pipeline.CompileConfig(fam, allLocal)
	cc.NodePortAddrs = append(slices.Clip(cc.NodePortAddrs), fixed...)
	return cc
}

func reversed[T any](list []T) []T {
	out := slices.Clone(list)
	slices.Reverse(out)
	return out
}
