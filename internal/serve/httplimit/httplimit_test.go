package httplimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serve starts a server with limits l on a loopback port and returns its address.
func serve(t *testing.T, l Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), l)
	done := make(chan struct{})
	go func() { _ = srv.Serve(Listen(ln, l)); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

// request sends one keep-alive GET on c and reads the answer.
func request(c net.Conn, r *bufio.Reader) error {
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// closedByPeer waits up to d for the server to close c (EOF or reset).
func closedByPeer(c net.Conn, r *bufio.Reader, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := r.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// 300 idle keep-alive connections (each after one request) are closed by the server
// once the idle timeout passes, and not before.
func TestIdleKeepAliveConnectionsAreClosed(t *testing.T) {
	const n = 300
	idle := 500 * time.Millisecond
	addr := serve(t, Limits{ReadHeaderTimeout: time.Second, IdleTimeout: idle, MaxConns: 1000})
	conns := make([]net.Conn, n)
	readers := make([]*bufio.Reader, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i], readers[i] = c, bufio.NewReader(c)
		if err := request(c, readers[i]); err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
	}
	// Kept alive right after the answer (the first one was answered last of all, so
	// check the last few, which have idled the least).
	if closedByPeer(conns[n-1], readers[n-1], idle/5) {
		t.Fatal("the connection was closed right after its answer: not a keep-alive test")
	}
	var wg sync.WaitGroup
	open := make(chan int, n)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !closedByPeer(conns[i], readers[i], idle+5*time.Second) {
				open <- i
			}
		}()
	}
	wg.Wait()
	close(open)
	if left := len(open); left > 0 {
		t.Errorf("%d of %d idle keep-alive connections still open %v after the idle timeout", left, n, 5*time.Second)
	}
}

// A client that never finishes its headers is cut off after ReadHeaderTimeout.
func TestSlowHeadersAreCutOff(t *testing.T) {
	addr := serve(t, Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute, MaxConns: 10})
	// The server's timer starts when it accepts, after the dial began: timed from
	// before the dial, the close can never come early, however slow the dial and write.
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil { // no final CRLF
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if !closedByPeer(c, r, 5*time.Second) {
		t.Fatal("a connection with unfinished headers is still open after 5 s")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("closed after %v, before the header timeout", d)
	}
}

// At MaxConns open connections a new one is closed at once, not left waiting, and one
// after a held connection closed is served.
func TestConnectionBound(t *testing.T) {
	const max = 4
	addr := serve(t, Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: max})
	var held []net.Conn
	for range max {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := request(c, bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// completes in the kernel's backlog; the server's reset may come before the dial
	// returns
	extra, err := net.Dial("tcp", addr)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	if err == nil {
		defer extra.Close()
		if !closedByPeer(extra, bufio.NewReader(extra), 5*time.Second) {
			t.Fatalf("connection %d neither served nor closed within 5 s while %d were open: it waits", max+1, max)
		}
	}
	held[0].Close()
	// the release follows the server's read of the close: retry for a bounded while
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			err = request(c, bufio.NewReader(c))
			c.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served within 5 s after one of %d closed: %v", max, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The limits nftproxy runs with are all set, and the probe servers close each
// connection after its answer.
func TestDefaultsAreBounded(t *testing.T) {
	for name, l := range map[string]Limits{"Health": Health, "Metrics": Metrics, "HealthCheckNodePorts": HealthCheckNodePorts} {
		if l.ReadHeaderTimeout <= 0 || l.ReadTimeout <= 0 || l.WriteTimeout <= 0 || l.IdleTimeout <= 0 || l.MaxHeaderBytes <= 0 ||
			l.MaxConns <= 0 || l.MaxConnsPerSource <= 0 || l.LoopbackConns <= 0 {
			t.Errorf("%s has an unbounded limit: %+v", name, l)
		}
		if l.MaxConnsPerSource*2 > l.MaxConns {
			t.Errorf("%s: one source may hold %d of %d connections", name, l.MaxConnsPerSource, l.MaxConns)
		}
		s := Server(nil, l)
		if s.IdleTimeout != l.IdleTimeout || s.ReadTimeout != l.ReadTimeout || s.WriteTimeout != l.WriteTimeout ||
			s.ReadHeaderTimeout != l.ReadHeaderTimeout || s.MaxHeaderBytes != l.MaxHeaderBytes {
			t.Errorf("%s: Server does not carry the limits: %+v", name, s)
		}
	}
	if !Health.NoKeepAlive || !HealthCheckNodePorts.NoKeepAlive {
		t.Error("the probe servers keep connections alive")
	}
}

// With NoKeepAlive the server closes a connection after its answer.
func TestNoKeepAlive(t *testing.T) {
	addr := serve(t, Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, NoKeepAlive: true, MaxConns: 10})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := request(c, r); err != nil {
		t.Fatal(err)
	}
	if !closedByPeer(c, r, 5*time.Second) {
		t.Fatal("the connection is still open 5 s after its answer")
	}
}

// A pool shared by more listeners than it has slots still serves every listener: a
// listener waiting for a client holds no slot.
func TestPoolSharedByMoreListenersThanSlots(t *testing.T) {
	pool := NewPool(Limits{MaxConns: 2})
	var addrs []string
	for range 5 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := Limits{ReadHeaderTimeout: time.Second, IdleTimeout: time.Minute}
		srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), l)
		done := make(chan struct{})
		go func() { _ = srv.Serve(pool.Listener(ln)); close(done) }()
		t.Cleanup(func() { srv.Close(); <-done })
		addrs = append(addrs, ln.Addr().String())
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for round := range 2 {
		for _, a := range addrs {
			resp, err := client.Get("http://" + a + "/")
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, a, err)
			}
			resp.Body.Close()
		}
	}
}

