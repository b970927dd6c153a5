// Package httplimit bounds what a client can hold of nftproxy's HTTP servers (healthz,
// metrics, healthCheckNodePorts): every phase of a connection has a timeout, headers
// have a size cap, and a server holds at most a fixed number of connections. Without
// them, anyone who can reach 0.0.0.0:10256 (every pod, for example) could keep
// connections open for ever, each costing a goroutine and buffers.
package httplimit

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of one server (or of a group of listeners sharing one connection budget).
type Limits struct {
	ReadHeaderTimeout time.Duration // from accept (or the previous response) to the end of the headers
	ReadTimeout       time.Duration // from accept to the end of the request body
	WriteTimeout      time.Duration // from the end of the headers to the end of the response
	IdleTimeout       time.Duration // a keep-alive connection waiting for its next request
	MaxHeaderBytes    int
	MaxConns          int // connections open at once; further ones wait in the kernel's backlog
	// LoopbackExempt: connections from 127.0.0.0/8 and ::1 (the node itself: the
	// kubelet's probes in manifests/) do not count against MaxConns, so clients from
	// elsewhere that hold the whole budget cannot make the node's own probes wait.
	LoopbackExempt bool
}

// The limits of nftproxy's servers. Probes (kubelet, load balancers, Prometheus) send a
// small request and read a small answer in well under a second; the write timeout leaves
// a metrics scrape of tens of thousands of series room. Connections beyond MaxConns are
// not refused: they wait to be accepted until one closes, which the timeouts bound.
var (
	// Health is the /healthz and /livez server's (0.0.0.0:10256 by default).
	Health = Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10, MaxConns: 256, LoopbackExempt: true}
	// Metrics is the metrics server's (127.0.0.1:10249 by default).
	Metrics = Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 60 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10, MaxConns: 64}
	// HealthCheckNodePorts is the budget shared by all healthCheckNodePort listeners
	// together (one per externalTrafficPolicy Local load balancer).
	HealthCheckNodePorts = Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10, MaxConns: 512}
)

// Server returns an http.Server serving h with l's timeouts and header cap. Serve it on
// a listener from Listen (or Pool.Listener) for the connection bound.
func Server(h http.Handler, l Limits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// Pool is a connection budget that several listeners can share.
type Pool struct{ sem chan struct{} }

// NewPool returns a budget of n connections (n <= 0: unbounded).
func NewPool(n int) *Pool {
	if n <= 0 {
		return &Pool{}
	}
	return &Pool{sem: make(chan struct{}, n)}
}

// Listener wraps ln so that connections accepted through it count against the pool:
// Accept waits while the pool is full.
func (p *Pool) Listener(ln net.Listener) net.Listener {
	if p.sem == nil {
		return ln
	}
	return &listener{Listener: ln, sem: p.sem, done: make(chan struct{})}
}

// Listen wraps ln with a pool of its own of l.MaxConns (and l.LoopbackExempt).
func Listen(ln net.Listener, l Limits) net.Listener {
	wrapped := NewPool(l.MaxConns).Listener(ln)
	if w, ok := wrapped.(*listener); ok {
		w.loopbackExempt = l.LoopbackExempt
	}
	return wrapped
}

type listener struct {
	net.Listener
	sem            chan struct{}
	done           chan struct{}
	closeOnce      sync.Once
	loopbackExempt bool
}

// Accept takes a slot of the budget after the kernel's accept, not before: a listener
// waiting for its next client holds none, so any number of listeners can share a budget.
// While the budget is full the accepted connection waits here, unread (one per
// listener at most), until another closes.
func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.loopbackExempt {
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok && a.IP.IsLoopback() {
			return c, nil
		}
	}
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		c.Close()
		return nil, net.ErrClosed
	}
	return &conn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
