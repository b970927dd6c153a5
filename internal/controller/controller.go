// Package controller is the running proxy: on every change internal/source reports
// (batched by the sync runner) it takes the changes, builds and compiles the snapshot
// through internal/pipeline and hands the rulesets to the kernel applier; it isolates
// the service ports the kernel refuses, repairs the table on the monitor's reports and
// cleans conntrack after each sync.
package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/healthcheck"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/runner"
	"github.com/nftproxy/nftproxy/internal/source"
	"github.com/nftproxy/nftproxy/internal/status"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// Config is the proxy's configuration, from kube-proxy's flags.
type Config struct {
	NodeName string
	// Pipeline is everything that shapes the rulesets: the compilers' configuration
	// and what the pipeline resolves per sync (node port addresses, service CIDRs).
	// ServiceCIDRs there are used when the API serves no ServiceCIDR objects
	// (--service-cluster-ip-range).
	Pipeline      pipeline.Config
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	// Conntrack deletes stale UDP conntrack entries after each sync, and after a repair
	// the entries that escaped NAT while the table was broken; nil: never.
	Conntrack conntrack.Deleter
	// HealthChecks serves healthCheckNodePorts; nil: none.
	HealthChecks HealthChecks
	// Metrics receives sync and change observations; nil: none.
	Metrics metrics.Recorder
	// CachesSynced, if set, is called once the informers' caches are synced, before the
	// first sync starts (on the sync loop's goroutine: the first sync waits for it).
	CachesSynced func()
	// APIServer is the API server's address, for log lines.
	APIServer string
	// UDPKeepTerminatingFlows keeps the UDP conntrack entries of an endpoint while it
	// terminates, serving or not, until it leaves its EndpointSlice
	// (--udp-keep-terminating-flows; conntrack.ServingOrTerminating).
	UDPKeepTerminatingFlows bool
}

// HealthChecks is the health-check node port server (see internal/healthcheck).
type HealthChecks interface {
	Sync(map[healthcheck.ServiceName]healthcheck.Service) error
}

// Dataplane is what the controller needs from the kernel side: *kernel.Applier (in
// tests, nft/fake's: one on an in-memory nf_tables). What was
// last applied is the Dataplane's (Applied): the controller keeps no copy.
type Dataplane interface {
	Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error)
	Resync()
	// Applied is what the last accepted transaction wrote (nil before the first).
	Applied() *kernel.Applied
}

// Proxy is the running controller.
type Proxy struct {
	cfg       Config
	log       logr.Logger
	client    kubernetes.Interface
	dataplane Dataplane
	runner    *runner.Runner
	recorder  record.EventRecorder

	src *source.Source // the informers' caches and what changed in them
	// lists is src.Lists, the full lists of a sync that builds the model anew
	lists func() ([]*v1.Service, []*discovery.EndpointSlice, error)

	pipeline *pipeline.Pipeline
	// the snapshot the kernel has and the UDP frontends its rulesets hold, for
	// conntrack cleanup
	prev      conntrack.Programmed
	healthErr string                 // last health-check server error, logged once
	reported  map[model.Problem]bool // problems already logged, so each is logged once

	mu           sync.Mutex
	status       status.Sync // OldestPending is the source's, read in Status
	repairReason string      // a full rewrite was requested (RequestRepair); "" if not

	lastFull time.Time // end of the last sync that rewrote the whole table (sync goroutine only)
	// the reason of a repair whose sync has not succeeded yet: the sync that does
	// succeeds also deletes the conntrack entries that escaped NAT while the table was
	// broken (sync goroutine only)
	repairing string
	// the parts the kernel refused (see isolate.go); what it last accepted is the
	// dataplane's (Dataplane.Applied)
	quarantine map[quarantineKey]*nft.Part

	synced     chan struct{} // closed after the first successful sync
	syncedOnce sync.Once
	// "First sync started" was logged (sync goroutine only)
	firstSyncStarted bool
	// the kernel was asked whether it has flowtables (fastpath.go; sync goroutine only)
	fastPathProbed bool
}

// New creates a Proxy; Run starts it.
func New(client kubernetes.Interface, dp Dataplane, cfg Config, log logr.Logger) *Proxy {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Nop{}
	}
	p := &Proxy{
		cfg: cfg, log: log, client: client, dataplane: dp,
		pipeline:   pipeline.New(),
		reported:   map[model.Problem]bool{},
		quarantine: map[quarantineKey]*nft.Part{},
		synced:     make(chan struct{}),
	}
	p.runner = runner.New(p.sync, cfg.MinSyncPeriod, cfg.SyncPeriod, max(cfg.MinSyncPeriod, time.Second), nil)
	p.runner.OnPanic(func(v any) { log.Error(fmt.Errorf("%v", v), "Sync panicked; will retry") })
	p.runner.MeasureCPU(runner.ProcessCPU)

	p.src = source.New(client, source.Config{NodeName: cfg.NodeName, ServiceCIDRs: cfg.Pipeline.ServiceCIDRs, APIServer: cfg.APIServer,
		Changed: p.changed}, log)
	p.lists = p.src.Lists
	return p
}

