package bench

import "time"

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
