// Package controller watches Services, EndpointSlices and this node's Node through
// client-go informers and, on every change (batched by the sync runner), builds a model
// snapshot, compiles it and hands the ruleset to the kernel applier.
package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/healthcheck"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/par"
	"github.com/nftproxy/nftproxy/internal/runner"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// Config is the proxy's configuration, from kube-proxy's flags.
type Config struct {
	NodeName string
	// DetectLocal tells pods' traffic from other traffic (--detect-local-mode with
	// --cluster-cidr or the interface flags; NodeCIDR reads the Node's podCIDRs).
	DetectLocal   compile.DetectLocal
	MasqueradeAll bool
	MasqueradeBit uint32
	// NodePortAddresses are the addresses node ports answer on (--nodeport-addresses).
	NodePortAddresses config.NodePortAddresses
	MinSyncPeriod     time.Duration
	SyncPeriod        time.Duration
	// LocalAddrs lists the machine's addresses (for --nodeport-addresses CIDRs).
	LocalAddrs func() ([]netip.Addr, error)
	// ServiceCIDRs are used when the API serves no ServiceCIDR objects
	// (--service-cluster-ip-range).
	ServiceCIDRs []netip.Prefix
	// Conntrack deletes stale UDP conntrack entries after each sync, and after a repair
	// the entries that escaped NAT while the table was broken; nil: never.
	Conntrack conntrack.Deleter
	// HealthChecks serves healthCheckNodePorts; nil: none.
	HealthChecks HealthChecks
	// Metrics receives sync and change observations; nil: none.
	Metrics metrics.Recorder
	// Applied, if set, is told the rulesets after each sync the kernel accepted (the
	// per-service counters map kernel elements back to service ports through them).
	Applied func(rulesets []*nft.Ruleset)
	// CachesSynced, if set, is called once the informers' caches are synced, before the
	// first sync starts (on the sync loop's goroutine: the first sync waits for it).
	CachesSynced func()
	// APIServer is the API server's address, for log lines.
	APIServer string
	// NoExternalIPs: the feature gate AllowServiceExternalIPs is false; no Service
	// externalIPs are programmed.
	NoExternalIPs bool
	// ServedPorts are the TCP ports nftproxy serves on the node (health and metrics
	// servers) and OwnAddrs their bind addresses: no externalIP or load-balancer IP on
	// the node's addresses takes them (see compile.Config).
	ServedPorts []uint16
	OwnAddrs    []netip.Addr
	// ClusterCIDRs are the pods' ranges (--cluster-cidr, whatever DetectLocal's mode)
	// and ExternalIPCIDRs the only ranges externalIPs are programmed in
	// (--external-ip-cidrs; empty: anywhere): see compile.Config.
	ClusterCIDRs    []netip.Prefix
	ExternalIPCIDRs []netip.Prefix
	// NoMasqueradeCIDRs are destinations whose traffic keeps its source address
	// (--no-masquerade-cidrs; see compile.Config).
	NoMasqueradeCIDRs []netip.Prefix
	// UDPKeepTerminatingFlows keeps the UDP conntrack entries of an endpoint while it
	// terminates, serving or not, until it leaves its EndpointSlice
	// (--udp-keep-terminating-flows; conntrack.ServingOrTerminating).
	UDPKeepTerminatingFlows bool
	// MasqueradeToNodeIP: --masquerade-to-node-ip (compile.Config).
	MasqueradeToNodeIP bool
	// DefaultBalancing: --load-balancing (compile.Config.DefaultBalancing).
	DefaultBalancing model.Balancing
	// Limits bound what one Service, and the whole table, may cost (compile.Limits;
	// zero: no limits).
	Limits compile.Limits
}

// HealthChecks is the health-check node port server (see internal/healthcheck).
type HealthChecks interface {
	Sync(map[healthcheck.ServiceName]healthcheck.Service) error
}

// Dataplane is what the controller needs from the kernel side: *kernel.Applier, or
// nft/fake's Applier (the kernel's commit semantics in memory) in tests.
type Dataplane interface {
	Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error)
	Resync()
}

