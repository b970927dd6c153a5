// Package httplimit bounds what a client can hold of nftproxy's HTTP servers (healthz,
// metrics, healthCheckNodePorts): every phase of a connection has a timeout, headers
// have a size cap, and a server holds at most a fixed number of connections. Without
// them, anyone who can reach 0.0.0.0:10256 (every pod, for example) could keep
// connections open for ever, each costing a goroutine and buffers.
//
// The bound must never cost a prober its answer: the accept loop never waits (a
// connection over the bound is closed at once, and the loop accepts the next one), the
// node's own connections (loopback: the kubelet's probes) have an allowance of their
// own that other clients cannot use, one source address holds at most a share of the
// budget, and a source with few connections takes the slot of one holding many when the
// budget is full. To hold every slot, a client needs as many source addresses as there
// are slots.
package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Limits of one server (or of a group of listeners sharing one connection budget).
type Limits struct {
	ReadHeaderTimeout time.Duration // from accept (or the previous response) to the end of the headers
	ReadTimeout       time.Duration // from accept to the end of the request body
	WriteTimeout      time.Duration // from the end of the headers to the end of the response
	IdleTimeout       time.Duration // a keep-alive connection waiting for its next request
	MaxHeaderBytes    int
	// NoKeepAlive: the server closes every connection after its response. Probes need
	// no keep-alive; without it a client can hold a slot only while it sends one
	// request, at most ReadTimeout.
	NoKeepAlive bool
	// MaxConns: connections from other hosts open at once (0: unbounded). A connection
	// over it is closed at once, unless its source holds fewer connections than the
	// source holding the most, whose oldest connection is then closed instead.
	MaxConns int
	// MaxConnsPerSource: connections from one source address open at once; further
	// ones are closed at once (0: no cap but MaxConns).
	MaxConnsPerSource int
	// LoopbackConns: connections from the node itself (127.0.0.0/8, ::1) have this
	// allowance of their own, which MaxConns does not include and clients from
	// elsewhere cannot use (0: loopback counts as any other source).
	LoopbackConns int
}

// The limits of nftproxy's servers. Probes (kubelet, load balancers, Prometheus) send a
// small request and read a small answer in well under a second; the write timeout leaves
// a metrics scrape of tens of thousands of series room.
var (
	// Health is the /healthz and /livez server's (0.0.0.0:10256 by default).
	Health = Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10, NoKeepAlive: true,
		MaxConns: 256, MaxConnsPerSource: 16, LoopbackConns: 32}
	// Metrics is the metrics server's (127.0.0.1:10249 by default, where every client
	// is on loopback). Prometheus keeps its connection alive between scrapes.
	Metrics = Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 60 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		MaxConns: 64, MaxConnsPerSource: 16, LoopbackConns: 64}
	// HealthCheckNodePorts is the budget shared by all healthCheckNodePort listeners
	// together (one per externalTrafficPolicy Local load balancer). A load balancer
	// probes each of them from the same few addresses: the per-source cap leaves it
	// room for 64 probes at once.
	HealthCheckNodePorts = Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10, NoKeepAlive: true,
		MaxConns: 512, MaxConnsPerSource: 64, LoopbackConns: 32}
)

// Server returns an http.Server serving h with l's timeouts, header cap and keep-alive
// setting. Serve it on a listener from Listen (or Pool.Listener) for the connection
// bound.
func Server(h http.Handler, l Limits) *http.Server {
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
	s.SetKeepAlivesEnabled(!l.NoKeepAlive)
	return s
}

// Pool is a connection budget that several listeners can share: MaxConns,
// MaxConnsPerSource and LoopbackConns of a Limits.
type Pool struct {
	remote, loopback *budget // loopback nil: loopback counts as remote

	// isLoopback tells the node's own connections (tests replace it)
	isLoopback func(netip.Addr) bool

	refused, evicted atomic.Uint64
	logMu            sync.Mutex
	log              logr.Logger
	logName          string
	lastLog          time.Time
	loggedRefused    uint64
	loggedEvicted    uint64
}

// NewPool returns the budget of l (every bound 0: unbounded).
func NewPool(l Limits) *Pool {
	p := &Pool{isLoopback: netip.Addr.IsLoopback, log: logr.Discard()}
	if l.MaxConns > 0 || l.MaxConnsPerSource > 0 {
		p.remote = newBudget(l.MaxConns, l.MaxConnsPerSource)
	}
	if l.LoopbackConns > 0 {
		p.loopback = newBudget(l.LoopbackConns, 0)
	}
	return p
}

