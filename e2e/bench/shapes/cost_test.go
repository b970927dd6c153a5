package shapes

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// Current is today's compiled ruleset (internal/compile through nft/kernel's applier),
// measured beside the candidates.
const Current = "current"

// Change kinds, in the order they are measured.
// "class-jump" (markclass only) deletes and re-adds one element of the classes verdict map
// in one transaction: what a class seen for the first time would cost, since a jump
// element makes the kernel validate the table, here a table whose chains and verdict-map
// elements do not grow with services.
var kinds = []string{"endpoint-replaced", "endpoint-count", "service-added", "service-removed", "class-jump"}

// maxClass is how many per-class chains the candidates create up front (1..maxClass):
// 32, or NFTPROXY_SHAPES_CLASSES (at most 255, the 8 class bits).
var maxClass = func() int {
	if n, err := strconv.Atoi(os.Getenv("NFTPROXY_SHAPES_CLASSES")); err == nil && n >= 12 && n <= 255 {
		return n
	}
	return 32
}()

// TestChangeCost measures the kernel time of each steady-state change for every shape at
// each size: NFTPROXY_SHAPES_BENCH=1 (root). NFTPROXY_SHAPES_SIZES overrides the sizes
// ("1000x10,50000x5"), NFTPROXY_SHAPES_CHANGES the number of changes per kind,
// NFTPROXY_SHAPES the shapes ("current,markclass"), NFTPROXY_SHAPES_CLASSES the number
// of classes created up front (12..255, default 32).
func TestChangeCost(t *testing.T) {
	if os.Getenv("NFTPROXY_SHAPES_BENCH") != "1" {
		t.Skip("set NFTPROXY_SHAPES_BENCH=1 (root) to measure the shapes' change cost")
	}
	sizes := "1000x10,10000x10,30000x10,50000x5"
	if s := os.Getenv("NFTPROXY_SHAPES_SIZES"); s != "" {
		sizes = s
	}
	changes := 30
	if s := os.Getenv("NFTPROXY_SHAPES_CHANGES"); s != "" {
		changes, _ = strconv.Atoi(s)
	}
	var report strings.Builder
	fmt.Fprintf(&report, "| services × endpoints | shape | load | %s |\n| --- | --- | --- |%s\n",
		strings.Join(kinds, " | "), strings.Repeat(" --- |", len(kinds)))
	for _, size := range strings.Split(sizes, ",") {
		var n, e int
		if _, err := fmt.Sscanf(size, "%dx%d", &n, &e); err != nil {
			t.Fatalf("size %q: %v", size, err)
		}
		for _, shape := range append([]string{Current}, Shapes...) {
			if only := os.Getenv("NFTPROXY_SHAPES"); only != "" && !slices.Contains(strings.Split(only, ","), shape) {
				continue
			}
			var load time.Duration
			var res map[string][]Cost
			if shape == Current {
				load, res = measureCurrent(t, n, e, changes)
			} else {
				load, res = measureShape(t, shape, n, e, changes)
			}
			fmt.Fprintf(&report, "| %d × %d | %s | %.2f s |", n, e, shape, load.Seconds())
			for _, k := range kinds {
				fmt.Fprintf(&report, " %s |", summary(res[k]))
			}
			report.WriteString("\n")
			t.Logf("%d×%d %s: load %v, %v", n, e, shape, load, summaries(res))
		}
	}
	t.Logf("median / p99 of %d changes each, kernel time per transaction (ms):\n%s", changes, report.String())
}

func summaries(res map[string][]Cost) string {
	var out []string
	for _, k := range kinds {
		out = append(out, k+" "+summary(res[k]))
	}
	return strings.Join(out, ", ")
}

// summary is "CPU median / p99 (wall median / p99)" in milliseconds (p99 by nearest
// rank: with fewer than 100 samples, the largest).
func summary(cs []Cost) string {
	if len(cs) == 0 {
		return "-"
	}
	var cpu, wall []time.Duration
	for _, c := range cs {
		cpu, wall = append(cpu, c.CPU), append(wall, c.Wall)
	}
	return fmt.Sprintf("%s (%s)", medP99(cpu), medP99(wall))
}

