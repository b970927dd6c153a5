package source

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
)

// APIErrorLogInterval is how often, at most, a failing API request is logged at -v=0
// (the others are counted in the next line's "suppressed").
const APIErrorLogInterval = 10 * time.Second

// apiErrors logs failed API requests (list, watch, discovery) at -v=0 with the server's
// address, at most once per APIErrorLogInterval.
type apiErrors struct {
	log    logr.Logger
	server string
	now    func() time.Time

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (a *apiErrors) report(what string, err error) {
	a.mu.Lock()
	now := a.now()
	if !a.last.IsZero() && now.Sub(a.last) < APIErrorLogInterval {
		a.suppressed++
		a.mu.Unlock()
		return
	}
	n := a.suppressed
	a.last, a.suppressed = now, 0
	a.mu.Unlock()
	a.log.Error(err, "API server request failed; retrying", "server", a.server, "request", what, "suppressedSinceLast", n)
}

// watchErrors is the informers' watch error handler: it replaces client-go's default,
// which logs every retry, with apiErrors' rate-limited line. A watch that the server
// closes normally or expires is not an error.
func (a *apiErrors) watchErrors(_ context.Context, r *cache.Reflector, err error) {
	switch {
	case errors.Is(err, io.EOF):
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		a.log.V(4).Info("Watch expired", "type", r.TypeDescription(), "err", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		a.log.V(1).Info("Watch closed with unexpected EOF", "type", r.TypeDescription(), "err", err)
	default:
		a.report("list/watch "+r.TypeDescription(), err)
	}
}

// Discovery of ServiceCIDRs is retried with this capped exponential backoff while the
// API cannot answer.
const (
	discoveryBackoffMin = time.Second
	discoveryBackoffMax = 30 * time.Second
	discoveryTimeout    = 10 * time.Second
)

// servesServiceCIDRs asks the API whether it has networking.k8s.io/v1 ServiceCIDRs (an
// informer for a resource the API lacks would never sync). It answers false only on a
// definite answer: the group version is not found, or its resources lack servicecidrs.
// Any other failure is an error, to be retried.
func servesServiceCIDRs(ctx context.Context, d discovery.DiscoveryInterface) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	var list *metav1.APIResourceList
	var err error
	if dc, ok := d.(discovery.ServerResourcesInterfaceWithContext); ok {
		list, err = dc.ServerResourcesForGroupVersionWithContext(ctx, "networking.k8s.io/v1")
	} else {
		list, err = d.ServerResourcesForGroupVersion("networking.k8s.io/v1")
	}
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }), nil
}

// discoverServiceCIDRs decides, retrying until the API answers, whether ServiceCIDRs are
// served; if so it starts their informer and waits for its cache. ready is closed once
// s.cidrs is final (nil: --service-cluster-ip-range is used). It returns when ctx ends.
func (s *Source) discoverServiceCIDRs(ctx context.Context, ready chan<- struct{}) {
	backoff := s.DiscoveryBackoff
	for {
		served, err := servesServiceCIDRs(ctx, s.client.Discovery())
		if err == nil {
			if !served {
				s.log.Info("The API server does not serve networking.k8s.io/v1 ServiceCIDRs; using --service-cluster-ip-range", "cidrs", s.cfg.ServiceCIDRs)
				close(ready)
				return
			}
			break
		}
		if ctx.Err() != nil {
			return
		}
		s.apiErrs.report("discovery networking.k8s.io/v1", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, discoveryBackoffMax)
	}
	inf := s.cidrFactory.Networking().V1().ServiceCIDRs()
	s.slimInCache(inf.Informer())
	s.watch(inf.Informer(), Other)
	lister := inf.Lister()
	s.cidrFactory.Start(ctx.Done())
	select { // not cache.WaitForCacheSync, which polls every 100 ms
	case <-ctx.Done():
		return
	case <-inf.Informer().HasSyncedChecker().Done():
	}
	s.cidrs = lister // read by the sync loop only after ready is closed
	s.log.V(2).Info("Watching ServiceCIDRs")
	close(ready)
}

// WaitForCaches waits until every informer has synced and ServiceCIDR discovery is
// decided, however long the API takes: while it waits it logs at -v=0 every
// APIErrorLogInterval what it still waits for. It returns false when ctx ends first.
// It waits on the informers' completion channels, not by polling: a poll every 100 ms
// (client-go's WaitForCacheSync) cost the cold start 50 ms on average.
func (s *Source) WaitForCaches(ctx context.Context) bool {
	cidrsReady := s.cidrsReady
	start := time.Now()
	type wait struct {
		what string
		done <-chan struct{}
	}
	waits := make([]wait, 0, len(s.informers)+1)
	for _, inf := range s.informers {
		waits = append(waits, wait{inf.what, inf.informer.HasSyncedChecker().Done()})
	}
	waits = append(waits, wait{"ServiceCIDR discovery", cidrsReady})
	tick := time.NewTicker(APIErrorLogInterval)
	defer tick.Stop()
	for i := 0; i < len(waits); {
		select {
		case <-ctx.Done():
			return false
		case <-waits[i].done:
			i++
		case <-tick.C:
			var missing []string
			for _, w := range waits[i:] {
				select {
				case <-w.done:
				default:
					missing = append(missing, w.what)
				}
			}
			s.log.Info("Still waiting for the API server before the first sync", "server", s.cfg.APIServer,
				"waited", time.Since(start).Round(time.Second), "waitingFor", missing)
		}
	}
	return true
}
