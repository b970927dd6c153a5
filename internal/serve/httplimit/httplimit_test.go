package httplimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
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

// At MaxConns open connections a new one is not served until one of them closes.
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
	extra, err := net.Dial("tcp", addr) // completes in the kernel's backlog
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	answered := make(chan error, 1)
	go func() { answered <- request(extra, bufio.NewReader(extra)) }()
	select {
	case err := <-answered:
		t.Fatalf("connection %d served while %d were open (err %v)", max+1, max, err)
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting connection was not served after one closed")
	}
}

// The limits nftproxy runs with are all set.
func TestDefaultsAreBounded(t *testing.T) {
	for name, l := range map[string]Limits{"Health": Health, "Metrics": Metrics, "HealthCheckNodePorts": HealthCheckNodePorts} {
		if l.ReadHeaderTimeout <= 0 || l.ReadTimeout <= 0 || l.WriteTimeout <= 0 || l.IdleTimeout <= 0 || l.MaxHeaderBytes <= 0 || l.MaxConns <= 0 {
			t.Errorf("%s has an unbounded limit: %+v", name, l)
		}
		s := Server(nil, l)
		if s.IdleTimeout != l.IdleTimeout || s.ReadTimeout != l.ReadTimeout || s.WriteTimeout != l.WriteTimeout ||
			s.ReadHeaderTimeout != l.ReadHeaderTimeout || s.MaxHeaderBytes != l.MaxHeaderBytes {
			t.Errorf("%s: Server does not carry the limits: %+v", name, s)
		}
	}
}

// A pool shared by more listeners than it has slots still serves every listener: a
// listener waiting for a client holds no slot.
func TestPoolSharedByMoreListenersThanSlots(t *testing.T) {
	pool := NewPool(2)
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

// pipeListener hands out in-memory connections that claim to come from a given address.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

type fromConn struct {
	net.Conn
	from net.Addr
}

func (c fromConn) RemoteAddr() net.Addr { return c.from }

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero, Port: 10256} }

// dial queues a connection from ip and returns the client's end.
func (l *pipeListener) dial(ip string) net.Conn {
	server, client := net.Pipe()
	l.conns <- fromConn{server, &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
	return client
}

// With LoopbackExempt, clients from elsewhere holding the whole budget do not make a
// client on loopback (the kubelet's probe) wait; without it, they do.
func TestLoopbackExempt(t *testing.T) {
	for _, exempt := range []bool{true, false} {
		ln := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
		l := Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: 2, LoopbackExempt: exempt}
		srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), l)
		done := make(chan struct{})
		go func() { _ = srv.Serve(Listen(ln, l)); close(done) }()
		for _, ip := range []string{"10.244.1.5", "10.244.2.7"} { // take the budget and keep it
			c := ln.dial(ip)
			defer c.Close()
			if err := request(c, bufio.NewReader(c)); err != nil {
				t.Fatal(err)
			}
		}
		answered := make(chan error, 1)
		go func() {
			c := ln.dial("127.0.0.1")
			defer c.Close()
			answered <- request(c, bufio.NewReader(c))
		}()
		select {
		case err := <-answered:
			if !exempt {
				t.Errorf("not exempt: the probe from 127.0.0.1 was served over the budget (err %v)", err)
			} else if err != nil {
				t.Error(err)
			}
		case <-time.After(300 * time.Millisecond):
			if exempt {
				t.Error("loopback exempt: the probe from 127.0.0.1 waited behind the budget")
			}
		}
		srv.Close()
		<-done
	}
}
