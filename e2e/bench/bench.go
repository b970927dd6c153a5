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
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
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

// Results is what the suite writes to results.json.
type Results struct {
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Host     Host      `json:"host"`
	Options  Opts      `json:"options"`
	Populate []Pop     `json:"populate"`
	Runs     []*Run    `json:"runs"`
	Ratios   []Ratio   `json:"ratios"`
	Notes    []string  `json:"notes"`
}

// Host describes the machine.
type Host struct {
	CPUs      int    `json:"cpus"`
	Kernel    string `json:"kernel"`
	Commit    string `json:"nftproxy_commit"`
	Nftproxy  string `json:"nftproxy"`   // `nftproxy --version`
	KubeProxy string `json:"kube_proxy"` // `kube-proxy --version`
	Etcd      string `json:"etcd"`       // `etcd --version`'s version
	Load      string `json:"load,omitempty"`
	Nft       string `json:"nft"`
	Iptables  string `json:"iptables"`
}

// Opts is the JSON form of Options.
type Opts struct {
	Sizes        []int    `json:"sizes"`
	Endpoints    int      `json:"endpoints_per_service"`
	Wide         []Size   `json:"wide_sizes,omitempty"`
	SmallSize    int      `json:"small_size"`
	BigSize      int      `json:"big_size"`
	BigEndpoints int      `json:"big_endpoints_per_service"`
	ChurnSize    int      `json:"churn_size"`
	ChurnRate    int      `json:"churn_rate_per_s"`
	ChurnSeconds float64  `json:"churn_seconds"`
	Repeats      int      `json:"one_change_repeats"`
	BoundSeconds float64  `json:"bound_seconds"`
	ColdStarts   int      `json:"cold_starts,omitempty"`
	Expose       int      `json:"expose_repeats,omitempty"`
	ExposeGapS   float64  `json:"expose_gap_seconds,omitempty"`
	Scenarios    []string `json:"scenarios,omitempty"`

	Burst *BurstOpts `json:"burst,omitempty"`
}

// Pop records how long writing the API objects took.
type Pop struct {
	N         int     `json:"n"`
	Endpoints int     `json:"endpoints_per_service"`
	Objects   int     `json:"objects_written"`
	Seconds   float64 `json:"seconds"`
}

// Run is one proxy at one size.
type Run struct {
	Proxy          string     `json:"proxy"`
	N              int        `json:"n"`
	Endpoints      int        `json:"endpoints_per_service"`
	ColdStart      *ColdStart `json:"cold_start,omitempty"`
	Footprint      *Footprint `json:"footprint,omitempty"`
	AddService     *Latency   `json:"add_service,omitempty"`
	EndpointChange *Latency   `json:"endpoint_change,omitempty"` // E endpoints → 1: the count changes
	// EndpointReplaced: one of E endpoints replaced by another pod, the count kept
	EndpointReplaced *Latency  `json:"endpoint_replaced,omitempty"`
	Expose           *Latency  `json:"expose,omitempty"` // new Service, then its EndpointSlice
	Burst            *Burst    `json:"burst,omitempty"`
	Churn            *Churn    `json:"churn,omitempty"`
	Memory           *Memory   `json:"memory,omitempty"`
	DataPath         *DataPath `json:"data_path,omitempty"`
	Residue          string    `json:"cleanup_residue,omitempty"` // what --cleanup left (flushed by the suite)
	CleanupSeconds   float64   `json:"cleanup_seconds"`
	Skipped          string    `json:"skipped,omitempty"`
	Errors           []string  `json:"errors,omitempty"`
}

// ColdStart times a proxy started with N services in the API; seconds from the start of
// the process. Zero values were not reached (see TimedOut).
type ColdStart struct {
	InformersSynced float64 `json:"informers_synced_s"` // log line
	FirstSync       float64 `json:"first_sync_s"`       // kubeproxy_sync_proxy_rules_last_timestamp_seconds
	AllProgrammed   float64 `json:"all_programmed_s"`   // every sampled ClusterIP answered
	Sampled         int     `json:"sampled"`
	Answered        int     `json:"answered"`
	TimedOut        bool    `json:"timed_out"`
	BoundSeconds    float64 `json:"bound_s"`
	// SettledAfter: seconds the suite waited, before starting the proxy, for the API
	// server and etcd to finish the work its writes left them (see settle)
	SettledAfter float64 `json:"settled_after_s"`
	// Informers says how the proxy's informers filled their caches (watch-list or
	// list), from the API server's metrics; nil if they could not be read.
	Informers *InformerPath `json:"informers,omitempty"`
	// Runs are the cold starts made (Options.ColdStarts), when more than one: the
	// figures above are then their medians; the counts and SettledAfter are the first
	// run's (the one the size's other measurements followed).
	Runs []ColdRun `json:"runs,omitempty"`
}

// ColdRun is one cold start's figures (seconds).
type ColdRun struct {
	InformersSynced float64 `json:"informers_synced_s"`
	FirstSync       float64 `json:"first_sync_s"`
	AllProgrammed   float64 `json:"all_programmed_s"`
	InformerPath    string  `json:"informer_path,omitempty"` // InformerPath.Path
}

// coldRepeatLimit: a proxy whose cold start takes longer is not started again at that
// size (kube-proxy's nftables mode takes minutes at 30k services).
const coldRepeatLimit = time.Minute

// median makes cs's figures the medians of runs (cs's own run among them).
func (cs *ColdStart) median(runs []ColdRun) {
	cs.Runs = runs
	var inf, first, all []float64
	for _, r := range runs {
		inf, first, all = append(inf, r.InformersSynced), append(first, r.FirstSync), append(all, r.AllProgrammed)
	}
	cs.InformersSynced, cs.FirstSync, cs.AllProgrammed = pct(inf, 0.5), pct(first, 0.5), pct(all, 0.5)
}

