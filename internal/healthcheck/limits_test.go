package healthcheck

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
)

// keepAlive opens a connection to port, makes one keep-alive request and returns the
// connection, still open.
func keepAlive(t *testing.T, port uint16) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c, r
}

// All healthCheckNodePorts together hold at most the shared budget of connections: a
// client beyond it is closed at once (never left waiting), and served once another
// connection closed.
func TestHealthCheckNodePortConnectionBudget(t *testing.T) {
	s, _ := newServer(t)
	s.limits = httplimit.Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute}
	s.pool = httplimit.NewPool(httplimit.Limits{MaxConns: 2})
	p1, p2 := freePort(t), freePort(t)
	if err := s.Sync(map[ServiceName]Service{{"ns", "a"}: {Port: p1, LocalEndpoints: 1}, {"ns", "b"}: {Port: p2, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	c1, _ := keepAlive(t, p1)
	keepAlive(t, p2)

	third, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(p1)))
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(third).ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection, over the budget of 2 held across both ports, was not closed at once: %v", err)
	}
	c1.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(int(p1)) + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served within 5 s after one of the budget closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Idle keep-alive connections to healthCheckNodePorts are closed after the idle timeout.
func TestHealthCheckNodePortIdleTimeout(t *testing.T) {
	s, _ := newServer(t)
	s.limits = httplimit.Limits{ReadHeaderTimeout: time.Second, IdleTimeout: 300 * time.Millisecond}
	s.pool = httplimit.NewPool(httplimit.Limits{LoopbackConns: 100})
	p := freePort(t)
	if err := s.Sync(map[ServiceName]Service{{"ns", "a"}: {Port: p, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	const n = 50
	type held struct {
		c net.Conn
		r *bufio.Reader
	}
	var conns []held
	for range n {
		c, r := keepAlive(t, p)
		conns = append(conns, held{c, r})
	}
	for i, c := range conns {
		_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("idle keep-alive connection %d of %d not closed by the server: %v", i, n, err)
		}
	}
}
