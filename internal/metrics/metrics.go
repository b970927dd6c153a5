// Package metrics exposes nftproxy's Prometheus metrics, under kube-proxy's metric
// names where kube-proxy has one, so existing dashboards and alerts keep working.
//
// The proxy reports events through the Recorder interface; Prometheus implements it on
// its own registry (never the global default one) and serves it with Handler.
// ServiceCounters, the kernel's per-service packet and byte counters, are served apart,
// by ServicesHandler (/metrics/services): a scrape of /metrics never reads the kernel's
// counter sets.
package metrics

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/restclient" // client-go's rest_client_* into legacyregistry
)

// Recorder receives the proxy's events. Implementations are safe for concurrent use.
type Recorder interface {
	// Changes counts changes seen from the API: endpoints EndpointSlice and services
	// Service add/update/delete events. They are pending until the next SyncStarted.
	Changes(endpoints, services int)
	// SyncStarted tells that a sync took all pending changes.
	SyncStarted()
	// SyncDone records a successful sync: full when the whole table was rewritten,
	// took for the whole sync, kernel for the netlink transaction.
	SyncDone(full bool, took, kernel time.Duration)
	// SyncFailed records a sync that failed after running for took.
	SyncFailed(full bool, took time.Duration)
	// Programmed records one network programming latency of family ("IPv4", "IPv6"):
	// from an EndpointSlice's last-change-trigger-time annotation to the end of the
	// sync that programmed the change.
	Programmed(family string, latency time.Duration)
	// NoLocalEndpoints records, after a successful sync, how many service ports of
	// family have a Local internal (internal) or external (external) traffic policy
	// and endpoints, but none on this node: that traffic is dropped.
	NoLocalEndpoints(family string, internal, external int)
	// ConntrackReconciled records one run of the stale UDP conntrack cleanup of family
	// after a sync: how long it took and how many entries it deleted.
	ConntrackReconciled(family string, took time.Duration, deleted int)
	// ServicePorts records the number of service ports in the last synced snapshot.
	ServicePorts(n int)
	// Repaired counts a repair (a rewrite of the whole table) requested because
	// another process changed nftproxy's tables, or, lost, because the kernel dropped
	// change events that may have been about them. While repairs back off, one repair
	// covers many changes.
	Repaired(lost bool)
	// ForeignChange counts one transaction of another process that changed
	// nftproxy's tables, or, lost, one loss of change events.
	ForeignChange(lost bool)
	// RepairBackoff records the current spacing of repairs while another process
	// keeps changing the tables; 0 when there is no such fight.
	RepairBackoff(d time.Duration)
	// SetAside records, after a successful sync, how many Services family's table
	// leaves out because they exceed the limits (--max-table-elements and the
	// per-Service ones).
	SetAside(family string, services int)
}

// Nop is a Recorder that records nothing.
type Nop struct{}

func (Nop) Changes(int, int)                               {}
func (Nop) SyncStarted()                                   {}
func (Nop) SyncDone(bool, time.Duration, time.Duration)    {}
func (Nop) SyncFailed(bool, time.Duration)                 {}
func (Nop) Programmed(string, time.Duration)               {}
func (Nop) NoLocalEndpoints(string, int, int)              {}
func (Nop) ConntrackReconciled(string, time.Duration, int) {}
func (Nop) ServicePorts(int)                               {}
func (Nop) Repaired(bool)                                  {}
func (Nop) ForeignChange(bool)                             {}
func (Nop) RepairBackoff(time.Duration)                    {}
func (Nop) SetAside(string, int)                           {}

// Label values of ip_family, as kube-proxy's (v1.IPFamily).
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Options configure a Prometheus recorder.
type Options struct {
	// Families are the ip_family label values each sync is recorded under. nftproxy
	// programs both families in one transaction, so a sync counts once per family,
	// as with a dual-stack kube-proxy. Default: IPv4 and IPv6.
	Families []string
	// Now is the clock for timestamps. Default: time.Now.
	Now func() time.Time
	// NoRuntimeMetrics leaves out the go_* and process_* collectors.
	NoRuntimeMetrics bool
	// ServiceCounters is where the per-service packet and byte counters
	// (nftproxy_service_packets_total, _bytes_total, nftproxy_no_endpoint_rejects_total)
	// are read from, for ServicesHandler only; nil: they are not exported.
	ServiceCounters CounterSource
	// NoServiceCounters is the operator's switch (--service-counters=false): no
	// per-service counters are exported (ServicesHandler is nil), and the kernel's
	// counters are never read.
	NoServiceCounters bool
	// ServiceCountersInterval is the least time one read of the kernel's counters
	// serves scrapes for (--service-counters-min-interval). Whatever it is, a read
	// serves scrapes for 20 times as long as it took. Default 0: only that bound.
	ServiceCountersInterval time.Duration
	// Log receives the counters' read errors (at V(2)). Default: discard.
	Log logr.Logger
	// Also is another gatherer served on the same /metrics, after this registry's
	// families: Legacy() for client-go's rest_client_* metrics as kube-proxy serves
	// them. A family this registry has is taken from this registry only.
	Also prometheus.Gatherer
}

