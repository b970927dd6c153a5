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
// client beyond it is served once another connection closes.
func TestHealthCheckNodePortConnectionBudget(t *testing.T) {
	s, _ := newServer(t)
	s.limits = httplimit.Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute}
	s.pool = httplimit.NewPool(2)
	p1, p2 := freePort(t), freePort(t)
	if err := s.Sync(map[ServiceName]Service{{"ns", "a"}: {Port: p1, LocalEndpoints: 1}, {"ns", "b"}: {Port: p2, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	c1, _ := keepAlive(t, p1)
	keepAlive(t, p2)

	third := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://127.0.0.1:" + strconv.Itoa(int(p1)) + "/")
		if err == nil {
			resp.Body.Close()
		}
		third <- err
	}()
	select {
	case err := <-third:
		t.Fatalf("a third connection was served while the budget of 2 was held across both ports (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	c1.Close()
	select {
	case err := <-third:
		if err != nil {
			t.Fatalf("third connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was not served after one closed")
	}
}

// Idle keep-alive connections to healthCheckNodePorts are closed after the idle timeout.
func TestHealthCheckNodePortIdleTimeout(t *testing.T) {
	s, _ := newServer(t)
	s.limits = httplimit.Limits{ReadHeaderTimeout: time.Second, IdleTimeout: 300 * time.Millisecond}
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
