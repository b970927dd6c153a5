// Package pipeline turns API objects into the ruleset of every family: model snapshot,
// then one compiler per family. The controller runs it incrementally on every sync;
// the one-shot commands (--dry-run, explain, verify) call Compile, its pure form.
package pipeline

import (
	"net/netip"
	"reflect"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/par"
	"github.com/nftproxy/nftproxy/nft"
)

// Families are the address families nftproxy programs, one table each.
var Families = []nft.Family{nft.IPv4, nft.IPv6}

// Config is what the pipeline reads of the proxy's configuration.
type Config struct {
	// Compile configures the compiler of every family, as CompileConfig gives it to
	// each: its Family is the pipeline's to set, and node ports answer on every local
	// address in the families NodePortAddresses resolves so.
	Compile compile.Config
	// NodePortAddresses are the addresses node ports answer on (--nodeport-addresses),
	// resolved at every sync into the snapshot's.
	NodePortAddresses config.NodePortAddresses
	// LocalAddrs lists the machine's addresses (for --nodeport-addresses CIDRs).
	LocalAddrs func() ([]netip.Addr, error)
	// ServiceCIDRs are the ranges cluster IPs are allocated from (the ServiceCIDR
	// objects', or --service-cluster-ip-range when the API serves none).
	ServiceCIDRs []netip.Prefix
	// FastPathInterfaces are names or globs of the fast path's interfaces
	// (--fast-path-interfaces; empty: Compile.FastPath as it is), matched on every
	// compile against the names Interfaces lists (nil: net.Interfaces).
	FastPathInterfaces []string
	Interfaces         func() ([]string, error)
}

// CompileConfig is the compiler configuration of family fam: cfg.Compile for fam, with
// node ports on every local address when allLocal (what NodePortAddresses resolves to
// in fam). It is the one way from the proxy's configuration to a compiler's.
func (cfg Config) CompileConfig(fam nft.Family, allLocal bool) compile.Config {
	cc := cfg.Compile
	cc.Family = fam
	cc.NodePortAllLocal = cc.NodePortAllLocal || allLocal
	return cc
}

// Compile turns API objects into the ruleset of every family. slots holds one allocator
// per family (see compile.Slots); problems lists bad input that was skipped. The
// rulesets are flat (no parts): this is the pure form of what a running proxy compiles
// incrementally.
func Compile(cfg Config, slots map[nft.Family]*compile.Slots, svcs []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	pl := &Pipeline{slots: slots}
	snap, rulesets, problems, err := pl.Full(cfg, svcs, slices, node)
	for i, rs := range rulesets {
		rulesets[i] = rs.Flatten()
	}
	return snap, rulesets, problems, err
}

// Pipeline compiles API objects into rulesets, incrementally: it keeps a model cache and
// compilers between calls, so a service whose objects did not change costs pointer
// comparisons, and its ruleset part is the same as last time (see nft.Part).
type Pipeline struct {
	models    *model.Cache // nil: build from scratch
	slots     map[nft.Family]*compile.Slots
	compilers map[nft.Family]*compiler
	// won holds the frontends every UDP service port won in the rulesets compiled
	// last, all families: the stale UDP flows are those of the addresses a port really
	// has, never of one another Service holds
	won conntrack.Won
}

type compiler struct {
	cfg compile.Config
	c   *compile.Compiler
}

// New returns an incremental pipeline.
func New() *Pipeline {
	return &Pipeline{models: model.NewCache(), slots: map[nft.Family]*compile.Slots{}}
}

// Reset drops the model cache: the next Full builds the snapshot anew (its first
// snapshot follows none, so the compilers compare every service port). For a cache a
// sync that panicked may have left half updated.
func (pl *Pipeline) Reset() { pl.models = model.NewCache() }

// Won is the frontends every UDP service port won in the rulesets compiled last.
func (pl *Pipeline) Won() conntrack.Won { return pl.won }

// SetAside tells, per family compiled so far, how many Services its table leaves out
// for the limits.
func (pl *Pipeline) SetAside() map[nft.Family]int {
	out := make(map[nft.Family]int, len(pl.compilers))
	for fam, c := range pl.compilers {
		out[fam] = c.c.SetAside()
	}
	return out
}