// Prometheus is a Recorder on its own registry.
type Prometheus struct {
	reg      *prometheus.Registry
	families []string
	now      func() time.Time

	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	lastSync            *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	programming         *prometheus.HistogramVec
	endpointsPending    prometheus.Gauge
	endpointsTotal      prometheus.Counter
	servicesPending     prometheus.Gauge
	servicesTotal       prometheus.Counter
	syncFailures        *prometheus.CounterVec
	healthz             *prometheus.CounterVec
	livez               *prometheus.CounterVec
	kernelDuration      prometheus.Histogram
	servicePorts        prometheus.Gauge
	repairs             *prometheus.CounterVec
	foreignChanges      *prometheus.CounterVec
	repairBackoff       prometheus.Gauge
	noLocalEndpoints    *prometheus.GaugeVec
	conntrackDuration   *prometheus.HistogramVec
	conntrackDeleted    *prometheus.CounterVec
	setAside            *prometheus.GaugeVec
	also                prometheus.Gatherer
	log                 logr.Logger
	// services are the per-service counters, served by ServicesHandler only; nil
	// when off.
	services *ServiceCounters
}

var _ Recorder = (*Prometheus)(nil)

// syncBuckets are kube-proxy's for sync durations: 1ms doubling to about 16s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's for network programming latency: 0.25s and 0.5s,
// every second to 59s, every 5s to 115s, every 30s to 5 minutes.
func programmingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// New returns a Prometheus recorder with every metric registered.
func New(o Options) *Prometheus {
	if len(o.Families) == 0 {
		o.Families = []string{IPv4, IPv6}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	fam := []string{"ip_family"}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, fam)
	}
	p := &Prometheus{
		reg: prometheus.NewRegistry(), families: o.Families, now: o.Now, also: o.Also, log: o.Log,
		syncDuration:        hist("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds (full and partial syncs, successful or not).", syncBuckets),
		syncFullDuration:    hist("kubeproxy_sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs (the whole table rewritten).", syncBuckets),
		syncPartialDuration: hist("kubeproxy_sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs (only the difference sent).", syncBuckets),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced."}, fam),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued."}, fam),
		programming: hist("kubeproxy_network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds.", programmingBuckets()),
		endpointsPending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes."}),
		endpointsTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes."}),
		servicesPending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubeproxy_sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes."}),
		servicesTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "kubeproxy_sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes."}),
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
			Help: "Cumulative proxy nftables sync failures."}, fam),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubeproxy_proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status."}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubeproxy_proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status."}, []string{"code"}),
		kernelDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nftproxy_sync_kernel_duration_seconds",
			Help:    "Time the kernel took for a successful sync's netlink transaction (both families).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		servicePorts: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftproxy_service_ports",
			Help: "Service ports in the last synced snapshot."}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftproxy_dataplane_repairs_total",
			Help: "Rewrites of the whole table requested because another process changed it (cause foreign_change) or change events were lost (events_lost)."}, []string{"cause"}),
		foreignChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftproxy_dataplane_foreign_changes_total",
			Help: "Transactions of other processes that changed nftproxy's tables (cause foreign_change), and losses of change events (events_lost). While repairs back off, one repair covers many."}, []string{"cause"}),
		repairBackoff: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftproxy_dataplane_repair_backoff_seconds",
			Help: "Current spacing of repairs while another process keeps changing nftproxy's tables (a fight); 0 when repairs are immediate."}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy", "ip_family"}),
		conntrackDuration: hist("kubeproxy_conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", syncBuckets),
		conntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubeproxy_conntrack_reconciler_deleted_entries_total",
			Help: "Cumulative conntrack flows deleted by conntrack reconciler"}, fam),
		setAside: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nftproxy_services_set_aside",
			Help: "Services the last successful sync left out of the table because they exceed the limits (--max-table-elements, --max-endpoints-per-service-port, --max-frontends-per-service)."}, fam),
	}
	p.reg.MustRegister(p.syncDuration, p.syncFullDuration, p.syncPartialDuration, p.lastSync, p.lastQueued,
		p.programming, p.endpointsPending, p.endpointsTotal, p.servicesPending, p.servicesTotal,
		p.syncFailures, p.healthz, p.livez, p.kernelDuration, p.servicePorts, p.repairs, p.foreignChanges, p.repairBackoff,
		p.noLocalEndpoints, p.conntrackDuration, p.conntrackDeleted, p.setAside)
	// Series that exist from the start, as kube-proxy's: a counter at 0 rather than
	// absent, so rate() and alerts work before the first event.
	for _, f := range p.families {
		p.syncFailures.WithLabelValues(f)
		p.syncDuration.WithLabelValues(f)
		p.conntrackDeleted.WithLabelValues(f)
		p.setAside.WithLabelValues(f)
	}
	for _, cause := range []string{repairForeign, repairLost} {
		p.repairs.WithLabelValues(cause)
		p.foreignChanges.WithLabelValues(cause)
	}
	if o.ServiceCounters != nil && !o.NoServiceCounters {
		p.services = NewServiceCounters(o.ServiceCounters, o.ServiceCountersInterval, o.Log)
	}
	if !o.NoRuntimeMetrics {
		p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return p
}