// changed counts a change from the API (of an object of kind k; the source tracks it)
// and asks for a sync.
func (p *Proxy) changed(k source.Kind) {
	switch k {
	case source.Services:
		p.cfg.Metrics.Changes(0, 1)
	case source.EndpointSlices:
		p.cfg.Metrics.Changes(1, 0)
	}
	p.runner.Request()
}

// Synced is closed once the first sync has programmed the kernel.
func (p *Proxy) Synced() <-chan struct{} { return p.synced }

func (p *Proxy) hasSynced() bool {
	select {
	case <-p.synced:
		return true
	default:
		return false
	}
}

// Status returns a copy of the sync state.
func (p *Proxy) Status() status.Sync {
	p.mu.Lock()
	st := p.status
	p.mu.Unlock()
	st.OldestPending = p.src.Oldest()
	return st
}

// Run starts the informers, waits for their caches (as long as it takes: an unreachable
// API server is logged, never fatal) and syncs until ctx ends. The rules stay in the
// kernel when it returns: a restarted proxy takes over without a gap.
func (p *Proxy) Run(ctx context.Context) error {
	// The correlator's caches (aggregation and spam filtering of repeated events) hold
	// up to LRUCacheSize keys each, 4096 by default: a few MiB that fill up slowly with
	// events about objects that come and go, and read as growth in a churn soak. A node
	// proxy reports little (bad input, refused rules), so a small cache correlates as well.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: eventCacheSize}))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	p.recorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "nftproxy", Host: p.cfg.NodeName})

	ctx, stop := context.WithCancel(ctx) // so that an error return stops the informers
	shutdown := p.src.Start(ctx)
	defer func() {
		stop()
		shutdown()
	}()
	p.log.Info("Waiting for informer caches", "server", p.cfg.APIServer)
	waitStart := time.Now()
	if !p.src.WaitForCaches(ctx) {
		p.log.Info("Stopped before the first sync")
		return nil
	}
	if err := p.waitForPodCIDRs(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	p.log.Info("Informer caches synced; starting sync loop", append(p.src.Listed(),
		"took", time.Since(waitStart).Round(time.Millisecond), "minSyncPeriod", p.cfg.MinSyncPeriod, "syncPeriod", p.cfg.SyncPeriod)...)
	if p.cfg.CachesSynced != nil {
		p.cfg.CachesSynced()
	}
	p.runner.Loop(ctx.Done())
	return nil
}

// PodCIDRTimeout is how long the first sync waits, with --detect-local-mode=NodeCIDR,
// for the Node to get spec.podCIDRs, as kube-proxy: longer and it fails.
var PodCIDRTimeout = 5 * time.Minute

// waitForPodCIDRs waits, with --detect-local-mode=NodeCIDR, until this node's Node
// exists and has pod CIDRs (at most PodCIDRTimeout, then an error, as kube-proxy).
// Later changes of them are followed: the Node is an input of every sync.
func (p *Proxy) waitForPodCIDRs(ctx context.Context) error {
	if p.cfg.Pipeline.Compile.DetectLocal.Mode != compile.LocalNodeCIDR {
		return nil
	}
	deadline := time.Now().Add(PodCIDRTimeout)
	logged := false
	for {
		node := p.Node()
		if node != nil && len(node.Spec.PodCIDRs) > 0 {
			if logged {
				p.log.Info("The Node has pod CIDRs", "node", p.cfg.NodeName, "podCIDRs", node.Spec.PodCIDRs)
			}
			n := model.NodeOf(node)
			for _, ip := range n.IPs { // as kube-proxy's warning, for each family the node has
				if !slices.ContainsFunc(n.PodCIDRs, func(c netip.Prefix) bool { return c.Addr().Is6() == ip.Is6() }) {
					p.log.Info("Detect-local-mode set to NodeCIDR, but no PodCIDR defined at node for an IP family: its traffic is not told apart",
						"node", p.cfg.NodeName, "ip", ip, "podCIDRs", node.Spec.PodCIDRs)
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			if node == nil {
				return fmt.Errorf("--detect-local-mode=NodeCIDR: timeout waiting for node %q to exist", p.cfg.NodeName)
			}
			return fmt.Errorf("--detect-local-mode=NodeCIDR: timeout waiting for PodCIDR allocation on node %q", p.cfg.NodeName)
		}
		if !logged {
			p.log.Info("Waiting for the Node's pod CIDRs (--detect-local-mode=NodeCIDR)", "node", p.cfg.NodeName, "timeout", PodCIDRTimeout)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// Node returns this node's Node object as the controller's informer has it; nil while
// it is unknown or after it is deleted. Callers must not modify it.
func (p *Proxy) Node() *v1.Node { return p.src.Node() }

// eventCacheSize bounds the event correlator's caches (see Run).
const eventCacheSize = 256

// FullSyncPeriod is how often a periodic sync rewrites the whole table even though
// nothing asked for it, as upstream's nftables mode does (its FullSyncPeriod). Drift in
// between is found by the netlink monitor, which asks for a rewrite (RequestRepair).
const FullSyncPeriod = time.Hour

// sync programs the kernel from the informer caches. Syncs send only what changed since
// the last one; a periodic sync rewrites the whole table once every FullSyncPeriod, and
// a repair request at once.
func (p *Proxy) sync(periodic bool) error {
	start := time.Now()
	first := !p.hasSynced()
	if first && !p.firstSyncStarted {
		p.firstSyncStarted = true
		p.log.Info("First sync started") // shown at -v=0: on a large cluster it takes a while
	}
	p.cfg.Metrics.SyncStarted()
	changes := p.src.Take()

	snap, rulesets, err := p.compile(&changes)
	compiled := time.Since(start)
	if err == nil {
		repair := p.takeRepair()
		if repair != "" {
			p.repairing = repair
		}
		if periodic && repair == "" && !p.lastFull.IsZero() && time.Since(p.lastFull) >= FullSyncPeriod {
			repair = "periodic full sync"
		}
		if repair != "" {
			p.log.Info("Rewriting the whole table", "reason", repair)
			p.dataplane.Resync()
		}
		var st kernel.Stats
		rulesets = p.withQuarantine(rulesets)
		st, err = p.dataplane.Apply(rulesets...)
		var rejected *kernel.RejectedError
		if errors.As(err, &rejected) {
			p.log.Error(err, "The kernel refused the transaction; it keeps the previous ruleset. Looking for the service ports it refuses")
			// what isolation finally applied is the dataplane's (Dataplane.Applied)
			st, _, err = p.isolate(rulesets, err)
		}
		if err == nil {
			p.syncedOnce.Do(func() { close(p.synced) })
			kv := []any{"services", len(snap.Services), "full", st.Full, "messages", st.Messages,
				"bytes", st.Bytes, "elements", st.Elements, "chains", st.Chains,
				"compile", compiled, "encode", st.Encode, "kernel", st.Kernel, "took", time.Since(start)}
			if first {
				p.log.Info("First sync done", kv...)
			} else {
				p.log.V(2).Info("Synced", kv...)
			}
			if st.Full {
				p.lastFull = time.Now()
			}
			if len(st.Overfilled) > 0 {
				p.log.Info("Sets outgrew the capacity the last full write gave them; the table was written anew with them resizable until the next full write",
					"sets", st.Overfilled)
			}
			p.cleanConntrack(snap, p.repairing)
			p.repairing = ""
			p.syncHealthChecks(snap)
			p.cfg.Metrics.SyncDone(st.Full, time.Since(start), st.Kernel)
			p.cfg.Metrics.ServicePorts(len(snap.Services))
			p.syncMetrics(snap, changes.Triggers)
			p.mu.Lock()
			p.status.LastSync = time.Now()
			p.status.Syncs++
			p.status.LastError = ""
			p.mu.Unlock()
			return nil
		}
	}
	p.cfg.Metrics.SyncFailed(periodic, time.Since(start))
	p.src.GiveBack(changes)
	p.log.Error(err, "Sync failed; the previous ruleset stays in the kernel, will retry")
	p.mu.Lock()
	p.status.Failures++
	p.status.LastError = err.Error()
	p.mu.Unlock()
	return err
}

// cleanConntrack deletes the conntrack entries that would keep packets away from the
// ruleset just committed: the UDP entries the change from the previous snapshot made
// stale and, after a sync that repaired a broken table (repaired: the repair's reason;
// "" if none), the entries of connections to cluster IPs that escaped NAT while it was
// broken (conntrack.Escaped). The periodic full sync rewrites a table that was intact
// (a broken one is repaired when the monitor sees it), so nothing escaped. Both kinds go
// to one cleanup: one table dump per family, one observation in the conntrack metrics.
// Failures are logged: the rules are right, only some clients may wait for their
// entries to time out.
func (p *Proxy) cleanConntrack(snap *model.Snapshot, repaired string) {
	prev := p.prev
	p.prev = conntrack.Programmed{Snap: snap, Won: p.pipeline.Won()}
	if p.cfg.Conntrack == nil {
		return
	}
	stale := conntrack.StaleFrom(prev, p.prev, p.udpFlowsKept())
	var escaped []conntrack.Flow
	if repaired != "" {
		escaped = conntrack.Escaped(snap)
	}
	flows := append(slices.Clip(stale), escaped...)
	n, err := p.conntrackCleaner().Clean(flows) // no flows: no table dump, metrics observed
	switch {
	case len(flows) == 0:
	case repaired != "":
		// an entry may be selected by both kinds (a UDP port's un-DNATed entries when it
		// gets endpoints), so the count is of the two together
		kv := []any{"entries", n, "escapedFlows", len(escaped), "staleUDPFlows", len(stale), "repair", repaired}
		if err != nil {
			p.log.Error(err, "Deleting the conntrack entries that escaped NAT while the table was broken failed", kv[2:]...)
			return
		}
		p.log.V(2).Info("Deleted the conntrack entries that escaped NAT while the table was broken", kv...)
	case err != nil:
		p.log.Error(err, "Deleting stale UDP conntrack entries failed", "flows", len(flows))
	default:
		p.log.V(2).Info("Deleted stale UDP conntrack entries", "entries", n, "flows", len(flows))
	}
}

// syncHealthChecks opens, updates and closes the health-check node port servers; a
// failure (a port already taken) is logged when it changes and retried every sync.
func (p *Proxy) syncHealthChecks(snap *model.Snapshot) {
	if p.cfg.HealthChecks == nil {
		return
	}
	err := p.cfg.HealthChecks.Sync(healthcheck.FromSnapshot(snap))
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != p.healthErr {
		p.healthErr = msg
		if err != nil {
			p.log.Error(err, "Health check node port server problem; will retry")
		}
	}
}

// compile builds the snapshot and the rulesets of every family from the changes a sync
// took, reporting bad input. The model cache is handed the Services and EndpointSlices
// changed since the last sync (source.Changes); the first sync, and one after a sync
// that may have left the cache half updated, build it anew from the full lists. Once
// the model has them, c keeps only what the sync still has to program (Done).
func (p *Proxy) compile(c *source.Changes) (*model.Snapshot, []*nft.Ruleset, error) {
	p.probeFastPath()
	cfg := p.cfg.Pipeline
	cidrs, err := p.src.ServiceCIDRs()
	if err != nil {
		return nil, nil, err
	}
	cfg.ServiceCIDRs = cidrs
	snap, rulesets, problems, err := p.compileChanges(cfg, *c, p.src.Node()) // no Node until it is known
	if err == nil {
		p.src.Done(c)
	}
	p.report(problems)
	return snap, rulesets, err
}

// compileChanges runs the pipeline on the changes c.
func (p *Proxy) compileChanges(cfg pipeline.Config, c source.Changes, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	if !c.Full {
		d, err := p.src.Delta(c)
		if err != nil {
			return nil, nil, nil, err
		}
		return p.pipeline.Changes(cfg, d, node)
	}
	// The names taken are of objects in the lists (or noted again if they change after).
	svcs, slices, err := p.lists()
	if err != nil {
		return nil, nil, nil, err
	}
	// a new cache: the one there is may be half updated by a sync that panicked
	p.pipeline.Reset()
	return p.pipeline.Full(cfg, svcs, slices, node)
}

// report logs each problem once (while it persists) and records it as a Warning event on
// its object.
func (p *Proxy) report(problems []model.Problem) {
	current := make(map[model.Problem]bool, len(problems))
	defer func() { p.reported = current }()
	for _, pr := range problems {
		current[pr] = true
		if p.reported[pr] {
			continue
		}
		p.log.Info("Ignoring bad input", "kind", pr.Kind, "namespace", pr.Namespace, "name", pr.Name, "reason", pr.Reason)
		if obj := p.object(pr); obj != nil && p.recorder != nil {
			p.recorder.Event(obj, v1.EventTypeWarning, "NftproxyIgnored", pr.Reason)
		}
	}
}

func (p *Proxy) object(pr model.Problem) runtime.Object {
	return p.src.Object(pr.Kind, pr.Namespace, pr.Name)
}

// udpFlowsKept decides which endpoints keep their UDP flows after a change.
func (p *Proxy) udpFlowsKept() conntrack.UsableFunc {
	if p.cfg.UDPKeepTerminatingFlows {
		return conntrack.ServingOrTerminating
	}
	return conntrack.Serving
}
