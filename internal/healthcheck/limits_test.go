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

// Idle keep-alive connections to healthCheckNodePorts are closed after the idle timeout,
// and all the ports together hold at most the shared budget of connections.
func TestHealthCheckNodePortLimits(t *testing.T) {
	s, _ := newServer(t)
	s.limits = httplimit.Limits{ReadHeaderTimeout: time.Second, IdleTimeout: 3 * time.Second} // long enough that a loaded machine cannot idle out c1 before the third client is checked
	s.pool = httplimit.NewPool(2)
	p1, p2 := freePort(t), freePort(t)
	if err := s.Sync(map[ServiceName]Service{{"ns", "a"}: {Port: p1, LocalEndpoints: 1}, {"ns", "b"}: {Port: p2, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	c1, r1 := keepAlive(t, p1)
	c2, r2 := keepAlive(t, p2)

	// The budget of 2 is used up across the two ports: a third client waits.
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
		t.Fatalf("a third connection was served while the budget of 2 was held (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}

	// The idle timeout closes the two held connections, which lets the third in.
	for i, c := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{c1, r1}, {c2, r2}} {
		_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle keep-alive connection %d not closed by the server: %v", i, err)
		}
	}
	select {
	case err := <-third:
		if err != nil {
			t.Fatalf("third connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was never served")
	}
}