// Registry returns the recorder's registry, for more collectors.
func (p *Prometheus) Registry() *prometheus.Registry { return p.reg }

// Handler serves the registry, and Options.Also, in Prometheus text format (and
// OpenMetrics if asked): /metrics. It has no per-service counter and never reads the
// kernel's counter sets.
func (p *Prometheus) Handler() http.Handler {
	var g prometheus.Gatherer = p.reg
	if p.also != nil {
		g = merged{p.reg, p.also, p.log}
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{Registry: p.reg})
}

// ServicesHandler serves the per-service counters (Options.ServiceCounters) alone, in
// the formats Handler serves: /metrics/services. Their series grow with the cluster
// (two per service port on every node: 60,000 at 30k service ports) and a scrape may
// read the kernel, so they are only there for whoever asks for them. A failed encoding
// counts in Handler's promhttp_metric_handler_errors_total. Nil when the counters are
// off (Options.NoServiceCounters, or no source).
func (p *Prometheus) ServicesHandler() http.Handler {
	if p.services == nil {
		return nil
	}
	return promhttp.HandlerFor(p.services, promhttp.HandlerOpts{Registry: p.reg})
}

// merged gathers own's families, then those of also that own has not: two collectors
// of one family (go_* in both registries) would otherwise fail the whole scrape. An
// error of also is logged (at V(2)), not returned: it must not fail the scrape of ours.
type merged struct {
	own, also prometheus.Gatherer
	log       logr.Logger
}

