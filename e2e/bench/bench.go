// Package bench is the side-by-side benchmark: nftproxy and upstream
// kube-proxy (nftables and iptables mode) on the same local netns cluster (e2e/cluster)
// in the same run, with real packets. See README.md in this directory.
//
//	NFTPROXY_BENCH=1 go test ./e2e/bench/ -run 'TestSideBySide$' -timeout 120m -v
//
// For each size N (services already in the API, 10 endpoints each) every proxy is
// started alone on the node and measured: cold start, the kernel footprint, one change
// at scale (an added service, an endpoint change) seen by packets, the data path
// (connections per second to a ClusterIP against the endpoint's pod IP) and, at one N,
// endpoint churn. Between proxies the rules are removed with the proxy's own --cleanup
// and the node's ruleset is checked to be empty.
package bench

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Options configure RunSuite.
type Options struct {
	Sizes     []int // service counts, ascending; 10 endpoints each (Endpoints)
	Endpoints int
	// Wide are further sizes with their own endpoints per service (many
	// endpoints per service: 5,000 services × 50 endpoints), measured in the sweep in order of N (the API
	// only grows: the services already there are reshaped to each size's endpoint
	// count, the rest created). kube-proxy's iptables mode is left out at these sizes
	// (the comparison is with its nftables mode); the churn and the data path run only
	// at the sweep's own sizes.
	Wide         []Size
	SmallSize    int // extra small N (before Sizes) for the data path; 0: none
	BigSize      int // nftproxy alone at BigSize × BigEndpoints after the sweep; 0: none
	BigEndpoints int
	ChurnSize    int // N at which churn runs (must be one of Sizes); 0: none
	ChurnRate    int // endpoint changes per second
	ChurnFor     time.Duration
	Repeats      int // one-change repetitions per kind
	// ExposeRepeats is the number of new Service + EndpointSlice pairs (the expose
	// scenario), each written ExposeGap after the previous pair.
	ExposeRepeats int
	ExposeGap     time.Duration
	// Burst is the burst scenario (burst.go); Services 0: none.
	Burst BurstOpts
	// Scenarios restricts what is measured after each cold start (names in
	// AllScenarios); empty: all of them.
	Scenarios    []string
	DataPathFor  time.Duration // per load-client run
	DataPathConc int           // load-client parallel loops
	Bound        time.Duration // gives up on a cold start after this long ("> bound")
	Samples      int           // ClusterIPs probed per cold start (first and last included)
	// ColdStarts is how many cold starts each proxy makes at each size (at least one):
	// the extra ones are made after the size's measurements, each from an empty ruleset
	// and stopped and cleaned up after, and the cold start reported is their median. A
	// proxy whose cold start takes longer than coldRepeatLimit is measured once (its
	// spread is a small part of it).
	ColdStarts int
	Proxies    []string // subset of proxy names; empty: all three
	// HeapProfiles, if set, is a directory: nftproxy runs with --profiling, its heap
	// profile (after a collection) is saved there as heap-nftproxy-N.pb.gz when its
	// measurements end, and a CPU profile of the expose scenario as
	// cpu-expose-nftproxy-N.pb.gz, to see where the memory and the sync time go.
	HeapProfiles string
	Logf         func(format string, args ...any)
	// Checkpoint, if set, is called with the results so far after every proxy run (a
	// run stopped early still leaves what it measured).
	Checkpoint func(*Results)
}

// Size is a number of services with a number of endpoints each.
type Size struct {
	N         int `json:"n"`
	Endpoints int `json:"endpoints_per_service"`
}

func (z Size) String() string { return fmt.Sprintf("%dx%d", z.N, z.Endpoints) }

// AllScenarios are the measurements Options.Scenarios can choose (the cold start always
// runs: every other measurement needs a programmed proxy).
var AllScenarios = []string{"footprint", "datapath", "onechange", "expose", "burst", "churn"}

func (o Options) has(scenario string) bool {
	return len(o.Scenarios) == 0 || slices.Contains(o.Scenarios, scenario)
}