// Proxy is the running controller.
type Proxy struct {
	cfg       Config
	log       logr.Logger
	client    kubernetes.Interface
	dataplane Dataplane
	runner    *runner.Runner
	recorder  record.EventRecorder

	factory      informers.SharedInformerFactory // Services
	sliceFactory informers.SharedInformerFactory
	cidrFactory  informers.SharedInformerFactory
	nodeFactory  informers.SharedInformerFactory
	informers    []namedInformer // those the first sync waits for
	services     corelisters.ServiceLister
	slices       discoverylisters.EndpointSliceLister
	nodes        corelisters.NodeLister
	// cidrs is nil when the API has no ServiceCIDRs; set before the first sync (Run)
	cidrs   networkinglisters.ServiceCIDRLister
	apiErrs *apiErrors
	// first retry delay of ServiceCIDR discovery (doubling up to discoveryBackoffMax)
	discoveryBackoff time.Duration

	pipeline  *pipeline
	pending   *pending               // names of Services and EndpointSlices changed since the last sync (pending.go)
	triggers  *triggers              // EndpointSlice trigger times not yet programmed
	prevSnap  *model.Snapshot        // the snapshot the kernel has, for conntrack cleanup
	prevWon   conntrack.Won          // the UDP frontends its rulesets hold
	healthErr string                 // last health-check server error, logged once
	reported  map[model.Problem]bool // problems already logged, so each is logged once

	mu           sync.Mutex
	status       Status
	repairReason string // a full rewrite was requested (RequestRepair); "" if not

	lastFull time.Time // end of the last sync that rewrote the whole table (sync goroutine only)
	// the reason of a repair whose sync has not succeeded yet: the sync that does
	// succeeds also deletes the conntrack entries that escaped NAT while the table was
	// broken (sync goroutine only)
	repairing string
	// the rulesets the kernel last accepted, and the parts it refused (see isolate.go)
	applied    []*nft.Ruleset
	quarantine map[quarantineKey]*nft.Part

	synced     chan struct{} // closed after the first successful sync
	syncedOnce sync.Once
	// "First sync started" was logged (sync goroutine only)
	firstSyncStarted bool
}

// Status is the proxy's sync state, for health checks. (Metrics go to Config.Metrics.)
type Status struct {
	LastSync      time.Time // end of the last successful sync
	OldestPending time.Time // first change not yet synced; zero if none
	Syncs         int
	Failures      int
	LastError     string
}

// New creates a Proxy; Run starts it.
func New(client kubernetes.Interface, dp Dataplane, cfg Config, log logr.Logger) *Proxy {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Nop{}
	}
	p := &Proxy{
		cfg: cfg, log: log, client: client, dataplane: dp,
		pipeline:   &pipeline{models: model.NewCache(), slots: map[nft.Family]*compile.Slots{}},
		pending:    newPending(),
		reported:   map[model.Problem]bool{},
		quarantine: map[quarantineKey]*nft.Part{},
		synced:     make(chan struct{}),
		triggers:   newTriggers(log, time.Now()),
	}
	p.runner = runner.New(p.sync, cfg.MinSyncPeriod, cfg.SyncPeriod, max(cfg.MinSyncPeriod, time.Second), nil)
	p.runner.OnPanic(func(v any) { log.Error(fmt.Errorf("%v", v), "Sync panicked; will retry") })
	p.runner.MeasureCPU(runner.ProcessCPU)

	p.apiErrs = &apiErrors{log: log, server: cfg.APIServer, now: time.Now}
	p.discoveryBackoff = discoveryBackoffMin

	// Services and EndpointSlices with kube-proxy's server-side filters (filter.go);
	// ServiceCIDRs unfiltered, their informer started once discovery says they are
	// served (apiwait.go); this node's Node only.
	p.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(ServiceListOptions))
	p.sliceFactory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(SliceListOptions))
	p.cidrFactory = informers.NewSharedInformerFactory(client, 0)
	p.nodeFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
		}))
	// Services and EndpointSlices without the factories' namespace index: the proxy
	// looks objects up by key or lists them all, and the index is a set entry per object
	// to build at the cold start and keep (a few megabytes at 30,000 of each); their
	// lists are decoded as they arrive (listing.go)
	svcInf := p.factory.InformerFor(&v1.Service{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return newServiceInformer(c, ServiceListOptions, p.slim)
	})
	sliceInf := p.sliceFactory.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return newSliceInformer(c, SliceListOptions, p.slim)
	})
	nodeInf := p.nodeFactory.Core().V1().Nodes()
	p.services, p.slices = corelisters.NewServiceLister(svcInf.GetIndexer()), discoverylisters.NewEndpointSliceLister(sliceInf.GetIndexer())
	p.nodes = nodeInf.Lister()
	p.watch(svcInf, serviceKind)
	p.watch(sliceInf, sliceKind)
	p.slimInCache(nodeInf.Informer())
	p.watch(nodeInf.Informer(), otherKind)
	p.informers = []namedInformer{{"Services", svcInf}, {"EndpointSlices", sliceInf}, {"Node " + cfg.NodeName, nodeInf.Informer()}}
	return p
}