// Full compiles the full lists of Services and EndpointSlices.
func (pl *Pipeline) Full(cfg Config, svcs []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	return pl.run(cfg, node, func(in model.Inputs) (*model.Snapshot, []model.Problem) {
		in.Services, in.Slices = svcs, slices
		if pl.models != nil {
			return pl.models.BuildFrom(in)
		}
		return model.BuildFrom(in)
	})
}

// Changes compiles the model cache's objects with the changes d (see
// model.Cache.BuildChanges); the pipeline must have a model cache (New).
func (pl *Pipeline) Changes(cfg Config, d model.Delta, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	return pl.run(cfg, node, func(in model.Inputs) (*model.Snapshot, []model.Problem) {
		return pl.models.BuildChanges(d, in)
	})
}

// run builds the snapshot with build, given the inputs other than Services and
// EndpointSlices, and compiles it. It fails only before it builds.
func (pl *Pipeline) run(cfg Config, node *v1.Node, build func(model.Inputs) (*model.Snapshot, []model.Problem)) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	// What the model cannot know (the machine's addresses) is resolved first, so that
	// the snapshot is complete when built; from there on, all is pure.
	npAddrs, allLocal, err := nodePortAddrs(cfg, model.NodeOf(node))
	if err != nil {
		return nil, nil, nil, err
	}
	fastPath, err := fastPathDevices(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	snap, problems := build(model.Inputs{Node: node, ServiceCIDRs: cfg.ServiceCIDRs, NodePortAddrs: npAddrs})
	if pl.compilers == nil {
		pl.compilers = map[nft.Family]*compiler{}
	}
	if pl.slots == nil {
		pl.slots = map[nft.Family]*compile.Slots{}
	}
	// Each family has its own compiler and slots, and reads the snapshot, which nothing
	// modifies: the families are compiled at once (a dual-stack cold start takes the
	// time of the larger one).
	type result struct {
		rs        *nft.Ruleset
		conflicts []model.Problem
	}
	results := make([]result, len(Families))
	jobs := make([]func(), len(Families))
	for i, fam := range Families {
		cc := cfg.CompileConfig(fam, allLocal[fam])
		if pl.slots[fam] == nil {
			pl.slots[fam] = compile.NewSlots()
		}
		c := pl.compilers[fam]
		if c == nil || !reflect.DeepEqual(c.cfg, cc) {
			c = &compiler{cfg: cc, c: compile.NewCompiler(cc, pl.slots[fam])}
			pl.compilers[fam] = c
		}
		c.c.SetFastPath(fastPath) // devices come and go: not a new compiler
		jobs[i] = func() {
			rs, conflicts := c.c.Compile(snap)
			results[i] = result{rs, conflicts}
		}
	}
	par.Do(jobs...)
	out := make([]*nft.Ruleset, 0, len(results))
	for _, r := range results {
		problems = append(problems, r.conflicts...)
		out = append(out, r.rs)
	}
	pl.won = conntrack.Won{}
	for _, fam := range Families {
		pl.compilers[fam].c.Won(model.ProtoUDP, func(name model.ServicePortName, ips []netip.Addr, nodePort uint16) {
			f := pl.won[name]
			f.IPs = append(f.IPs, ips...)
			f.NodePort = max(f.NodePort, nodePort)
			pl.won[name] = f
		})
	}
	return snap, out, problems, nil
}

// nodePortAddrs resolves --nodeport-addresses into addresses, or "all local" per family.
func nodePortAddrs(cfg Config, node model.Node) ([]netip.Addr, map[nft.Family]bool, error) {
	allLocal := map[nft.Family]bool{}
	var out []netip.Addr
	for _, fam := range Families {
		r, err := cfg.NodePortAddresses.Resolve(fam == nft.IPv6, node.IPs, cfg.LocalAddrs)
		if err != nil {
			return nil, nil, err
		}
		allLocal[fam] = r.AllLocal
		out = append(out, r.Addrs...)
	}
	return out, allLocal, nil
}