// suite is one run's state.
type suite struct {
	o       Options
	c       *cluster.Cluster
	a       *api
	proxies []Proxy
	pods    []*cluster.Pod // backends
	alt     [2]*cluster.Pod
	client  *cluster.Pod
	pool    *nsPool
	loadBin string
	res     *Results
	failed  map[string]bool // proxy timed out at a smaller N
	eps     int             // endpoints per service of the services in the API now
	// metricsClient dials from the node namespace (no keep-alive: each proxy is new)
	metricsClient *http.Client
	logf          func(string, ...any)
}

// Binaries are what RunSuite needs besides the cluster.
type Binaries struct {
	Nftproxy, KubeProxy, LoadClient string
}

// RunSuite runs the suite on c (a fresh cluster) and returns the results. Errors of single
// measurements are recorded in the runs; an error is returned only when the suite
// cannot go on.
func RunSuite(ctx context.Context, c *cluster.Cluster, bins Binaries, o Options) (*Results, error) {
	start := time.Now()
	s := &suite{o: o, c: c, loadBin: bins.LoadClient, failed: map[string]bool{}, logf: o.Logf,
		metricsClient: &http.Client{Transport: &http.Transport{DialContext: dialIn(c.NodeNS), DisableKeepAlives: true, DisableCompression: true}}}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	for _, p := range Proxies(bins.Nftproxy, bins.KubeProxy) {
		if len(o.Proxies) == 0 && !p.OnlyNamed || slices.Contains(o.Proxies, p.Name) {
			s.proxies = append(s.proxies, p)
		}
	}
	host := hostInfo(ctx, bins)
	host.Etcd = c.EtcdVersion
	s.res = &Results{Started: start, Host: host, Options: Opts{
		Sizes: o.Sizes, Endpoints: o.Endpoints, Wide: o.Wide, SmallSize: o.SmallSize, BigSize: o.BigSize, BigEndpoints: o.BigEndpoints,
		ChurnSize: o.ChurnSize, ChurnRate: o.ChurnRate, ChurnSeconds: o.ChurnFor.Seconds(), Repeats: o.Repeats,
		BoundSeconds: o.Bound.Seconds(), ColdStarts: o.ColdStarts, Scenarios: o.Scenarios,
	}}
	if o.has("expose") {
		s.res.Options.Expose, s.res.Options.ExposeGapS = o.ExposeRepeats, o.ExposeGap.Seconds()
	}
	if o.has("burst") && o.Burst.Services > 0 {
		s.res.Options.Burst = &o.Burst
	}
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	defer s.pool.Close()

	var steps []Size
	if o.SmallSize > 0 && o.has("datapath") {
		steps = append(steps, Size{o.SmallSize, o.Endpoints})
	}
	for _, n := range o.Sizes {
		steps = append(steps, Size{n, o.Endpoints})
	}
	steps = append(steps, o.Wide...)
	slices.SortStableFunc(steps, func(a, b Size) int { return a.N - b.N }) // the API only grows
	have := 0
	maxN := 0
	if len(o.Sizes) > 0 {
		maxN = slices.Max(o.Sizes)
	}
	for _, z := range steps {
		n := z.N
		wide := z.Endpoints != o.Endpoints
		if err := s.resize(ctx, have, z); err != nil {
			return s.res, err
		}
		have = max(have, n)
		for _, p := range s.proxies {
			r := &Run{Proxy: p.Name, N: n, Endpoints: z.Endpoints}
			s.res.Runs = append(s.res.Runs, r)
			if wide && p.Mode == "iptables" {
				r.Skipped = "not run at this size (the many-endpoints comparison is with the nftables mode)"
				continue
			}
			if s.failed[p.Name] {
				r.Skipped = "cold start exceeded the bound at a smaller N"
				continue
			}
			opts := runOpts{
				footprint: o.has("footprint"),
				oneChange: o.has("onechange"),
				expose:    o.has("expose") && o.ExposeRepeats > 0,
				burst:     o.has("burst") && o.Burst.Services > 0,
				dataPath:  o.has("datapath") && !wide && (n == o.SmallSize || n == maxN),
				churn:     o.has("churn") && !wide && n == o.ChurnSize,
			}
			failedBefore := s.failed[p.Name]
			if err := s.runProxy(ctx, p, r, opts); err != nil {
				return s.res, err
			}
			if wide {
				// a bound exceeded at another shape says little about the sweep's next N
				s.failed[p.Name] = failedBefore
			}
			s.checkpoint()
		}
	}
	if o.BigSize > 0 && o.BigSize > have {
		ep := o.BigEndpoints
		if err := s.resize(ctx, have, Size{o.BigSize, ep}); err != nil {
			return s.res, err
		}
		for _, p := range s.proxies {
			if p.Mode != "" {
				continue // nftproxy alone
			}
			r := &Run{Proxy: p.Name, N: o.BigSize, Endpoints: ep}
			s.res.Runs = append(s.res.Runs, r)
			if err := s.runProxy(ctx, p, r, runOpts{footprint: o.has("footprint"), oneChange: o.has("onechange"),
				expose: o.has("expose") && o.ExposeRepeats > 0, burst: o.has("burst") && o.Burst.Services > 0}); err != nil {
				return s.res, err
			}
		}
	}
	s.res.Ratios = ratios(s.res.Runs)
	s.res.Notes = notes()
	s.res.Seconds = time.Since(start).Seconds()
	s.res.Host.Load += ", at the end " + loadAvg()
	return s.res, nil
}