type namedInformer struct {
	what     string
	informer cache.SharedIndexInformer
}

// watch sets up an informer before it starts: the change handlers and the rate-limited
// logging of API errors. k says what it watches.
func (p *Proxy) watch(inf cache.SharedIndexInformer, k kind) {
	_ = inf.SetWatchErrorHandlerWithContext(p.apiErrs.watchErrors)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.triggers.sliceEvent(obj, false); p.changed(k, obj) },
		UpdateFunc: func(_, obj any) { p.triggers.sliceEvent(obj, false); p.changed(k, obj) },
		DeleteFunc: func(obj any) { p.triggers.sliceEvent(obj, true); p.changed(k, obj) },
	})
}

// slimInCache makes an informer slim what it stores (slim.go): the caches keep only what
// the proxy reads, compactly. For the Node and the ServiceCIDRs; the Services' and
// EndpointSlices' informers slim their objects in their own list and watch functions,
// as the objects arrive (listing.go).
func (p *Proxy) slimInCache(inf cache.SharedIndexInformer) {
	_ = inf.SetTransform(func(obj any) (any, error) { return slim(obj, p.triggers.timed), nil })
}

// slim is the Services' and EndpointSlices' transform: slim.go's, keeping the trigger
// times to observe.
func (p *Proxy) slim(obj runtime.Object) runtime.Object {
	return slim(obj, p.triggers.timed).(runtime.Object)
}

