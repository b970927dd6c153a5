// Package healthcheck serves the healthCheckNodePort of each externalTrafficPolicy Local
// load balancer: load balancers probe it on every node and send traffic only to the
// nodes answering 200, that is, the nodes with a local endpoint.
//
// Server is the side effect: it opens, updates and closes one HTTP listener per service
// from the map it is given. FromSnapshot, pure, computes that map.
package healthcheck

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"

	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
)

// ServiceName identifies a service: the health check is per service, not per port.
type ServiceName struct {
	Namespace string
	Name      string
}

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Service is what the health check of one service serves.
type Service struct {
	Port           uint16 // the healthCheckNodePort
	LocalEndpoints int    // ready endpoints on this node
}

// Server runs the health-check listeners. Its methods are safe for concurrent use.
type Server struct {
	listen func(network, addr string) (net.Listener, error)
	bindIP string
	log    logr.Logger

	proxyHealthy atomic.Pointer[func() bool]

	// every listener's timeouts, and one connection budget for all of them together
	limits httplimit.Limits
	pool   *httplimit.Pool

	mu       sync.Mutex
	closed   bool
	services map[ServiceName]*instance
}

// New returns a Server that opens its listeners with listen (net.Listen in production)
// on bindIP ("" for every address of the node).
func New(listen func(network, addr string) (net.Listener, error), bindIP string, log logr.Logger) *Server {
	pool := httplimit.NewPool(httplimit.HealthCheckNodePorts)
	pool.SetLog(log, "healthCheckNodePorts")
	return &Server{listen: listen, bindIP: bindIP, log: log, services: map[ServiceName]*instance{},
		limits: httplimit.HealthCheckNodePorts, pool: pool}
}

// SetProxyHealth makes every health check answer 503 while healthy returns false, as
// kube-proxy does when its own syncs are late, so that load balancers move traffic off
// a node whose rules may be out of date. Without it the proxy counts as healthy.
func (s *Server) SetProxyHealth(healthy func() bool) { s.proxyHealthy.Store(&healthy) }

func (s *Server) isProxyHealthy() bool {
	f := s.proxyHealthy.Load()
	return f == nil || (*f)()
}

// Sync makes the listeners match want: it closes those of services that are gone or
// moved to another port, opens those of new services, and updates the endpoint counts
// of the others without touching their listeners. A port that cannot be opened is
// reported in the error, naming the service, and retried on the next Sync; the other
// services are served regardless.
func (s *Server) Sync(want map[ServiceName]Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("health-check server is closed")
	}
	// Close first, so that a port moving from one service to another can be reopened.
	for name, inst := range s.services {
		if svc, ok := want[name]; !ok || svc.Port != inst.port {
			s.closeInstance(inst)
			delete(s.services, name)
		}
	}
	var errs []error
	for _, name := range sortedNames(want) {
		svc := want[name]
		if inst := s.services[name]; inst != nil {
			inst.localEndpoints.Store(int64(svc.LocalEndpoints))
			continue
		}
		inst, err := s.open(name, svc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.services[name] = inst
	}
	return errors.Join(errs...)
}

// Close closes every listener and waits for them to stop; Sync fails afterwards.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, inst := range s.services {
		s.closeInstance(inst)
		delete(s.services, name)
	}
	s.closed = true
}

func sortedNames(m map[ServiceName]Service) []ServiceName {
	names := make([]ServiceName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b ServiceName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return names
}

// instance is the listener of one service.
type instance struct {
	name           ServiceName
	port           uint16
	localEndpoints atomic.Int64
	srv            *http.Server
	done           chan struct{} // closed when Serve has returned
}

func (s *Server) open(name ServiceName, svc Service) (*instance, error) {
	addr := net.JoinHostPort(s.bindIP, strconv.Itoa(int(svc.Port)))
	ln, err := s.listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health check of service %s on port %d: %w", name, svc.Port, err)
	}
	inst := &instance{name: name, port: svc.Port, done: make(chan struct{})}
	inst.localEndpoints.Store(int64(svc.LocalEndpoints))
	// Load balancers' probes come from outside the cluster: timeouts, no keep-alive and
	// a connection budget shared by every service's listener (with a cap per source
	// address and an allowance of its own for loopback) bound what clients can hold
	// open, and a connection over the bound is closed at once, never left waiting.
	inst.srv = httplimit.Server(s.handler(inst), s.limits)
	s.log.V(2).Info("Opening health check", "service", name, "address", ln.Addr())
	go s.serve(inst, s.pool.Listener(ln))
	return inst, nil
}

func (s *Server) serve(inst *instance, ln net.Listener) {
	defer close(inst.done)
	if err := inst.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error(err, "Health check stopped", "service", inst.name, "port", inst.port)
	}
}

// closeInstance closes the listener and its connections, and waits until the port is
// free.
func (s *Server) closeInstance(inst *instance) {
	s.log.V(2).Info("Closing health check", "service", inst.name, "port", inst.port)
	if err := inst.srv.Close(); err != nil {
		s.log.Error(err, "Closing health check", "service", inst.name, "port", inst.port)
	}
	<-inst.done
}

// response is kube-proxy's health-check body.
type response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// handler answers any request: 200 when the node has a local endpoint and the proxy is
// healthy, else 503; the body and the X-Load-Balancing-Endpoint-Weight header carry the
// count.
func (s *Server) handler(inst *instance) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var body response
		body.Service.Namespace, body.Service.Name = inst.name.Namespace, inst.name.Name
		body.LocalEndpoints = int(inst.localEndpoints.Load())
		body.ServiceProxyHealthy = s.isProxyHealthy()
		code := http.StatusServiceUnavailable
		if body.LocalEndpoints > 0 && body.ServiceProxyHealthy {
			code = http.StatusOK
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(body.LocalEndpoints))
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}