// checkpoint hands the results so far to Options.Checkpoint, marked as partial.
func (s *suite) checkpoint() {
	if s.o.Checkpoint == nil {
		return
	}
	s.res.Ratios = ratios(s.res.Runs)
	s.res.Notes = append(notes(), "Partial: written after the last completed proxy run; the suite had not finished.")
	s.res.Seconds = time.Since(s.res.Started).Seconds()
	s.o.Checkpoint(s.res)
}

func (s *suite) setup(ctx context.Context) error {
	c := s.c
	need := max(s.o.Endpoints, s.o.BigEndpoints)
	for _, z := range s.o.Wide {
		need = max(need, z.Endpoints)
	}
	for i := range need {
		p, err := c.AddPod(ctx, fmt.Sprintf("web-%d", i+1))
		if err != nil {
			return err
		}
		s.pods = append(s.pods, p)
	}
	for i := range s.alt {
		p, err := c.AddPod(ctx, fmt.Sprintf("alt-%d", i+1))
		if err != nil {
			return err
		}
		s.alt[i] = p
	}
	var err error
	if s.client, err = c.AddPod(ctx, "client"); err != nil {
		return err
	}
	if s.pool, err = newNSPool(s.client.NS, probePoolSize); err != nil {
		return err
	}
	if s.a, err = newAPI(c, s.pods); err != nil {
		return err
	}
	if err := s.a.ensureNamespace(ctx); err != nil {
		return err
	}
	if _, err := ensureEmptyRuleset(ctx, c); err != nil {
		return fmt.Errorf("node ruleset before the first run: %w", err)
	}
	return nil
}

// resize makes the API hold services [0, max(have, z.N)) with z.Endpoints endpoints each:
// the services already there are reshaped when their endpoint count differs, the rest
// created.
func (s *suite) resize(ctx context.Context, have int, z Size) error {
	if have > 0 && s.eps != z.Endpoints {
		s.logf("bench: reshaping %d services from %d to %d endpoints", have, s.eps, z.Endpoints)
		t0 := time.Now()
		if err := s.a.reshape(ctx, 0, have, z.Endpoints); err != nil {
			return fmt.Errorf("reshape: %w", err)
		}
		s.res.Populate = append(s.res.Populate, Pop{N: have, Endpoints: z.Endpoints, Objects: have, Seconds: time.Since(t0).Seconds()})
	}
	s.eps = z.Endpoints
	return s.grow(ctx, have, z.N, z.Endpoints)
}

// grow creates services [from, to).
func (s *suite) grow(ctx context.Context, from, to, eps int) error {
	if to <= from {
		return nil
	}
	t0 := time.Now()
	if err := s.a.populate(ctx, from, to, eps); err != nil {
		return fmt.Errorf("populate %d..%d: %w", from, to, err)
	}
	d := time.Since(t0)
	s.res.Populate = append(s.res.Populate, Pop{N: to, Endpoints: eps, Objects: 2 * (to - from), Seconds: d.Seconds()})
	s.logf("bench: %d services in the API (+%d services and slices in %v, %.0f objects/s)", to, to-from,
		d.Round(time.Millisecond), float64(2*(to-from))/d.Seconds())
	return nil
}
