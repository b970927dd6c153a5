package httplimit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testnetns"
)

// Attacks on the connection bound with real TCP sockets, in a throwaway network
// namespace where 10.9.0.0/24 is local: a client can pick any source address in it (a
// host elsewhere, as the server sees it) or 127.0.0.1 (the node itself).

// probeNet is a server in a test namespace and the means to reach it from any source.
type probeNet struct {
	ns   *testnetns.NS
	port int
}

// newProbeNet serves "ok" with limits l on 0.0.0.0 in a new namespace.
func newProbeNet(t *testing.T, l Limits) *probeNet {
	t.Helper()
	ns := testnetns.New(t)
	ns.MustRun(t, "", "ip", "link", "set", "lo", "up")
	ns.MustRun(t, "", "ip", "route", "add", "local", "10.9.0.0/24", "dev", "lo")
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:0"); return err }); err != nil {
		t.Fatal(err)
	}
	srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), l)
	done := make(chan struct{})
	go func() { _ = srv.Serve(Listen(ln, l)); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return &probeNet{ns: ns, port: ln.Addr().(*net.TCPAddr).Port}
}

// dial connects from source address src (to 127.0.0.1 from a loopback source, else to
// 10.9.0.1).
func (p *probeNet) dial(t *testing.T, src string) (net.Conn, error) {
	t.Helper()
	dst := "10.9.0.1"
	if net.ParseIP(src).IsLoopback() {
		dst = "127.0.0.1"
	}
	return p.ns.DialTCP(src, dst, p.port)
}

// hold opens n connections from src that each send an unfinished request and keep it
// open (what an attacker does to a server that closes after each answer). Connections
// the server resets at once are not held.
func (p *probeNet) hold(t *testing.T, src string, n int) {
	t.Helper()
	for i := range n {
		c, err := p.dial(t, src)
		if errors.Is(err, syscall.ECONNRESET) {
			continue
		}
		if err != nil {
			t.Fatalf("attacker connection %d from %s: %v", i, src, err)
		}
		t.Cleanup(func() { c.Close() })
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n") // no final CRLF
	}
}

// probe sends one GET from src and reports whether "ok" came back within 5 s.
func (p *probeNet) probe(t *testing.T, src string) error {
	t.Helper()
	c, err := p.dial(t, src)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || string(body) != "ok" {
		return fmt.Errorf("answer %d %q", resp.StatusCode, body)
	}
	return nil
}

// The healthz server's limits, scaled down: the same shape, fewer connections.
var scaled = Limits{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
	IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10, NoKeepAlive: true,
	MaxConns: 8, MaxConnsPerSource: 4, LoopbackConns: 2}

// One source holding more connections than the whole budget: a probe from the node
// itself and one from another host are still answered, promptly.
func TestOneSourceCannotStarveProbes(t *testing.T) {
	p := newProbeNet(t, scaled)
	p.hold(t, "10.9.0.2", 3*scaled.MaxConns)
	for _, src := range []string{"127.0.0.1", "10.9.0.3"} {
		if err := p.probe(t, src); err != nil {
			t.Errorf("probe from %s while 10.9.0.2 holds %d connections: %v", src, 3*scaled.MaxConns, err)
		}
	}
}

// Sources holding the whole remote budget between them, a few connections each: a new
// source still gets an answer (it takes the slot of a source holding more), and so does
// loopback, whose allowance they cannot use.
func TestManySourcesCannotStarveANewOne(t *testing.T) {
	p := newProbeNet(t, scaled)
	for i := range 4 {
		p.hold(t, "10.9.0."+strconv.Itoa(10+i), scaled.MaxConnsPerSource)
	}
	for _, src := range []string{"10.9.0.3", "127.0.0.1", "10.9.0.4"} {
		if err := p.probe(t, src); err != nil {
			t.Errorf("probe from %s while four sources hold %d connections each: %v", src, scaled.MaxConnsPerSource, err)
		}
	}
}

// Loopback over its own allowance: connections beyond it are closed at once (never
// left waiting), and other hosts are still served.
func TestLoopbackOverItsAllowance(t *testing.T) {
	p := newProbeNet(t, scaled)
	p.hold(t, "127.0.0.1", scaled.LoopbackConns)
	c, err := p.dial(t, "127.0.0.1")
	if err != nil && !errors.Is(err, syscall.ECONNRESET) { // reset before the dial returned
		t.Fatal(err)
	}
	if err == nil {
		defer c.Close()
		if !closedByPeer(c, bufio.NewReader(c), 5*time.Second) {
			t.Error("a loopback connection over the allowance was neither served nor closed within 5 s")
		}
	}
	if err := p.probe(t, "10.9.0.3"); err != nil {
		t.Errorf("probe from 10.9.0.3 while loopback holds its allowance: %v", err)
	}
}
