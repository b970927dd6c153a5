// Package serve runs nftproxy's HTTP servers: health (/healthz, /livez) from the
// controller's sync status and this node's Node, and whatever handler it is given for
// metrics (see internal/metrics).
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
	"github.com/nftproxy/nftproxy/internal/status"
)

// StatusFunc returns the controller's current status.
type StatusFunc func() status.Sync

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is about to
// delete; like kube-proxy, /healthz then fails so load balancers drain the node.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Healthy applies kube-proxy's rule (pkg/proxy/healthcheck/proxy_health.go, Health, with
// healthTimeout = 2 × --sync-period as cmd/kube-proxy/app/server.go sets it): unhealthy
// once a change has waited twice the sync period or longer without being programmed.
// Time without changes is not staleness: with nothing queued the proxy is healthy
// however long ago the last change arrived, e.g. while the API server is unreachable
// and the programmed rules are still the latest state the proxy knows.
func Healthy(st status.Sync, syncPeriod time.Duration, now time.Time) bool {
	return st.OldestPending.IsZero() || now.Sub(st.OldestPending) < 2*syncPeriod
}

// NodeEligible tells whether the node should receive traffic: it is known, not being
// deleted and not tainted for deletion by the cluster autoscaler.
func NodeEligible(n *v1.Node) bool {
	if n == nil || n.DeletionTimestamp != nil {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// ProbeRecorder counts health answers (kubeproxy_proxy_healthz_total and
// kubeproxy_proxy_livez_total); *metrics.Prometheus is one.
type ProbeRecorder interface {
	Probe(path string, code int)
}

// StartupGrace is how long /livez answers OK while nftproxy has not synced yet (the API
// server unreachable, caches not filled). Two minutes covers an API server restart or a
// control-plane upgrade, when restarting nftproxy would only add the kubelet's
// crash-loop backoff to the wait; a wrong API address or missing credentials still show
// as a restarting pod (about 2.5 min with the DaemonSet's probe: 3 failures 10 s apart).
// The process itself never gives up waiting.
const StartupGrace = 2 * time.Minute

// Health answers /healthz and /livez with kube-proxy's semantics:
//
//   - /livez fails (503) when a change has been queued for 2× the sync period or
//     longer without being programmed;
//   - /healthz fails in that case too, and also when this node is not eligible for
//     traffic (see NodeEligible), so that load balancers stop sending it traffic.
//
// Before the first sync /healthz fails (the node's rules are not known to be right) and
// /livez answers OK until StartupGrace after Started, then fails so that the kubelet
// restarts the pod.
type Health struct {
	Status     StatusFunc
	SyncPeriod time.Duration
	// Started is when the process started; StartupGrace bounds the wait for the first
	// sync as /livez sees it (zero: unbounded).
	Started      time.Time
	StartupGrace time.Duration
	// Node returns this node's Node object, nil while it is unknown: the controller's
	// (controller.Proxy.Node; one Node informer in the process). When Node itself is
	// nil the node is not checked.
	Node func() *v1.Node
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Probes, if set, counts the answers.
	Probes ProbeRecorder
}

// Report is the JSON body of both endpoints; its first four fields and Status are
// kube-proxy's.
type Report struct {
	// LastUpdated is the current time when healthy (as kube-proxy reports), else the
	// end of the last successful sync.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is only set by /healthz.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	Healthy      bool  `json:"healthy"`
	// nftproxy's additions.
	LastSync      time.Time  `json:"lastSync"`
	OldestPending *time.Time `json:"oldestPending,omitempty"`
	Syncs         int        `json:"syncs"`
	Failures      int        `json:"failures"`
	LastError     string     `json:"lastError,omitempty"`
	// Starting: no sync yet (waiting for the API server).
	Starting bool `json:"starting,omitempty"`
	// Status is kube-proxy's per-family report ("IPv4", "IPv6": nftproxy programs both
	// in one transaction, so both carry the same values): lastUpdated is the end of the
	// last successful sync, healthy the staleness rule alone (without the node). Empty
	// before the first sync, as kube-proxy's.
	Status map[v1.IPFamily]ProxierHealth `json:"status,omitempty"`
}

// ProxierHealth is one family's entry of Report.Status (kube-proxy's ProxierHealth).
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Check computes the report of /healthz (withNode) or /livez.
func (h *Health) Check(withNode bool) Report {
	now := time.Now()
	if h.Now != nil {
		now = h.Now()
	}
	st := h.Status()
	r := Report{
		CurrentTime: now,
		Healthy:     Healthy(st, h.SyncPeriod, now),
		LastSync:    st.LastSync,
		Syncs:       st.Syncs,
		Failures:    st.Failures,
		LastError:   st.LastError,
		LastUpdated: st.LastSync,
	}
	if !st.OldestPending.IsZero() {
		p := st.OldestPending
		r.OldestPending = &p
	}
	if !st.LastSync.IsZero() {
		r.Status = map[v1.IPFamily]ProxierHealth{
			v1.IPv4Protocol: {LastUpdated: st.LastSync, Healthy: r.Healthy},
			v1.IPv6Protocol: {LastUpdated: st.LastSync, Healthy: r.Healthy},
		}
	}
	if st.LastSync.IsZero() {
		r.Starting = true
		if withNode {
			r.Healthy = false // not ready: nothing programmed yet
		} else {
			r.Healthy = h.StartupGrace <= 0 || now.Sub(h.Started) < h.StartupGrace
		}
	}
	if withNode {
		eligible := h.Node == nil || NodeEligible(h.Node())
		r.NodeEligible = &eligible
		r.Healthy = r.Healthy && eligible
	}
	if r.Healthy {
		r.LastUpdated = now
	}
	return r
}

// Handler serves /healthz and /livez.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", h.endpoint("/healthz", true))
	mux.Handle("/livez", h.endpoint("/livez", false))
	return mux
}

func (h *Health) endpoint(path string, withNode bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r := h.Check(withNode)
		code := http.StatusOK
		if !r.Healthy {
			code = http.StatusServiceUnavailable
		}
		if h.Probes != nil {
			h.Probes.Probe(path, code)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(r)
	})
}