// SetLog makes the pool log, at most every logEvery, how many connections it closed
// over the bound since the last line, as the server name's.
func (p *Pool) SetLog(log logr.Logger, name string) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	p.log, p.logName = log, name
}

// logEvery spaces the pool's log lines about closed connections.
const logEvery = 30 * time.Second

// Closed returns how many connections the pool closed at once because their source or
// the budget was full (refused), and how many open ones it closed to make room for a
// source holding fewer (evicted).
func (p *Pool) Closed() (refused, evicted uint64) { return p.refused.Load(), p.evicted.Load() }

func (p *Pool) noteClosed(from netip.Addr) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	if time.Since(p.lastLog) < logEvery {
		return
	}
	r, e := p.Closed()
	p.log.Info("Closed connections over the connection bound", "server", p.logName,
		"refused", r-p.loggedRefused, "evicted", e-p.loggedEvicted, "lastFrom", from.String(), "since", p.lastLog)
	p.lastLog, p.loggedRefused, p.loggedEvicted = time.Now(), r, e
}

// Listener wraps ln so that connections accepted through it count against the pool.
// Its Accept never waits for a slot: a connection over the bound is closed at once.
func (p *Pool) Listener(ln net.Listener) net.Listener {
	if p.remote == nil && p.loopback == nil {
		return ln
	}
	return &listener{Listener: ln, pool: p}
}

// Listen wraps ln with a pool of its own of l.
func Listen(ln net.Listener, l Limits) net.Listener { return NewPool(l).Listener(ln) }

type listener struct {
	net.Listener
	pool *Pool
}

// Accept returns the next connection within the bound. Connections over it are closed
// here, at once (with a reset: nothing of them lingers), and the loop goes on to the
// next one: a full budget never delays a connection that fits.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if admitted := l.pool.admit(c); admitted != nil {
			return admitted, nil
		}
	}
}

// sourceOf returns the connection's source address (unmapped), or the zero Addr.
func sourceOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// admit counts c against its budget, or closes it and returns nil.
func (p *Pool) admit(c net.Conn) net.Conn {
	src := sourceOf(c)
	b := p.remote
	if p.loopback != nil && src.IsValid() && p.isLoopback(src) {
		b = p.loopback
	}
	if b == nil { // loopback has an allowance, the rest is unbounded
		return c
	}
	pc := &conn{Conn: c, budget: b, src: src}
	evict, ok := b.take(pc)
	if !ok {
		p.refused.Add(1)
		p.noteClosed(src)
		reset(c)
		return nil
	}
	if evict != nil {
		p.evicted.Add(1)
		p.noteClosed(evict.src)
		reset(evict.Conn) // its server goroutine sees the error and closes it, a no-op
	}
	return pc
}

// reset closes c with a TCP reset, so that neither side keeps state of it.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// budget is one allowance of connections, with a cap per source address.
type budget struct {
	mu        sync.Mutex
	max       int // 0: unbounded
	perSource int // 0: no cap per source
	open      int
	bySource  map[netip.Addr][]*conn // open connections, oldest first
}

func newBudget(max, perSource int) *budget {
	return &budget{max: max, perSource: perSource, bySource: map[netip.Addr][]*conn{}}
}

// take counts c, or reports that it does not fit. When the budget is full and c's
// source holds fewer connections than the source holding the most, less one, that
// source's oldest connection gives way: evict, which the caller closes.
func (b *budget) take(c *conn) (evict *conn, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	mine := len(b.bySource[c.src])
	if b.perSource > 0 && mine >= b.perSource {
		return nil, false
	}
	if b.max > 0 && b.open >= b.max {
		var top netip.Addr
		most := 0
		for s, cs := range b.bySource {
			if len(cs) > most {
				top, most = s, len(cs)
			}
		}
		if most <= mine+1 {
			return nil, false // every source holds about as many as c's: no fairer
		}
		evict = b.bySource[top][0]
		b.removeLocked(evict)
	}
	b.open++
	b.bySource[c.src] = append(b.bySource[c.src], c)
	c.counted = true
	return evict, true
}

// release uncounts c if it still counts.
func (b *budget) release(c *conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removeLocked(c)
}

func (b *budget) removeLocked(c *conn) {
	if !c.counted {
		return
	}
	c.counted = false
	b.open--
	cs := b.bySource[c.src]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(b.bySource, c.src)
	} else {
		b.bySource[c.src] = cs
	}
}

type conn struct {
	net.Conn
	budget  *budget
	src     netip.Addr
	counted bool // guarded by budget.mu
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.budget.release(c)
	return err
}
