// Package source is the proxy's API intake: the informers of Services, EndpointSlices,
// ServiceCIDRs and this node's Node, with kube-proxy's server-side filters (filter.go);
// the streaming list decoder their lists go through (listing.go); the slimming of every
// object to what the proxy reads (slim.go); ServiceCIDR discovery and the wait for the
// caches (apiwait.go); and the change tracker a sync takes its work from (tracker.go).
// List is the one-shot listing of the same objects, for the commands that compile what
// the proxy would (--dry-run, explain, verify).
package source

import (
	"context"
	"net/netip"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Config says what a Source watches.
type Config struct {
	NodeName string
	// ServiceCIDRs are used when the API serves no ServiceCIDR objects
	// (--service-cluster-ip-range).
	ServiceCIDRs []netip.Prefix
	// APIServer is the API server's address, for log lines.
	APIServer string
	// Changed, if set, is called after every informer event, once the Tracker has it.
	Changed func(Kind)
}

// Source holds the informers and their caches, and tracks what changes in them. Its
// Tracker's methods (Take, Done, GiveBack, Oldest) are a sync's work list.
type Source struct {
	*Tracker
	cfg    Config
	log    logr.Logger
	client kubernetes.Interface

	factory      informers.SharedInformerFactory // Services
	sliceFactory informers.SharedInformerFactory
	cidrFactory  informers.SharedInformerFactory
	nodeFactory  informers.SharedInformerFactory
	informers    []namedInformer // those the first sync waits for
	services     corelisters.ServiceLister
	slices       discoverylisters.EndpointSliceLister
	nodes        corelisters.NodeLister
	// cidrs is nil when the API has no ServiceCIDRs; final once cidrsReady is closed
	cidrs      networkinglisters.ServiceCIDRLister
	cidrsReady chan struct{}
	apiErrs    *apiErrors
	// DiscoveryBackoff is the first retry delay of ServiceCIDR discovery (doubling up to
	// 30 s); tests shorten it before Start.
	DiscoveryBackoff time.Duration
}

type namedInformer struct {
	what     string
	informer cache.SharedIndexInformer
}

// New sets up the informers; Start starts them.
func New(client kubernetes.Interface, cfg Config, log logr.Logger) *Source {
	s := &Source{Tracker: NewTracker(log, time.Now()), cfg: cfg, log: log, client: client,
		apiErrs: &apiErrors{log: log, server: cfg.APIServer, now: time.Now}, DiscoveryBackoff: discoveryBackoffMin,
		cidrsReady: make(chan struct{})}
	// Services and EndpointSlices with kube-proxy's server-side filters (filter.go);
	// ServiceCIDRs unfiltered, their informer started once discovery says they are
	// served (apiwait.go); this node's Node only.
	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(ServiceListOptions))
	s.sliceFactory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(SliceListOptions))
	s.cidrFactory = informers.NewSharedInformerFactory(client, 0)
	s.nodeFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
		}))
	// Services and EndpointSlices without the factories' namespace index: the proxy
	// looks objects up by key or lists them all, and the index is a set entry per object
	// to build at the cold start and keep (a few megabytes at 30,000 of each); their
	// lists are decoded as they arrive (listing.go)
	svcInf := s.factory.InformerFor(&v1.Service{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return newServiceInformer(c, ServiceListOptions, s.slim)
	})
	sliceInf := s.sliceFactory.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return newSliceInformer(c, SliceListOptions, s.slim)
	})
	nodeInf := s.nodeFactory.Core().V1().Nodes()
	s.services, s.slices = corelisters.NewServiceLister(svcInf.GetIndexer()), discoverylisters.NewEndpointSliceLister(sliceInf.GetIndexer())
	s.nodes = nodeInf.Lister()
	s.watch(svcInf, Services)
	s.watch(sliceInf, EndpointSlices)
	s.slimInCache(nodeInf.Informer())
	s.watch(nodeInf.Informer(), Other)
	s.informers = []namedInformer{{"Services", svcInf}, {"EndpointSlices", sliceInf}, {"Node " + cfg.NodeName, nodeInf.Informer()}}
	return s
}

// watch sets up an informer before it starts: the change tracking and the rate-limited
// logging of API errors. k says what it watches.
func (s *Source) watch(inf cache.SharedIndexInformer, k Kind) {
	_ = inf.SetWatchErrorHandlerWithContext(s.apiErrs.watchErrors)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.event(k, obj, false) },
		UpdateFunc: func(_, obj any) { s.event(k, obj, false) },
		DeleteFunc: func(obj any) { s.event(k, obj, true) },
	})
}

func (s *Source) event(k Kind, obj any, deleted bool) {
	s.Add(k, obj, deleted)
	if s.cfg.Changed != nil {
		s.cfg.Changed(k)
	}
}

// slimInCache makes an informer slim what it stores (slim.go): the caches keep only what
// the proxy reads, compactly. For the Node and the ServiceCIDRs; the Services' and
// EndpointSlices' informers slim their objects in their own list and watch functions,
// as the objects arrive (listing.go).
func (s *Source) slimInCache(inf cache.SharedIndexInformer) {
	_ = inf.SetTransform(func(obj any) (any, error) { return slim(obj, s.timed), nil })
}