// Start serves h on addr until ctx ends, within limits (timeouts, header size, open
// connections: httplimit.Health or httplimit.Metrics); an empty addr disables the server.
func Start(ctx context.Context, log logr.Logger, name, addr string, h http.Handler, limits httplimit.Limits) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s server on %s: %w", name, addr, err)
	}
	srv := httplimit.Server(h, limits)
	pool := httplimit.NewPool(limits)
	pool.SetLog(log, name)
	ln = pool.Listener(ln)
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Server stopped", "server", name)
		}
	}()
	log.Info("Serving", "server", name, "address", ln.Addr().String())
	return nil
}

// MetricsMux serves what kube-proxy's metrics server does with its defaults (no
// /flagz, no profiling): see MetricsPages.
func MetricsMux(metrics http.Handler, config any) http.Handler {
	return MetricsPages{Metrics: metrics, Config: config}.Handler()
}

// ConfigzKey is the key /configz serves the configuration under, kube-proxy's
// (KubeProxyConfiguration's API group).
const ConfigzKey = "kubeproxy.config.k8s.io"

// MetricsPages is what the metrics server (--metrics-bind-address) serves, as
// kube-proxy's:
//
//   - /metrics: Metrics;
//   - /metrics/services: Services, nftproxy's per-service counters (not kube-proxy's);
//     without it (--service-counters=false) 404, with a body that says why;
//   - /proxyMode: "nftables";
//   - /healthz: "ok" (the server is up);
//   - /configz: Config as JSON, under ConfigzKey;
//   - /flagz: every flag with its value, one "name: value" line each (when Flags is
//     set);
//   - /statusz: start time, uptime, Go and binary versions and the served paths;
//   - /debug/pprof/…: Go's profiles, only with Profiling (--profiling).
//
// /flagz and /statusz are text pages in kube-proxy's format (its header and lines;
// upstream picks the separator at random to discourage parsing, here it is ": "), for
// people: they carry no compatibility promise, /configz is the machine-readable one.
type MetricsPages struct {
	Metrics http.Handler
	// Services serves the per-service counters (metrics.Prometheus.ServicesHandler);
	// nil: they are off, and /metrics/services answers 404.
	Services http.Handler
	Config   any
	// Flags returns the command line's flags and their values; nil: no /flagz.
	Flags func() map[string]string
	// Started is when the process started, Version its binary version (/statusz).
	Started time.Time
	Version string
	// Profiling serves net/http/pprof under /debug/pprof/.
	Profiling bool
	// Now is the clock of /statusz's uptime; default time.Now.
	Now func() time.Time
}