// changed notes a change from the API (of an object of kind k) and asks for a sync.
func (p *Proxy) changed(k kind, obj any) {
	switch k {
	case serviceKind:
		p.cfg.Metrics.Changes(0, 1)
	case sliceKind:
		p.cfg.Metrics.Changes(1, 0)
	}
	p.pending.add(k, obj)
	p.mu.Lock()
	if p.status.OldestPending.IsZero() {
		p.status.OldestPending = time.Now()
	}
	p.mu.Unlock()
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
func (p *Proxy) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
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
	p.factory.Start(ctx.Done())
	p.sliceFactory.Start(ctx.Done())
	p.nodeFactory.Start(ctx.Done())
	defer func() {
		stop()
		p.factory.Shutdown()
		p.sliceFactory.Shutdown()
		p.cidrFactory.Shutdown()
		p.nodeFactory.Shutdown()
	}()
	cidrsReady := make(chan struct{})
	go p.discoverServiceCIDRs(ctx, cidrsReady)
	p.log.Info("Waiting for informer caches", "server", p.cfg.APIServer)
	waitStart := time.Now()
	if !p.waitForCaches(ctx, cidrsReady) {
		p.log.Info("Stopped before the first sync")
		return nil
	}
	if err := p.waitForPodCIDRs(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	p.log.Info("Informer caches synced; starting sync loop", append(p.listed(),
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
	if p.cfg.DetectLocal.Mode != compile.LocalNodeCIDR {
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
func (p *Proxy) Node() *v1.Node {
	n, err := p.nodes.Get(p.cfg.NodeName)
	if err != nil {
		return nil
	}
	return n
}

// listed counts what the informers listed, for the log line at -v=0 that ends the wait
// for the API server (a large cluster's first list can take a while).
func (p *Proxy) listed() []any {
	svcs, _ := p.services.List(labels.Everything())
	eps, _ := p.slices.List(labels.Everything())
	endpoints := 0
	for _, s := range eps {
		endpoints += len(s.Endpoints)
	}
	kv := []any{"services", len(svcs), "endpointSlices", len(eps), "endpoints", endpoints}
	if p.cidrs != nil {
		cidrs, _ := p.cidrs.List(labels.Everything())
		kv = append(kv, "serviceCIDRs", len(cidrs))
	}
	return kv
}

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
	p.mu.Lock()
	pendingSince := p.status.OldestPending
	p.status.OldestPending = time.Time{}
	p.mu.Unlock()
	triggers := p.triggers.take()

	snap, rulesets, err := p.compile()
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
			var applied []*nft.Ruleset
			if st, applied, err = p.isolate(rulesets, err); err == nil {
				rulesets = applied
			}
		}
		if err == nil {
			p.syncedOnce.Do(func() { close(p.synced) })
			p.applied = rulesets
			if p.cfg.Applied != nil {
				p.cfg.Applied(rulesets)
			}
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
			p.syncMetrics(snap, triggers)
			p.mu.Lock()
			p.status.LastSync = time.Now()
			p.status.Syncs++
			p.status.LastError = ""
			p.mu.Unlock()
			return nil
		}
	}
	p.cfg.Metrics.SyncFailed(periodic, time.Since(start))
	p.triggers.giveBack(triggers)
	p.log.Error(err, "Sync failed; the previous ruleset stays in the kernel, will retry")
	p.mu.Lock()
	p.status.Failures++
	p.status.LastError = err.Error()
	if p.status.OldestPending.IsZero() || (!pendingSince.IsZero() && pendingSince.Before(p.status.OldestPending)) {
		p.status.OldestPending = pendingSince
	}
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
	prev, prevWon := p.prevSnap, p.prevWon
	p.prevSnap, p.prevWon = snap, p.pipeline.won
	if p.cfg.Conntrack == nil {
		return
	}
	stale := conntrack.StaleFrom(conntrack.Programmed{Snap: prev, Won: prevWon}, conntrack.Programmed{Snap: snap, Won: p.prevWon}, p.udpFlowsKept())
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

// compile builds the snapshot and the rulesets of every family, reporting bad input.
// The model cache is handed the Services and EndpointSlices changed since the last sync
// (pending.go); the first sync, and one after a sync that may have left the cache half
// updated, build it anew from the full lists.
func (p *Proxy) compile() (*model.Snapshot, []*nft.Ruleset, error) {
	node, _ := p.nodes.Get(p.cfg.NodeName) // nil until the Node is known
	cfg := p.cfg
	if p.cidrs != nil {
		objs, err := p.cidrs.List(labels.Everything())
		if err != nil {
			return nil, nil, err
		}
		cfg.ServiceCIDRs = serviceCIDRs(objs)
	}
	taken := p.pending.take()
	snap, rulesets, problems, err := p.compileTaken(cfg, taken, node)
	if err != nil {
		p.pending.giveBack(taken)
	} else {
		p.pending.done()
	}
	p.report(problems)
	return snap, rulesets, err
}

// compileTaken runs the pipeline on the changes taken from p.pending.
func (p *Proxy) compileTaken(cfg Config, taken takenChanges, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	if !taken.full {
		d, err := p.delta(taken)
		if err != nil {
			return nil, nil, nil, err
		}
		return p.pipeline.compileChanges(cfg, d, node)
	}
	// The names taken are of objects in the lists (or noted again if they change after).
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		return nil, nil, nil, err
	}
	slices, err := p.slices.List(labels.Everything())
	if err != nil {
		return nil, nil, nil, err
	}
	// a new cache: the one there is may be half updated by a sync that panicked (its
	// first snapshot follows none, so the compilers compare every service port)
	p.pipeline.models = model.NewCache()
	return p.pipeline.compile(cfg, svcs, slices, node)
}

// Families are the address families nftproxy programs, one table each.
var Families = []nft.Family{nft.IPv4, nft.IPv6}

// Compile turns API objects into the ruleset of every family. slots holds one allocator
// per family (see compile.Slots); problems lists bad input that was skipped. The
// rulesets are flat (no parts): this is the pure form of what a running Proxy compiles
// incrementally.
func Compile(cfg Config, slots map[nft.Family]*compile.Slots, svcs []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	pl := &pipeline{slots: slots}
	snap, rulesets, problems, err := pl.compile(cfg, svcs, slices, node)
	for i, rs := range rulesets {
		rulesets[i] = rs.Flatten()
	}
	return snap, rulesets, problems, err
}

// pipeline compiles API objects into rulesets, incrementally when it keeps a model cache
// and compilers between calls: a service whose objects did not change costs pointer
// comparisons, and its ruleset part is the same as last time (see nft.Part).
type pipeline struct {
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

// compile compiles the full lists of Services and EndpointSlices.
func (pl *pipeline) compile(cfg Config, svcs []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	return pl.run(cfg, node, func(in model.Inputs) (*model.Snapshot, []model.Problem) {
		in.Services, in.Slices = svcs, slices
		if pl.models != nil {
			return pl.models.BuildFrom(in)
		}
		return model.BuildFrom(in)
	})
}

// compileChanges compiles the model cache's objects with the changes d (see
// model.Cache.BuildChanges); the pipeline must have a model cache.
func (pl *pipeline) compileChanges(cfg Config, d model.Delta, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	return pl.run(cfg, node, func(in model.Inputs) (*model.Snapshot, []model.Problem) {
		return pl.models.BuildChanges(d, in)
	})
}

// run builds the snapshot with build, given the inputs other than Services and
// EndpointSlices, and compiles it. It fails only before it builds.
func (pl *pipeline) run(cfg Config, node *v1.Node, build func(model.Inputs) (*model.Snapshot, []model.Problem)) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	// What the model cannot know (the machine's addresses) is resolved first, so that
	// the snapshot is complete when built; from there on, all is pure.
	npAddrs, allLocal, err := nodePortAddrs(cfg, model.NodeOf(node))
	if err != nil {
		return nil, nil, nil, err
	}
	snap, problems := build(model.Inputs{Node: node, ServiceCIDRs: cfg.ServiceCIDRs, NodePortAddrs: npAddrs})
	if pl.compilers == nil {
		pl.compilers = map[nft.Family]*compiler{}
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
		cc := compile.Config{
			Family:             fam,
			MasqueradeAll:      cfg.MasqueradeAll,
			MasqueradeBit:      cfg.MasqueradeBit,
			NodePortAllLocal:   allLocal[fam],
			NoExternalIPs:      cfg.NoExternalIPs,
			ServedPorts:        cfg.ServedPorts,
			OwnAddrs:           cfg.OwnAddrs,
			ClusterCIDRs:       cfg.ClusterCIDRs,
			ExternalIPCIDRs:    cfg.ExternalIPCIDRs,
			NoMasquerade:       cfg.NoMasqueradeCIDRs,
			DefaultBalancing:   cfg.DefaultBalancing,
			MasqueradeToNodeIP: cfg.MasqueradeToNodeIP,
			Limits:             cfg.Limits,
			DetectLocal:        cfg.DetectLocal,
		}
		if pl.slots[fam] == nil {
			pl.slots[fam] = compile.NewSlots()
		}
		c := pl.compilers[fam]
		if c == nil || !reflect.DeepEqual(c.cfg, cc) {
			c = &compiler{cfg: cc, c: compile.NewCompiler(cc, pl.slots[fam])}
			pl.compilers[fam] = c
		}
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

// serviceCIDRs collects the ranges of ServiceCIDR objects that are not being deleted.
func serviceCIDRs(objs []*networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, o := range objs {
		if o.DeletionTimestamp != nil {
			continue
		}
		for _, c := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
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
	switch pr.Kind {
	case "Service":
		if s, err := p.services.Services(pr.Namespace).Get(pr.Name); err == nil {
			return s
		}
	case "EndpointSlice":
		if s, err := p.slices.EndpointSlices(pr.Namespace).Get(pr.Name); err == nil {
			return s
		}
	}
	return nil
}

// udpFlowsKept decides which endpoints keep their UDP flows after a change.
func (p *Proxy) udpFlowsKept() conntrack.UsableFunc {
	if p.cfg.UDPKeepTerminatingFlows {
		return conntrack.ServingOrTerminating
	}
	return conntrack.Serving
}