// slim is the Services' and EndpointSlices' transform: slim.go's, keeping the trigger
// times to observe.
func (s *Source) slim(obj runtime.Object) runtime.Object {
	return slim(obj, s.timed).(runtime.Object)
}

// Start starts the informers and ServiceCIDR discovery; they run until ctx ends. stop
// shuts them down.
func (s *Source) Start(ctx context.Context) (stop func()) {
	s.factory.Start(ctx.Done())
	s.sliceFactory.Start(ctx.Done())
	s.nodeFactory.Start(ctx.Done())
	go s.discoverServiceCIDRs(ctx, s.cidrsReady)
	return func() {
		s.factory.Shutdown()
		s.sliceFactory.Shutdown()
		s.cidrFactory.Shutdown()
		s.nodeFactory.Shutdown()
	}
}

// Node returns this node's Node object as the informer has it; nil while it is unknown
// or after it is deleted. Callers must not modify it.
func (s *Source) Node() *v1.Node {
	n, err := s.nodes.Get(s.cfg.NodeName)
	if err != nil {
		return nil
	}
	return n
}

// ServiceCIDRs are the ranges cluster IPs are allocated from: the ServiceCIDR objects'
// when the API serves them, else Config.ServiceCIDRs. Only after WaitForCaches.
func (s *Source) ServiceCIDRs() ([]netip.Prefix, error) {
	if s.cidrs == nil {
		return s.cfg.ServiceCIDRs, nil
	}
	objs, err := s.cidrs.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	return ServiceCIDRsOf(objs), nil
}

// ServiceCIDRsOf collects the ranges of ServiceCIDR objects that are not being deleted.
// The one place ServiceCIDR objects are read.
func ServiceCIDRsOf(objs []*networkingv1.ServiceCIDR) []netip.Prefix {
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

// Lists are every Service and EndpointSlice the caches hold, for a Full sync.
func (s *Source) Lists() ([]*v1.Service, []*discovery.EndpointSlice, error) {
	svcs, err := s.services.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	slices, err := s.slices.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	return svcs, slices, nil
}

// Delta reads the objects of the names c holds from the informer caches: an object that
// is not there any more is deleted (nil).
func (s *Source) Delta(c Changes) (model.Delta, error) {
	d := model.Delta{Services: make(map[types.NamespacedName]*v1.Service, len(c.Services)),
		Slices: make(map[types.NamespacedName]*discovery.EndpointSlice, len(c.Slices))}
	for key := range c.Services {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			continue // not a key MetaNamespaceKeyFunc makes
		}
		svc, err := s.services.Services(ns).Get(name)
		if err != nil && !apierrors.IsNotFound(err) {
			return model.Delta{}, err
		}
		d.Services[types.NamespacedName{Namespace: ns, Name: name}] = svc // nil if not found
	}
	for key := range c.Slices {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			continue
		}
		sl, err := s.slices.EndpointSlices(ns).Get(name)
		if err != nil && !apierrors.IsNotFound(err) {
			return model.Delta{}, err
		}
		d.Slices[types.NamespacedName{Namespace: ns, Name: name}] = sl
	}
	return d, nil
}

// Object is the cached object a problem is about, for an event on it; nil if it is not
// in the cache.
func (s *Source) Object(kind model.ObjectKind, namespace, name string) runtime.Object {
	switch kind {
	case model.KindService:
		if o, err := s.services.Services(namespace).Get(name); err == nil {
			return o
		}
	case model.KindEndpointSlice:
		if o, err := s.slices.EndpointSlices(namespace).Get(name); err == nil {
			return o
		}
	}
	return nil
}

// Listed counts what the informers listed, as log key-value pairs: for the log line at
// -v=0 that ends the wait for the API server (a large cluster's first list can take a
// while).
func (s *Source) Listed() []any {
	svcs, _ := s.services.List(labels.Everything())
	eps, _ := s.slices.List(labels.Everything())
	endpoints := 0
	for _, e := range eps {
		endpoints += len(e.Endpoints)
	}
	kv := []any{"services", len(svcs), "endpointSlices", len(eps), "endpoints", endpoints}
	if s.cidrs != nil {
		cidrs, _ := s.cidrs.List(labels.Everything())
		kv = append(kv, "serviceCIDRs", len(cidrs))
	}
	return kv
}

// NewFromStores is a Source over caches the caller fills (keyed by
// cache.MetaNamespaceKeyFunc) instead of informers, for benchmarks that drive syncs
// themselves and note each change with Add. It is never started; its ServiceCIDRs are
// Config's.
func NewFromStores(cfg Config, services, slices, nodes cache.Indexer, log logr.Logger) *Source {
	return &Source{Tracker: NewTracker(log, time.Now()), cfg: cfg, log: log,
		services: corelisters.NewServiceLister(services), slices: discoverylisters.NewEndpointSliceLister(slices),
		nodes: corelisters.NewNodeLister(nodes)}
}