// The budget's accounting, without sockets: per-source cap, loopback apart, eviction of
// the largest holder's oldest connection for a source holding fewer.
func TestBudgetAccounting(t *testing.T) {
	p := NewPool(Limits{MaxConns: 4, MaxConnsPerSource: 3, LoopbackConns: 1})
	var open []net.Conn
	from := func(ip string) net.Conn {
		server, client := net.Pipe()
		t.Cleanup(func() { client.Close(); server.Close() })
		c := p.admit(fromConn{server, &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
		if c != nil {
			open = append(open, c)
		}
		return c
	}
	for range 3 {
		if from("10.0.0.1") == nil {
			t.Fatal("refused under the per-source cap")
		}
	}
	if from("10.0.0.1") != nil {
		t.Error("a fourth connection from one source admitted over the per-source cap of 3")
	}
	if from("10.0.0.2") == nil { // 4 of 4
		t.Fatal("refused under the budget")
	}
	// full: 10.0.0.3 (none) takes 10.0.0.1's oldest (3 > 0+1)
	if from("10.0.0.3") == nil {
		t.Fatal("a new source was refused while one source held 3 of 4 slots")
	}
	if r, e := p.Closed(); r != 1 || e != 1 {
		t.Errorf("closed: %d refused, %d evicted; want 1, 1", r, e)
	}
	// 10.0.0.1: 2, .2: 1, .3: 1 — full; .4 (none) takes another of .1's (2 > 1)
	if from("10.0.0.4") == nil {
		t.Fatal("a new source was refused while one source held 2 of 4 slots")
	}
	// now 1 each: no source may take another's
	if from("10.0.0.5") != nil {
		t.Error("admitted over a full budget held one connection per source")
	}
	// loopback apart: its own slot, then refused; remote closes don't matter to it
	if from("127.0.0.1") == nil {
		t.Fatal("loopback refused while remote sources held the whole remote budget")
	}
	if from("127.0.0.1") != nil {
		t.Error("loopback admitted over its allowance of 1")
	}
	// a closed connection frees its slot
	open[len(open)-2].Close() // 10.0.0.4's
	if from("10.0.0.5") == nil {
		t.Error("refused after a connection closed")
	}
}

type fromConn struct {
	net.Conn
	from net.Addr
}

func (c fromConn) RemoteAddr() net.Addr { return c.from }