func (m merged) Gather() ([]*dto.MetricFamily, error) {
	mine, err := m.own.Gather()
	if err != nil && len(mine) == 0 {
		return nil, err
	}
	have := make(map[string]bool, len(mine))
	for _, f := range mine {
		have[f.GetName()] = true
	}
	theirs, err2 := m.also.Gather()
	if err2 != nil {
		m.log.V(2).Info("Gathering component-base's metrics", "err", err2.Error())
	}
	for _, f := range theirs {
		if !have[f.GetName()] {
			mine = append(mine, f)
		}
	}
	slices.SortFunc(mine, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return mine, err
}

// Legacy is component-base's global registry (legacyregistry) as kube-proxy serves it:
// client-go's rest_client_* metrics (request latency, sizes, results, rate limiter
// waits, retries, transport cache), registered by importing
// k8s.io/component-base/metrics/prometheus/restclient, besides the Go runtime and
// process metrics with every runtime/metrics series and the registry's own
// registered_metrics_total. Serve it with Options.Also and NoRuntimeMetrics, so that
// go_* and process_* come from one collector.
func Legacy() prometheus.Gatherer { return legacyregistry.DefaultGatherer }

func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Changes implements Recorder.
func (p *Prometheus) Changes(endpoints, services int) {
	if endpoints > 0 {
		p.endpointsTotal.Add(float64(endpoints))
		p.endpointsPending.Add(float64(endpoints))
	}
	if services > 0 {
		p.servicesTotal.Add(float64(services))
		p.servicesPending.Add(float64(services))
	}
	if endpoints > 0 || services > 0 {
		p.queued(p.now())
	}
}

func (p *Prometheus) queued(t time.Time) {
	for _, f := range p.families {
		p.lastQueued.WithLabelValues(f).Set(seconds(t))
	}
}

// SyncStarted implements Recorder.
func (p *Prometheus) SyncStarted() {
	p.endpointsPending.Set(0)
	p.servicesPending.Set(0)
}

// observe records a sync's duration; kind is "full", "partial" or "" (unknown).
func (p *Prometheus) observe(kind string, took time.Duration) {
	for _, f := range p.families {
		p.syncDuration.WithLabelValues(f).Observe(took.Seconds())
		switch kind {
		case "full":
			p.syncFullDuration.WithLabelValues(f).Observe(took.Seconds())
		case "partial":
			p.syncPartialDuration.WithLabelValues(f).Observe(took.Seconds())
		}
	}
}

func kind(full bool) string {
	if full {
		return "full"
	}
	return "partial"
}

// SyncDone implements Recorder.
func (p *Prometheus) SyncDone(full bool, took, kernel time.Duration) {
	p.observe(kind(full), took)
	p.kernelDuration.Observe(kernel.Seconds())
	p.synced(p.now())
}

func (p *Prometheus) synced(t time.Time) {
	for _, f := range p.families {
		p.lastSync.WithLabelValues(f).Set(seconds(t))
	}
}

// SyncFailed implements Recorder.
func (p *Prometheus) SyncFailed(full bool, took time.Duration) {
	p.observe(kind(full), took)
	p.failed(1)
}

func (p *Prometheus) failed(n int) {
	for _, f := range p.families {
		p.syncFailures.WithLabelValues(f).Add(float64(n))
	}
}

// Programmed implements Recorder.
func (p *Prometheus) Programmed(family string, latency time.Duration) {
	p.programming.WithLabelValues(family).Observe(latency.Seconds())
}

// Values of kubeproxy_sync_proxy_rules_no_local_endpoints_total's traffic_policy label.
const (
	policyInternal = "internal"
	policyExternal = "external"
)

// NoLocalEndpoints implements Recorder.
func (p *Prometheus) NoLocalEndpoints(family string, internal, external int) {
	p.noLocalEndpoints.WithLabelValues(policyInternal, family).Set(float64(internal))
	p.noLocalEndpoints.WithLabelValues(policyExternal, family).Set(float64(external))
}

// ConntrackReconciled implements Recorder.
func (p *Prometheus) ConntrackReconciled(family string, took time.Duration, deleted int) {
	p.conntrackDuration.WithLabelValues(family).Observe(took.Seconds())
	if deleted > 0 {
		p.conntrackDeleted.WithLabelValues(family).Add(float64(deleted))
	}
}

// ServicePorts implements Recorder.
func (p *Prometheus) ServicePorts(n int) { p.servicePorts.Set(float64(n)) }

// Values of nftproxy_dataplane_repairs_total's cause label.
const (
	repairForeign = "foreign_change"
	repairLost    = "events_lost"
)

func cause(lost bool) string {
	if lost {
		return repairLost
	}
	return repairForeign
}

// Repaired implements Recorder.
func (p *Prometheus) Repaired(lost bool) { p.repairs.WithLabelValues(cause(lost)).Inc() }

// ForeignChange implements Recorder.
func (p *Prometheus) ForeignChange(lost bool) { p.foreignChanges.WithLabelValues(cause(lost)).Inc() }

// RepairBackoff implements Recorder.
func (p *Prometheus) RepairBackoff(d time.Duration) { p.repairBackoff.Set(d.Seconds()) }

// Probe counts one answer of the health server: path "/healthz" or "/livez".
func (p *Prometheus) Probe(path string, code int) {
	switch path {
	case "/healthz":
		p.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
	case "/livez":
		p.livez.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// SetAside implements Recorder.
func (p *Prometheus) SetAside(family string, services int) {
	p.setAside.WithLabelValues(family).Set(float64(services))
}