// ServicesPath is where the metrics server serves the per-service counters
// (MetricsPages.Services), apart from /metrics.
const ServicesPath = "/metrics/services"

// component is the name in the /flagz and /statusz headers.
const component = "nftproxy"

const zpageWarning = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only."

// Handler returns the mux of every page.
func (m MetricsPages) Handler() http.Handler {
	mux := http.NewServeMux()
	var paths []string
	handle := func(path string, h http.Handler) {
		mux.Handle(path, h)
		paths = append(paths, strings.TrimSuffix(path, "/"))
	}
	handle("/metrics", m.Metrics)
	if m.Services != nil {
		handle(ServicesPath, m.Services)
	} else {
		// not listed in /statusz: nothing is served there
		mux.HandleFunc(ServicesPath, func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "per-service counters are off (--service-counters=false)", http.StatusNotFound)
		})
	}
	text := func(body func() string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			_, _ = fmt.Fprint(w, body())
		}
	}
	handle("/proxyMode", text(func() string { return "nftables" }))
	handle("/healthz", text(func() string { return "ok" }))
	handle("/configz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_ = json.NewEncoder(w).Encode(map[string]any{ConfigzKey: m.Config})
	}))
	if m.Flags != nil {
		handle("/flagz", text(m.flagz))
	}
	if m.Profiling {
		handle("/debug/pprof/", http.HandlerFunc(pprof.Index))
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.Handle("/debug/pprof/profile", boundedSeconds(pprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.Handle("/debug/pprof/trace", boundedSeconds(pprof.Trace))
		mux.Handle("/debug/pprof", http.RedirectHandler("/debug/pprof/", http.StatusFound))
	}
	handle("/statusz", text(func() string { return m.statusz(paths) }))
	slices.Sort(paths)
	return mux
}

// MaxProfileSeconds bounds the ?seconds= of /debug/pprof/profile and /trace: Go
// extends the connection's write deadline by the profile's length, so without a bound
// one request could hold a connection of the metrics server for as long as it asks.
const MaxProfileSeconds = 60

func boundedSeconds(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.FormValue("seconds"); v != "" {
			if sec, err := strconv.ParseFloat(v, 64); err != nil || !(sec > 0 && sec <= MaxProfileSeconds) {
				http.Error(w, fmt.Sprintf("seconds=%q: want a duration in (0, %d]", v, MaxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	})
}

func (m MetricsPages) flagz() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s flagz\n%s\n\n", component, zpageWarning)
	flags := m.Flags()
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		fmt.Fprintf(&b, "%s: %s\n", name, flags[name])
	}
	return b.String()
}

func (m MetricsPages) statusz(paths []string) string {
	now := time.Now()
	if m.Now != nil {
		now = m.Now()
	}
	up := int64(now.Sub(m.Started).Seconds())
	return fmt.Sprintf("\n%s statusz\n%s\n\nStarted: %s\nUp: %d hr %02d min %02d sec\nGo version: %s\nBinary version: %s\nPaths: %s\n",
		component, zpageWarning, m.Started.Format(time.UnixDate), up/3600, (up/60)%60, up%60,
		runtime.Version(), m.Version, strings.Join(paths, " "))
}