func medP99(ds []time.Duration) string {
	slices.Sort(ds)
	p99 := ds[min(len(ds)-1, (len(ds)*99+99)/100-1)]
	return fmt.Sprintf("%.3f / %.3f", ms(ds[len(ds)/2]), ms(p99))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// target is the i-th service changed: spread over the table, never one already removed.
func target(i, n int, gone map[int]bool) int {
	for j := 0; ; j++ {
		k := (n/2 + (i+j)*7919) % n
		if !gone[k] {
			return k
		}
	}
}

func newEndpoint(i int) Endpoint {
	return Endpoint{netip.AddrFrom4([4]byte{10, 250, byte(i / 256), byte(i)}), 8080}
}

func newService(i, e int) Service {
	s := Service{IP: netip.AddrFrom4([4]byte{10, 200, byte(i / 256), byte(i)}), Port: 80}
	for j := 0; j < e; j++ {
		s.Endpoints = append(s.Endpoints, Endpoint{netip.AddrFrom4([4]byte{10, 251, byte(i), byte(j)}), 8080})
	}
	return s
}

// classes1To returns 1..m.
func classes1To(m int) []int {
	out := make([]int, m)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// measureShape loads a candidate with nft -f and measures each change kind.
func measureShape(t *testing.T, shape string, n, e, changes int) (time.Duration, map[string][]Cost) {
	ns := testnetns.New(t)
	svcs := Services(n, e)
	text := Generate(shape, svcs, classes1To(maxClass))
	start := time.Now()
	ns.MustRun(t, text, "nft", "-f", "-")
	load := time.Since(start)
	c, err := Dial(ns.FD)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res := map[string][]Cost{}
	gone := map[int]bool{}
	for _, kind := range kinds {
		for i := 0; i < changes; i++ {
			k := target(i, n, gone)
			s := svcs[k]
			var ops []Op
			switch kind {
			case "endpoint-replaced":
				ops = ReplaceEndpoint(shape, s, 0, newEndpoint(i))
				svcs[k].Endpoints = slices.Clone(s.Endpoints)
				svcs[k].Endpoints[0] = newEndpoint(i)
			case "endpoint-count":
				next := s
				if len(s.Endpoints) > e {
					next.Endpoints = slices.Clone(s.Endpoints[:e])
				} else {
					next.Endpoints = append(slices.Clone(s.Endpoints), newEndpoint(1000+i))
				}
				ops = Resize(shape, s, next)
				svcs[k] = next
			case "service-added":
				ops = AddService(shape, newService(i, e))
			case "service-removed":
				ops = RemoveService(shape, s)
				gone[k] = true
			case "class-jump":
				if shape != MarkClass {
					continue
				}
				ops = ClassJump(maxClass)
			}
			d, err := c.Apply(ops)
			if err != nil {
				t.Fatalf("%s %s #%d: %v", shape, kind, i, err)
			}
			res[kind] = append(res[kind], d)
		}
	}
	// Consistency: every delete above names an element a previous transaction added, so
	// a table that drifted from the model fails with ENOENT; the packet test checks the
	// data path.
	return load, res
}

// measureCurrent loads today's ruleset through the compiler and the applier (as
// nft/kernel's BenchmarkOneChange) and measures the same changes.
func measureCurrent(t *testing.T, n, e, changes int) (time.Duration, map[string][]Cost) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	cfg := compile.Config{Family: nft.IPv4, DetectLocal: compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(ClusterCIDR)}}, MasqueradeBit: 14,
		NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	cc := compile.NewCompiler(cfg, compile.NewSlots())
	toModel := func(name string, s Service) model.ServicePort {
		sp := model.ServicePort{
			Name:       model.ServicePortName{Namespace: "default", Name: name, Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{s.IP},
			Port:       s.Port,
		}
		for _, ep := range s.Endpoints {
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{Addr: ep.Addr, Port: ep.Port, Ready: true, Serving: true})
		}
		return sp
	}
	snap := &model.Snapshot{}
	for i, s := range Services(n, e) {
		sp := toModel(fmt.Sprintf("s%06d", i), s)
		snap.Services = append(snap.Services, &sp)
	}
	rs, _ := cc.Compile(snap)
	st, err := a.Apply(rs)
	if err != nil {
		t.Fatal(err)
	}
	load := st.Kernel
	res := map[string][]Cost{}
	gone := map[int]bool{}
	for _, kind := range kinds {
		for i := 0; i < changes; i++ {
			k := target(i, n, gone)
			cp := *snap.Services[k] // service ports are never modified: change a copy
			sp := &cp
			snap.Services[k] = sp
			mep := func(ep Endpoint) model.Endpoint {
				return model.Endpoint{Addr: ep.Addr, Port: ep.Port, Ready: true, Serving: true}
			}
			switch kind {
			case "endpoint-replaced":
				eps := slices.Clone(sp.Endpoints)
				eps[0] = mep(newEndpoint(i))
				sp.Endpoints = eps
			case "endpoint-count":
				if len(sp.Endpoints) > e {
					sp.Endpoints = slices.Clone(sp.Endpoints[:e])
				} else {
					sp.Endpoints = append(slices.Clone(sp.Endpoints), mep(newEndpoint(1000+i)))
				}
			case "service-added":
				added := toModel(fmt.Sprintf("new%06d", i), newService(i, e))
				snap.Services = append(snap.Services, &added)
			case "service-removed":
				// Marked gone and emptied of its frontends: compiled out, indices stay.
				gone[k] = true
			case "class-jump":
				continue
			}
			cur := snap
			if len(gone) > 0 {
				cur = &model.Snapshot{}
				for j := range snap.Services {
					if !gone[j] {
						cur.Services = append(cur.Services, snap.Services[j])
					}
				}
			}
			rs, _ := cc.Compile(cur)
			// CPU spans all of Apply: the applier's diff and encoding, then the kernel's
			// commit (an upper bound of the kernel's part; the diff of one changed part is
			// small beside the validation).
			runtime.LockOSThread()
			cpu := ThreadCPU()
			st, err := a.Apply(rs)
			cpu = ThreadCPU() - cpu
			runtime.UnlockOSThread()
			if err != nil {
				t.Fatalf("current %s #%d: %v", kind, i, err)
			}
			res[kind] = append(res[kind], Cost{Wall: st.Kernel, CPU: cpu})
		}
	}
	return load, res
}