// Latency summarizes repeated one-change measurements (milliseconds).
type Latency struct {
	Samples   int     `json:"samples"`
	Failed    int     `json:"failed"`
	P50       float64 `json:"p50_ms"` // API write → first answer seeing the change
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
	KernelMS  float64 `json:"kernel_p50_ms"` // the proxy's kernel metric (kube-proxy: whole sync), per sync
	KernelP99 float64 `json:"kernel_p99_ms,omitempty"`
	SyncMS    float64 `json:"sync_p50_ms"` // kubeproxy_sync_proxy_rules_duration_seconds, per sync
	// expose only: syncs per change (p50) and the Service → EndpointSlice write gap (p50)
	Syncs      float64 `json:"syncs_p50,omitempty"`
	WriteGapMS float64 `json:"write_gap_p50_ms,omitempty"`
	// expose only: the EndpointSlice write's own latency (p50), and from its return to
	// the first connection (p50 / p99): the part of the figure after the API server
	// took both objects
	SliceWriteMS    float64 `json:"slice_write_p50_ms,omitempty"`
	AfterSliceP50MS float64 `json:"after_slice_p50_ms,omitempty"`
	AfterSliceP99MS float64 `json:"after_slice_p99_ms,omitempty"`
}

// Churn is endpoint churn at one N.
type Churn struct {
	Rate           int     `json:"rate_per_s"`
	Seconds        float64 `json:"seconds"`
	Written        int     `json:"written"`
	WriteErrors    int     `json:"write_errors"`
	ProgP50        float64 `json:"programming_p50_s"` // kubeproxy_network_programming_duration_seconds delta
	ProgP99        float64 `json:"programming_p99_s"`
	ProgCount      float64 `json:"programming_observations"`
	PacketSamples  int     `json:"packet_samples"`
	PacketFailed   int     `json:"packet_failed"`
	PacketP50      float64 `json:"packet_p50_ms"`
	PacketP99      float64 `json:"packet_p99_ms"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	CPUPercent     float64 `json:"cpu_percent"` // of one core over the churn window
	PeakRSSMiB     float64 `json:"peak_rss_mib"`
	RSSMiB         float64 `json:"rss_mib"`
	SyncsInWindow  float64 `json:"syncs"`
	SyncP50Seconds float64 `json:"sync_p50_s"`
}

// Memory is the proxy's resident memory read before it is stopped: after the cold start,
// the one-change tests and (at the churn N) the churn.
type Memory struct {
	PeakRSSMiB float64 `json:"peak_rss_mib"` // VmHWM: the high-water mark since the process started
	RSSMiB     float64 `json:"rss_mib"`      // VmRSS
	// The Go runtime's view at the same moment (the go_memstats_* metrics both proxies
	// export), to say where the resident memory is: the live objects, the heap spans
	// they occupy, the free heap not yet returned to the OS, and the rest (stacks,
	// runtime metadata, the binary's pages).
	HeapAllocMiB    float64 `json:"heap_alloc_mib,omitempty"`    // go_memstats_heap_alloc_bytes
	HeapInuseMiB    float64 `json:"heap_inuse_mib,omitempty"`    // go_memstats_heap_inuse_bytes
	HeapRetainedMiB float64 `json:"heap_retained_mib,omitempty"` // heap_idle - heap_released
	NextGCMiB       float64 `json:"next_gc_mib,omitempty"`       // go_memstats_next_gc_bytes
}

// DataPath compares a ClusterIP with its only endpoint's pod IP.
type DataPath struct {
	ClusterIP Load `json:"cluster_ip"`
	PodIP     Load `json:"pod_ip"`
}

// Load is loadclient's output.
type Load struct {
	Addr        string  `json:"addr"`
	Seconds     float64 `json:"seconds"`
	Concurrency int     `json:"concurrency"`
	OK          int     `json:"ok"`
	Failed      int     `json:"failed"`
	PerSecond   float64 `json:"per_second"`
	P50Millis   float64 `json:"p50_ms"`
	P99Millis   float64 `json:"p99_ms"`
	MaxMillis   float64 `json:"max_ms"`
	FirstError  string  `json:"first_error,omitempty"`
}

// Ratio is upstream's value over nftproxy's for one metric at one N.
type Ratio struct {
	Metric    string  `json:"metric"`
	N         int     `json:"n"`
	Endpoints int     `json:"endpoints_per_service,omitempty"`
	Upstream  string  `json:"upstream"`
	Ratio     float64 `json:"ratio"` // upstream / nftproxy
	Note      string  `json:"note,omitempty"`
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

type runOpts struct{ footprint, oneChange, expose, burst, dataPath, churn bool }

// runProxy measures one proxy at the current size, then stops it and removes its rules.
// Its error is fatal for the suite (the node could not be cleaned).
func (s *suite) runProxy(ctx context.Context, p Proxy, r *Run, o runOpts) error {
	c := s.c
	n := r.N
	s.logf("bench: === %s at N=%d", p.Name, n)
	logName := fmt.Sprintf("%s-%d", p.Name, n)
	errf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		r.Errors = append(r.Errors, msg)
		s.logf("bench: %s N=%d: %s", p.Name, n, msg)
	}
	args := p.args(c)
	if s.o.HeapProfiles != "" && p.Mode == "" {
		args = append(args, "--profiling")
	}
	t0 := time.Now()
	proc, cs, err := s.startCold(ctx, p, n, logName, args)
	if err != nil {
		return err
	}
	defer func() {
		if proc.Running() {
			proc.Stop()
		}
	}()
	r.ColdStart = cs
	if cs.TimedOut || !proc.Running() {
		s.failed[p.Name] = true
		if !proc.Running() {
			errf("proxy exited; log tail:\n%s", proc.Tail(20))
		}
	} else {
		if o.footprint {
			if fp, err := s.footprint(ctx, n); err != nil {
				errf("footprint: %v", err)
			} else {
				r.Footprint = fp
			}
		}
		if o.dataPath {
			if dp, err := s.dataPath(ctx); err != nil {
				errf("data path: %v", err)
			} else {
				r.DataPath = dp
			}
		}
		if o.oneChange {
			r.AddService, r.EndpointChange, r.EndpointReplaced = s.oneChange(ctx, p, n, errf)
		}
		if o.expose {
			r.Expose = s.expose(ctx, p, n, errf)
		}
		if o.burst {
			r.Burst = s.bursts(ctx, p, proc, n, errf)
		}
		if o.churn {
			if ch, err := s.churn(ctx, p, proc, n); err != nil {
				errf("churn: %v", err)
			} else {
				r.Churn = ch
			}
		}
		if !proc.Running() {
			errf("proxy exited during the measurements; log tail:\n%s", proc.Tail(20))
		} else if hwm, rss, err := memKB(proc.PID()); err != nil {
			errf("memory: %v", err)
		} else {
			r.Memory = &Memory{PeakRSSMiB: float64(hwm) / 1024, RSSMiB: float64(rss) / 1024}
			if m, err := s.scrape(ctx); err == nil {
				r.Memory.goRuntime(m)
			}
		}
		if s.o.HeapProfiles != "" && p.Mode == "" && proc.Running() {
			if err := s.saveHeapProfile(ctx, filepath.Join(s.o.HeapProfiles, fmt.Sprintf("heap-%s-%d.pb.gz", p.Name, n))); err != nil {
				errf("heap profile: %v", err)
			}
		}
	}
	s.logf("bench: %s N=%d measured in %v", p.Name, n, time.Since(t0).Round(time.Second))
	proc.Stop()
	tc := time.Now()
	residue, err := s.clean(ctx, p, n, errf)
	r.CleanupSeconds, r.Residue = time.Since(tc).Seconds(), residue
	if err != nil || cs.TimedOut || cs.AllProgrammed > coldRepeatLimit.Seconds() {
		return err
	}
	return s.moreColdStarts(ctx, p, r, args, logName, errf)
}

// moreColdStarts makes the proxy's further cold starts at this size (Options.ColdStarts
// in all, each from an empty ruleset, the proxy stopped and cleaned up after), and makes
// r's cold start figures the medians of all of them.
func (s *suite) moreColdStarts(ctx context.Context, p Proxy, r *Run, args []string, logName string, errf func(string, ...any)) error {
	cs, n := r.ColdStart, r.N
	runs := []ColdRun{{cs.InformersSynced, cs.FirstSync, cs.AllProgrammed, cs.Informers.path()}}
	for i := 2; i <= s.o.ColdStarts; i++ {
		proc, more, err := s.startCold(ctx, p, n, fmt.Sprintf("%s-cold%d", logName, i), args)
		if err != nil {
			return err
		}
		proc.Stop()
		if _, err := s.clean(ctx, p, n, errf); err != nil {
			return err
		}
		if more.TimedOut {
			errf("cold start %d timed out", i)
			break
		}
		runs = append(runs, ColdRun{more.InformersSynced, more.FirstSync, more.AllProgrammed, more.Informers.path()})
	}
	if len(runs) > 1 {
		cs.median(runs)
		s.logf("bench: %s N=%d cold start, median of %d: informers %.2fs, first sync %.2fs, all sampled answered %.2fs",
			p.Name, n, len(cs.Runs), cs.InformersSynced, cs.FirstSync, cs.AllProgrammed)
	}
	return nil
}

// startCold starts the proxy once the control plane is idle, measures its cold start
// and logs it; the process is left running.
func (s *suite) startCold(ctx context.Context, p Proxy, n int, logName string, args []string) (*cluster.Process, *ColdStart, error) {
	before, lerr := s.apiserverListing(ctx) // before the idle wait: the scrape costs the API server CPU
	settled := s.controlPlaneIdle(ctx)
	t0 := time.Now()
	proc, err := s.c.StartProcess(s.c.NodeNS, logName, args...)
	if err != nil {
		return nil, nil, err
	}
	cs := s.coldStart(ctx, p, proc, n, t0)
	cs.SettledAfter = settled.Seconds()
	if lerr == nil {
		var after listing
		if after, lerr = s.apiserverListing(ctx); lerr == nil {
			cs.Informers = informerPath(before, after)
		}
	}
	if lerr != nil {
		s.logf("bench: %s N=%d: informer path unknown: %v", p.Name, n, lerr)
	}
	s.logf("bench: %s N=%d cold start (%s, settled after %.1fs, informers by %s): informers %.2fs, first sync %.2fs, all sampled answered %.2fs (%d/%d)%s",
		p.Name, n, logName, cs.SettledAfter, cs.Informers.path(), cs.InformersSynced, cs.FirstSync, cs.AllProgrammed, cs.Answered, cs.Sampled, map[bool]string{true: " TIMED OUT"}[cs.TimedOut])
	return proc, cs, nil
}

// clean runs the proxy's cleanup after it stopped, checks the node's ruleset is empty
// (an error if not: the next proxy cannot be measured) and flushes conntrack.
func (s *suite) clean(ctx context.Context, p Proxy, n int, errf func(string, ...any)) (residue string, err error) {
	c := s.c
	tc := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	out, err := c.Exec(cctx, c.NodeNS, p.cleanupArgs(c)...)
	cancel()
	took := time.Since(tc).Seconds()
	if err != nil {
		errf("--cleanup: %v: %s", err, truncate(string(out), 1000))
	}
	residue, err = ensureEmptyRuleset(ctx, c)
	s.logf("bench: %s N=%d --cleanup took %.1fs; left: %q", p.Name, n, took, residue)
	if err != nil {
		return residue, fmt.Errorf("%s N=%d: %w", p.Name, n, err)
	}
	if out, err := c.Exec(ctx, c.NodeNS, "conntrack", "-F"); err != nil {
		s.logf("bench: conntrack -F: %v: %s", err, out)
	}
	return residue, nil
}

// sampleIndexes returns the service indexes probed at size n: the first, the last and evenly
// spread ones between.
func sampleIndexes(n, k int) []int {
	if k < 2 {
		k = 2
	}
	seen := map[int]bool{}
	var out []int
	for j := range k {
		i := int(math.Round(float64(j) * float64(n-1) / float64(k-1)))
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out
}

// saveHeapProfile writes nftproxy's heap profile, taken after a collection, to path.
func (s *suite) saveHeapProfile(ctx context.Context, path string) error {
	return s.saveProfile(ctx, "heap?gc=1", time.Minute, path)
}

// saveProfile writes the proxy's /debug/pprof/<what> to path.
func (s *suite) saveProfile(ctx context.Context, what string, timeout time.Duration, path string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/debug/pprof/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := s.metricsClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/debug/pprof/%s: HTTP %d", what, resp.StatusCode)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	s.logf("bench: profile in %s", path)
	return f.Close()
}

// goRuntime fills in the Go runtime's memory figures from a scrape.
func (mem *Memory) goRuntime(m metricSet) {
	mib := func(name string) float64 { v, _ := m.value(name); return v / (1 << 20) }
	mem.HeapAllocMiB = mib("go_memstats_heap_alloc_bytes")
	mem.HeapInuseMiB = mib("go_memstats_heap_inuse_bytes")
	mem.HeapRetainedMiB = mib("go_memstats_heap_idle_bytes") - mib("go_memstats_heap_released_bytes")
	mem.NextGCMiB = mib("go_memstats_next_gc_bytes")
}

// scrape reads the proxy's /metrics. nftproxy serves its per-service counters on
// /metrics/services, which nothing here reads, so a scrape of /metrics neither carries
// them nor makes nftproxy read the kernel's counter sets. The filter of nftproxy_service_
// lines is kept for builds from before that split (two series per service there:
// megabytes at 30k services); it also drops nftproxy_service_ports, which nothing here
// reads either.
func (s *suite) scrape(ctx context.Context) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.metricsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	var keep strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "nftproxy_service_") || strings.HasPrefix(line, "#") {
			continue
		}
		keep.WriteString(line)
		keep.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	m, err := parseMetrics(keep.String())
	return metricSet(m), err
}

// The cold start's probes: each sampled service gets an attempt every coldProbeInterval,
// each given coldProbeTimeout (ten in flight per service: 22 services keep 220 of the
// pool's probePoolSize workers busy). So "all programmed" is at most coldProbeInterval
// late. (Until 2026-11-28 each service had one attempt at a time, with a 200 ms timeout
// and 30 ms pauses: up to 230 ms late; then an attempt every 50 ms with a 150 ms
// timeout, which put the figures on a 50 ms grid: a 10k cold start read 0.71 s whether
// the rules landed at 0.67 or at 0.70 s.)
//
// The first sync's time is read from a metric that holds a timestamp, so how often the
// metric is scraped changes only when the loop ends, not the figure: it is scraped every
// coldScrapeInterval, and uncompressed (metricsClient). Until 2026-11-28 it was scraped
// every 20 ms, gzipped: 80 ms of nftproxy's CPU during a 10k cold start went to serving
// those scrapes, on a machine whose two cores the proxy's start keeps busy.
const (
	coldProbeInterval  = 10 * time.Millisecond
	coldProbeTimeout   = 100 * time.Millisecond
	probePoolSize      = 240
	coldScrapeInterval = 250 * time.Millisecond
)

func (s *suite) coldStart(ctx context.Context, p Proxy, proc *cluster.Process, n int, t0 time.Time) *ColdStart {
	cs := &ColdStart{BoundSeconds: s.o.Bound.Seconds()}
	ctx, cancel := context.WithTimeout(ctx, s.o.Bound)
	defer cancel()
	idx := sampleIndexes(n, s.o.Samples)
	cs.Sampled = len(idx)

	var mu sync.Mutex
	var wg sync.WaitGroup
	var last time.Time
	answered := 0
	for _, i := range idx {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// an attempt every coldProbeInterval, several in flight: until the rules are
			// there, an attempt waits for its timeout, and one attempt at a time would
			// see the rules up to a timeout late
			start, err := s.pool.waitAnswer(ctx, s.a.addr(i), func(string) bool { return true }, coldProbeInterval, coldProbeTimeout, s.o.Bound)
			if err != nil {
				return
			}
			mu.Lock()
			answered++
			if start.After(last) {
				last = start
			}
			mu.Unlock()
		}()
	}
	watch := newLogWatch(proc.Log)
	var scraped time.Time
	for ctx.Err() == nil && proc.Running() {
		if cs.InformersSynced == 0 && watch.poll(p.SyncedLog) {
			cs.InformersSynced = time.Since(t0).Seconds()
		}
		if cs.FirstSync == 0 && time.Since(scraped) >= coldScrapeInterval {
			scraped = time.Now()
			if m, err := s.scrape(ctx); err == nil {
				if v, ok := m.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds"); ok && v > 0 {
					cs.FirstSync = v - float64(t0.UnixNano())/1e9
				}
			}
		}
		mu.Lock()
		all := answered == len(idx)
		mu.Unlock()
		if all && cs.FirstSync > 0 && cs.InformersSynced > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	cs.Answered = answered
	if answered == len(idx) {
		cs.AllProgrammed = last.Sub(t0).Seconds()
	}
	cs.TimedOut = answered < len(idx) || cs.FirstSync == 0
	return cs
}

func (s *suite) footprint(ctx context.Context, n int) (*Footprint, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	out, err := s.c.Exec(lctx, s.c.NodeNS, "nft", "list", "ruleset")
	d := time.Since(t0)
	if err != nil {
		return nil, fmt.Errorf("nft list ruleset: %v: %s", err, truncate(string(out), 300))
	}
	fp, err := listJSON(ctx, s.c)
	if err != nil {
		return nil, err
	}
	fp.ListSeconds = d.Seconds()
	fp.ListBytes = len(out)
	fp.PerService = float64(fp.Chains+fp.Rules+fp.Elements) / float64(n)
	return &fp, nil
}

// settle waits until the proxy has no pending change and its last sync is behind us:
// at least minGap after the last write (both proxies' --min-sync-period is 1 s), then
// until the pending-change gauges are 0.
func (s *suite) settle(ctx context.Context, since time.Time) {
	const minGap = 1100 * time.Millisecond
	if d := time.Until(since.Add(minGap)); d > 0 {
		time.Sleep(d)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := s.scrape(ctx)
		if err == nil {
			e, _ := m.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending")
			v, _ := m.value("kubeproxy_sync_proxy_rules_service_changes_pending")
			if e == 0 && v == 0 {
				time.Sleep(200 * time.Millisecond)
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncDelta waits (bounded) for at least one sync after before and returns the mean of
// the proxy's kernel metric and of its sync duration over the syncs since.
func (s *suite) syncDelta(ctx context.Context, p Proxy, before metricSet) (kernel, sync float64, err error) {
	deadline := time.Now().Add(30 * time.Second)
	hb := before.histogram(p.KernelMetric)
	sb := before.histogram("kubeproxy_sync_proxy_rules_duration_seconds")
	for {
		m, err := s.scrape(ctx)
		if err == nil {
			hk := m.histogram(p.KernelMetric).sub(hb)
			hs := m.histogram("kubeproxy_sync_proxy_rules_duration_seconds").sub(sb)
			if hk.Count > 0 && hs.Count > 0 {
				return hk.Sum / hk.Count, hs.Sum / hs.Count, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("no sync recorded within 30s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// oneChangeBudget bounds the one-change repetitions of one proxy at one N (a slow proxy
// gets fewer repetitions).
const oneChangeBudget = 6 * time.Minute

// oneChange measures, Repeats times each, an added service, an EndpointSlice update that
// changes a service's endpoint count (its E endpoints replaced by one) and one that keeps
// it (one of its endpoints replaced by another pod) at size n: from the API write to the
// first connection that sees the change, with the proxy's kernel and sync metrics for
// the syncs that made it.
func (s *suite) oneChange(ctx context.Context, p Proxy, n int, errf func(string, ...any)) (add, change, replaced *Latency) {
	const (
		interval = 5 * time.Millisecond
		attemptT = 100 * time.Millisecond
		bound    = 2 * time.Minute
	)
	var addLat, addKernel, addSync, chLat, chKernel, chSync, rpLat, rpKernel, rpSync []float64
	addFailed, chFailed, rpFailed := 0, 0, 0
	// The added services' slices first (a slice without its service programs nothing),
	// so that each measured write is the Service create.
	for rep := range s.o.Repeats {
		idx := extraBase + rep
		if err := s.a.createSlice(ctx, idx, s.a.endpoints(idx, s.eps)); err != nil {
			errf("add-service %d: slice: %v", rep, err)
		}
	}
	var changed []int
	defer func() {
		// not timed: the next proxy starts from the same state
		for rep := range s.o.Repeats {
			if err := s.a.deleteService(ctx, extraBase+rep); err != nil {
				errf("delete added service: %v", err)
			}
		}
		for _, target := range changed {
			if err := s.a.setEndpoints(ctx, target, s.a.endpoints(target, s.eps)); err != nil {
				errf("endpoint-change: restore: %v", err)
			}
		}
		s.settle(ctx, time.Now())
	}()
	// pick returns an existing service that no repetition has changed yet, spread over
	// [0, n) (-1: none left).
	pick := func(rep, kind int) int {
		t := (rep*max(1, n/s.o.Repeats) + n/(2*s.o.Repeats) + kind*max(1, n/(4*s.o.Repeats))) % n
		for range n {
			if !slices.Contains(changed, t) {
				return t
			}
			t = (t + 1) % n
		}
		return -1
	}
	// measure writes one change and waits for an answer accepted by want, launching
	// burst attempts every interval; it returns whether the write was made.
	measure := func(kind string, rep int, write func() error, addr string, want func(string) bool, burst int, lat, kernel, sync *[]float64, failed *int) {
		before, err := s.scrape(ctx)
		if err != nil {
			errf("scrape: %v", err)
		}
		t0 := time.Now()
		defer s.settle(ctx, t0)
		if err := write(); err != nil {
			errf("%s %d: %v", kind, rep, err)
			*failed++
			return
		}
		seen, err := s.pool.waitAnswerBurst(ctx, addr, want, interval, burst, attemptT, bound)
		if err != nil {
			errf("%s %d: %v", kind, rep, err)
			*failed++
			return
		}
		*lat = append(*lat, ms(seen.Sub(t0)))
		if k, sy, err := s.syncDelta(ctx, p, before); err == nil {
			*kernel, *sync = append(*kernel, k*1000), append(*sync, sy*1000)
		}
	}
	s.settle(ctx, time.Now())
	began := time.Now()
	for rep := range s.o.Repeats {
		if time.Since(began) > oneChangeBudget {
			errf("one change: stopped after %d of %d repetitions (%v budget)", rep, s.o.Repeats, oneChangeBudget)
			break
		}
		idx := extraBase + rep
		measure("add-service", rep, func() error { return s.a.createService(ctx, idx) }, s.a.addr(idx),
			func(string) bool { return true }, 1, &addLat, &addKernel, &addSync, &addFailed)

		// Endpoint count changed: one existing service's slice moves to a pod that is
		// no endpoint of any bulk service (E endpoints become 1); the first answer from
		// that pod is the new behaviour. Each repetition changes another service
		// (restored at the end).
		if target := pick(rep, 0); target >= 0 {
			changed = append(changed, target)
			alt := s.alt[0]
			measure("endpoint-change", rep, func() error { return s.a.setEndpoints(ctx, target, []netip.Addr{alt.IP}) }, s.a.addr(target),
				func(pod string) bool { return pod == alt.Name }, 1, &chLat, &chKernel, &chSync, &chFailed)
		}

		// Endpoint replaced, the count kept: one of another service's E endpoints
		// becomes the other spare pod. A connection reaches it with probability 1/E,
		// so the attempts go in bursts: ceil(E/2), at most 8, every interval (at E = 10
		// about 10 ms between the rules being live and an answer from the pod, on
		// average; at E = 50 about 30 ms).
		if target := pick(rep, 1); target >= 0 {
			changed = append(changed, target)
			alt := s.alt[1]
			eps := s.a.endpoints(target, s.eps)
			eps[rep%len(eps)] = alt.IP
			measure("endpoint-replaced", rep, func() error { return s.a.setEndpoints(ctx, target, eps) }, s.a.addr(target),
				func(pod string) bool { return pod == alt.Name }, min(8, (len(eps)+1)/2), &rpLat, &rpKernel, &rpSync, &rpFailed)
		}
	}
	add = summarize(addLat, addKernel, addSync, addFailed)
	change = summarize(chLat, chKernel, chSync, chFailed)
	replaced = summarize(rpLat, rpKernel, rpSync, rpFailed)
	s.logf("bench: %s N=%d×%d add-service p50 %.1f ms p99 %.1f ms (kernel %.2f ms); endpoint-change (%d → 1) p50 %.1f ms p99 %.1f ms (kernel %.2f ms); endpoint-replaced p50 %.1f ms p99 %.1f ms (kernel p50 %.2f ms, p99 %.2f ms)",
		p.Name, n, s.eps, add.P50, add.P99, add.KernelMS, s.eps, change.P50, change.P99, change.KernelMS, replaced.P50, replaced.P99, replaced.KernelMS, replaced.KernelP99)
	return add, change, replaced
}

// exposeBase is the first index of the services the expose scenario adds.
const exposeBase = extraBase + 3000

// expose measures what a rollout plus `kubectl expose` produces: a new Service and, as
// soon as that write returns, its EndpointSlice (milliseconds apart), from the Service
// write to the first successful connection to its ClusterIP. Each pair is written
// ExposeGap after the previous one and after the proxy has no pending change, so the
// proxy starts each from the same idle state.
func (s *suite) expose(ctx context.Context, p Proxy, n int, errf func(string, ...any)) *Latency {
	const (
		interval = 5 * time.Millisecond
		attemptT = 100 * time.Millisecond
		bound    = 2 * time.Minute
	)
	var lat, kernel, syncMS, syncs, gaps, sliceWrites, afterSlice []float64
	failed := 0
	reps := s.o.ExposeRepeats
	defer func() {
		for rep := range reps {
			if err := s.a.deleteService(ctx, exposeBase+rep); err != nil {
				errf("expose: delete: %v", err)
			}
		}
		s.settle(ctx, time.Now())
	}()
	s.settle(ctx, time.Now())
	if s.o.HeapProfiles != "" && p.Mode == "" {
		// the metrics server ends a response after 60 s (httplimit.Metrics)
		secs := min(int(time.Duration(reps)*s.o.ExposeGap/time.Second)+1, 50)
		path := filepath.Join(s.o.HeapProfiles, fmt.Sprintf("cpu-expose-%s-%d.pb.gz", p.Name, n))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := s.saveProfile(ctx, fmt.Sprintf("profile?seconds=%d", secs), time.Duration(secs+60)*time.Second, path); err != nil {
				errf("expose: CPU profile: %v", err)
			}
		}()
		defer func() { <-done }()
	}
	last := time.Now()
	syncHist := "kubeproxy_sync_proxy_rules_duration_seconds"
	for rep := range reps {
		if ctx.Err() != nil {
			break
		}
		if d := time.Until(last.Add(s.o.ExposeGap)); d > 0 {
			time.Sleep(d)
		}
		s.settle(ctx, last)
		idx := exposeBase + rep
		before, err := s.scrape(ctx)
		if err != nil {
			errf("expose %d: scrape: %v", rep, err)
		}
		t0 := time.Now()
		last = t0
		if err := s.a.createService(ctx, idx); err != nil {
			errf("expose %d: service: %v", rep, err)
			failed++
			continue
		}
		t1 := time.Now()
		if err := s.a.createSlice(ctx, idx, s.a.endpoints(idx, s.eps)); err != nil {
			errf("expose %d: slice: %v", rep, err)
			failed++
			continue
		}
		t2 := time.Now()
		gaps, sliceWrites = append(gaps, ms(t1.Sub(t0))), append(sliceWrites, ms(t2.Sub(t1)))
		seen, err := s.pool.waitAnswer(ctx, s.a.addr(idx), func(string) bool { return true }, interval, attemptT, bound)
		if err != nil {
			errf("expose %d: %v", rep, err)
			failed++
			continue
		}
		lat, afterSlice = append(lat, ms(seen.Sub(t0))), append(afterSlice, ms(seen.Sub(t2)))
		// The syncs that made it reachable: those finished by now (a later one may
		// still run for a change that came in meanwhile; the bench writes none).
		if after, err := s.scrape(ctx); err == nil && before != nil {
			hs := after.histogram(syncHist).sub(before.histogram(syncHist))
			hk := after.histogram(p.KernelMetric).sub(before.histogram(p.KernelMetric))
			if hs.Count > 0 && hk.Count > 0 {
				syncs = append(syncs, hs.Count)
				syncMS = append(syncMS, 1000*hs.Sum/hs.Count)
				kernel = append(kernel, 1000*hk.Sum/hk.Count)
			}
		}
	}
	l := summarize(lat, kernel, syncMS, failed)
	if len(syncs) > 0 {
		l.Syncs = pct(syncs, 0.5)
	}
	if len(gaps) > 0 {
		l.WriteGapMS, l.SliceWriteMS = pct(gaps, 0.5), pct(sliceWrites, 0.5)
	}
	if len(afterSlice) > 0 {
		l.AfterSliceP50MS, l.AfterSliceP99MS = pct(afterSlice, 0.5), pct(afterSlice, 0.99)
	}
	s.logf("bench: %s N=%d expose (Service, then EndpointSlice %.1f ms later, its write %.1f ms): p50 %.1f ms p99 %.1f ms max %.1f ms over %d (%d failed); after the EndpointSlice write p50 %.1f ms p99 %.1f ms; %.0f syncs p50, sync %.1f ms, kernel %.2f ms",
		p.Name, n, l.WriteGapMS, l.SliceWriteMS, l.P50, l.P99, l.Max, l.Samples, l.Failed, l.AfterSliceP50MS, l.AfterSliceP99MS, l.Syncs, l.SyncMS, l.KernelMS)
	return l
}

func summarize(lat, kernel, sync []float64, failed int) *Latency {
	l := &Latency{Samples: len(lat), Failed: failed}
	if len(lat) > 0 {
		l.P50, l.P99, l.Max = pct(lat, 0.5), pct(lat, 0.99), slices.Max(lat)
	}
	if len(kernel) > 0 {
		l.KernelMS = pct(kernel, 0.5)
		l.KernelP99 = pct(kernel, 0.99)
		l.SyncMS = pct(sync, 0.5)
	}
	return l
}

// pct is the q-quantile of xs (nearest rank, linear between ranks).
func pct(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// churn writes ChurnRate endpoint changes per second for ChurnFor. Each write removes
// one endpoint of a service or adds it back (trigger-time annotation set at write
// time); once a second the write moves a probe service to another pod instead, and its
// answers are watched for that pod.
func (s *suite) churn(ctx context.Context, p Proxy, proc *cluster.Process, n int) (*Churn, error) {
	// Probe services, changed in turn once a second each: a probe's next change comes
	// len(probes) seconds later, so a slow proxy's late answer is still seen.
	probes := []int{extraBase + 1000, extraBase + 1001, extraBase + 1002, extraBase + 1003}
	alt := s.alt
	for _, pi := range probes {
		if err := s.a.createSlice(ctx, pi, []netip.Addr{alt[0].IP}); err != nil {
			return nil, err
		}
		if err := s.a.createService(ctx, pi); err != nil {
			return nil, err
		}
		defer func() { _ = s.a.deleteService(context.WithoutCancel(ctx), pi) }()
	}
	for _, pi := range probes {
		if _, err := s.pool.waitAnswer(ctx, s.a.addr(pi), func(pod string) bool { return pod == alt[0].Name }, 20*time.Millisecond, 200*time.Millisecond, 2*time.Minute); err != nil {
			return nil, fmt.Errorf("probe service: %w", err)
		}
	}
	probeState := make([]int, len(probes))
	s.settle(ctx, time.Now())
	before, err := s.scrape(ctx)
	if err != nil {
		return nil, err
	}
	cpu0, err := cpuSeconds(proc.PID())
	if err != nil {
		return nil, err
	}
	ch := &Churn{Rate: s.o.ChurnRate}
	t0 := time.Now()
	total := int(s.o.ChurnFor.Seconds() * float64(s.o.ChurnRate))
	writes := make(chan func(), 256)
	var wmu sync.Mutex
	var wwg sync.WaitGroup
	for range 16 {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for w := range writes {
				w()
			}
		}()
	}
	var pwg sync.WaitGroup
	var packet []float64
	stride := 7919 // a prime: consecutive writes hit services far apart
	rotation := map[int]int{}
	tick := time.NewTicker(time.Second / time.Duration(s.o.ChurnRate))
	for k := 0; k < total; k++ {
		<-tick.C
		if ctx.Err() != nil {
			break
		}
		if k%s.o.ChurnRate == 0 {
			j := (k / s.o.ChurnRate) % len(probes)
			probe := probes[j]
			probeState[j] ^= 1
			want := alt[probeState[j]]
			writes <- func() {
				w0 := time.Now()
				err := s.a.setEndpoints(ctx, probe, []netip.Addr{want.IP})
				wmu.Lock()
				if err != nil {
					ch.WriteErrors++
					wmu.Unlock()
					return
				}
				ch.Written++
				wmu.Unlock()
				pwg.Add(1)
				go func() {
					defer pwg.Done()
					seen, err := s.pool.waitAnswer(ctx, s.a.addr(probe), func(pod string) bool { return pod == want.Name }, 5*time.Millisecond, 100*time.Millisecond, time.Duration(len(probes))*time.Second)
					wmu.Lock()
					defer wmu.Unlock()
					if err != nil {
						ch.PacketFailed++
						return
					}
					packet = append(packet, ms(seen.Sub(w0)))
				}()
			}
			continue
		}
		i := (k * stride) % n
		rotation[i]++
		eps := s.a.endpoints(i, s.eps)
		if rotation[i]%2 == 1 {
			eps = eps[:len(eps)-1] // one endpoint removed; the next change of i adds it back
		}
		writes <- func() {
			err := s.a.setEndpoints(ctx, i, eps)
			wmu.Lock()
			if err != nil {
				ch.WriteErrors++
			} else {
				ch.Written++
			}
			wmu.Unlock()
		}
	}
	tick.Stop()
	close(writes)
	wwg.Wait()
	ch.Seconds = time.Since(t0).Seconds()
	pwg.Wait()
	s.settle(ctx, time.Now())
	cpu1, err := cpuSeconds(proc.PID())
	if err != nil {
		return nil, err
	}
	window := time.Since(t0).Seconds()
	ch.CPUSeconds = cpu1 - cpu0
	ch.CPUPercent = 100 * ch.CPUSeconds / window
	hwm, rss, err := memKB(proc.PID())
	if err != nil {
		return nil, err
	}
	ch.PeakRSSMiB, ch.RSSMiB = float64(hwm)/1024, float64(rss)/1024
	after, err := s.scrape(ctx)
	if err != nil {
		return nil, err
	}
	h := after.histogram("kubeproxy_network_programming_duration_seconds").sub(before.histogram("kubeproxy_network_programming_duration_seconds"))
	ch.ProgCount = h.Count
	ch.ProgP50, ch.ProgP99 = nanToZero(h.quantile(0.5)), nanToZero(h.quantile(0.99))
	hs := after.histogram("kubeproxy_sync_proxy_rules_duration_seconds").sub(before.histogram("kubeproxy_sync_proxy_rules_duration_seconds"))
	ch.SyncsInWindow = hs.Count
	ch.SyncP50Seconds = nanToZero(hs.quantile(0.5))
	ch.PacketSamples = len(packet)
	if len(packet) > 0 {
		ch.PacketP50, ch.PacketP99 = pct(packet, 0.5), pct(packet, 0.99)
	}
	// restore every churned service's endpoints, so the next proxy starts from the same state
	var idx []int
	for i, r := range rotation {
		if r != 0 {
			idx = append(idx, i)
		}
	}
	if err := parallel(ctx, 0, len(idx), 16, func(ctx context.Context, j int) error {
		return retry(ctx, func() error { return s.a.setEndpoints(ctx, idx[j], s.a.endpoints(idx[j], s.eps)) })
	}); err != nil {
		return ch, fmt.Errorf("restore after churn: %w", err)
	}
	s.settle(ctx, time.Now())
	s.logf("bench: %s N=%d churn: %d writes in %.1fs, programming p50 %.2fs p99 %.2fs (%v obs), packets p50 %.0f ms p99 %.0f ms (%d, %d failed), cpu %.1fs (%.0f%%), peak rss %.0f MiB",
		p.Name, n, ch.Written, ch.Seconds, ch.ProgP50, ch.ProgP99, ch.ProgCount, ch.PacketP50, ch.PacketP99, ch.PacketSamples, ch.PacketFailed, ch.CPUSeconds, ch.CPUPercent, ch.PeakRSSMiB)
	return ch, nil
}

func nanToZero(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return f
}

// dataPath runs the load client against a one-endpoint service's ClusterIP and against
// the endpoint's pod IP.
func (s *suite) dataPath(ctx context.Context) (*DataPath, error) {
	idx := extraBase + 2000
	ep := s.pods[0]
	if err := s.a.createSlice(ctx, idx, []netip.Addr{ep.IP}); err != nil {
		return nil, err
	}
	if err := s.a.createService(ctx, idx); err != nil {
		return nil, err
	}
	defer func() {
		_ = s.a.deleteService(context.WithoutCancel(ctx), idx)
		s.settle(ctx, time.Now())
	}()
	if _, err := s.pool.waitAnswer(ctx, s.a.addr(idx), func(string) bool { return true }, 20*time.Millisecond, 200*time.Millisecond, 2*time.Minute); err != nil {
		return nil, err
	}
	s.settle(ctx, time.Now())
	dp := &DataPath{}
	var err error
	if dp.ClusterIP, err = s.load(ctx, s.a.addr(idx)); err != nil {
		return nil, err
	}
	if dp.PodIP, err = s.load(ctx, netip.AddrPortFrom(ep.IP, targetPort).String()); err != nil {
		return nil, err
	}
	s.logf("bench: data path: ClusterIP %.0f conn/s (p50 %.3f ms, p99 %.3f ms), pod IP %.0f conn/s (p50 %.3f ms, p99 %.3f ms)",
		dp.ClusterIP.PerSecond, dp.ClusterIP.P50Millis, dp.ClusterIP.P99Millis, dp.PodIP.PerSecond, dp.PodIP.P50Millis, dp.PodIP.P99Millis)
	return dp, nil
}

func (s *suite) load(ctx context.Context, addr string) (Load, error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.DataPathFor+30*time.Second)
	defer cancel()
	out, err := s.c.Exec(ctx, s.client.NS, s.loadBin, "--addr", addr, "--duration", s.o.DataPathFor.String(),
		"--concurrency", strconv.Itoa(s.o.DataPathConc), "--timeout", "1s")
	if err != nil {
		return Load{}, fmt.Errorf("loadclient %s: %v: %s", addr, err, truncate(string(out), 500))
	}
	var l Load
	if err := jsonUnmarshalLast(out, &l); err != nil {
		return Load{}, fmt.Errorf("loadclient output %q: %w", truncate(string(out), 300), err)
	}
	return l, nil
}

// BuildBinaries builds nftproxy and the load client into dir and finds (or builds)
// kube-proxy with e2e/hack/build-k8s.sh. The nftproxy build is retried for a few
// minutes: the tree may be mid-change.
func BuildBinaries(ctx context.Context, dir string) (Binaries, error) {
	root := repoRoot()
	b := Binaries{Nftproxy: filepath.Join(dir, "nftproxy"), LoadClient: filepath.Join(dir, "loadclient")}
	build := func(out, pkg string) error {
		var last error
		for attempt := range 10 {
			cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", versionLDFlags(ctx, root), "-o", out, pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			o, err := cmd.CombinedOutput()
			if err == nil {
				return nil
			}
			last = fmt.Errorf("go build %s: %v: %s", pkg, err, o)
			if attempt < 9 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(30 * time.Second):
				}
			}
		}
		return last
	}
	if err := build(b.Nftproxy, "./cmd/nftproxy"); err != nil {
		return b, err
	}
	if err := build(b.LoadClient, "./e2e/bench/loadclient"); err != nil {
		return b, err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(root, "e2e", "hack", "build-k8s.sh"), "kube-proxy").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return b, fmt.Errorf("build-k8s.sh kube-proxy: %w", err)
	}
	b.KubeProxy = strings.TrimSpace(string(out))
	return b, nil
}

// versionLDFlags stamps the version and commit as `make build` does (the VERSION file's
// version, as a pre-release with the commit: v0.1.0-dev.g<commit>[.dirty]), so the
// report names the nftproxy it measured.
func versionLDFlags(ctx context.Context, root string) string {
	git := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, _ := cmd.Output()
		return strings.TrimSpace(string(out))
	}
	release := "v0.0.0"
	if b, err := os.ReadFile(filepath.Join(root, "VERSION")); err == nil {
		release = strings.TrimSpace(string(b))
	}
	v := release + "-dev.g" + git("rev-parse", "--short", "HEAD")
	if git("status", "--porcelain", "--untracked-files=no") != "" {
		v += ".dirty"
	}
	const pkg = "github.com/nftproxy/nftproxy/internal/version"
	return fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitCommit=%s", pkg, v, pkg, git("rev-parse", "HEAD"))
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func hostInfo(ctx context.Context, bins Binaries) Host {
	h := Host{CPUs: numCPU()}
	run := func(name string, args ...string) string {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = repoRoot()
		out, _ := cmd.CombinedOutput()
		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	h.Kernel = run("uname", "-r")
	h.Commit = run("git", "describe", "--always", "--dirty")
	h.KubeProxy = run(bins.KubeProxy, "--version")
	h.Nftproxy = run(bins.Nftproxy, "--version")
	h.Load = "load average at the start " + loadAvg()
	h.Nft = run("nft", "--version")
	h.Iptables = run("iptables", "--version")
	return h
}
