package healthcheck

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// loopback opens listeners on 127.0.0.1 only and counts them.
type loopback struct{ opened atomic.Int32 }

func (l *loopback) listen(network, addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		return nil, fmt.Errorf("test listener asked for %q, only 127.0.0.1 is allowed", addr)
	}
	ln, err := net.Listen(network, addr)
	if err == nil {
		l.opened.Add(1)
	}
	return ln, err
}

func newServer(t *testing.T) (*Server, *loopback) {
	t.Helper()
	l := &loopback{}
	s := New(l.listen, "127.0.0.1", logr.Discard())
	t.Cleanup(s.Close)
	return s, l
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

type answer struct {
	code   int
	body   string
	weight string
}

var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(port uint16) (answer, error) {
	resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(int(port)) + "/")
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, strings.TrimSpace(string(body)), resp.Header.Get("X-Load-Balancing-Endpoint-Weight")}, err
}

// expect checks that port answers code with kube-proxy's body for name, count and
// healthy, and the count as the load-balancing weight.
func expect(t *testing.T, port uint16, code int, name ServiceName, count int, healthy bool) {
	t.Helper()
	got, err := get(port)
	if err != nil {
		t.Fatalf("GET port %d: %v", port, err)
	}
	want := answer{code: code, weight: strconv.Itoa(count),
		body: fmt.Sprintf(`{"service":{"namespace":%q,"name":%q},"localEndpoints":%d,"serviceProxyHealthy":%v}`,
			name.Namespace, name.Name, count, healthy)}
	if got != want {
		t.Errorf("port %d answered %+v, want %+v", port, got, want)
	}
}

func expectRefused(t *testing.T, port uint16) {
	t.Helper()
	if _, err := get(port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("port %d: got %v, want connection refused", port, err)
	}
}

var (
	web = ServiceName{Namespace: "shop", Name: "web"}
	api = ServiceName{Namespace: "shop", Name: "api"}
)

func TestServerLifecycle(t *testing.T) {
	s, l := newServer(t)
	pWeb, pAPI := freePort(t), freePort(t)

	if err := s.Sync(map[ServiceName]Service{web: {Port: pWeb, LocalEndpoints: 2}, api: {Port: pAPI}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	expect(t, pWeb, http.StatusOK, web, 2, true)
	expect(t, pAPI, http.StatusServiceUnavailable, api, 0, true)

	t.Run("counts change in place", func(t *testing.T) {
		if err := s.Sync(map[ServiceName]Service{web: {Port: pWeb}, api: {Port: pAPI, LocalEndpoints: 3}}); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		expect(t, pWeb, http.StatusServiceUnavailable, web, 0, true)
		expect(t, pAPI, http.StatusOK, api, 3, true)
		if n := l.opened.Load(); n != 2 {
			t.Errorf("%d listeners opened, want 2: a count change must not reopen", n)
		}
	})
	t.Run("removed service is closed", func(t *testing.T) {
		if err := s.Sync(map[ServiceName]Service{web: {Port: pWeb, LocalEndpoints: 1}}); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		expectRefused(t, pAPI)
		expect(t, pWeb, http.StatusOK, web, 1, true)
	})
	t.Run("port change moves the listener", func(t *testing.T) {
		pNew := freePort(t)
		if err := s.Sync(map[ServiceName]Service{web: {Port: pNew, LocalEndpoints: 1}}); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		expectRefused(t, pWeb)
		expect(t, pNew, http.StatusOK, web, 1, true)
		pWeb = pNew
	})
	t.Run("close", func(t *testing.T) {
		s.Close()
		expectRefused(t, pWeb)
		if err := s.Sync(map[ServiceName]Service{web: {Port: pWeb}}); err == nil {
			t.Error("Sync after Close succeeded")
		}
	})
}

func TestServerPortTaken(t *testing.T) {
	s, l := newServer(t)
	pWeb := freePort(t)
	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	pAPI := uint16(squatter.Addr().(*net.TCPAddr).Port)
	want := map[ServiceName]Service{web: {Port: pWeb, LocalEndpoints: 1}, api: {Port: pAPI, LocalEndpoints: 1}}

	err = s.Sync(want)
	if err == nil || !strings.Contains(err.Error(), "shop/api") || !strings.Contains(err.Error(), strconv.Itoa(int(pAPI))) ||
		strings.Contains(err.Error(), "shop/web") {
		t.Fatalf("Sync = %v, want an error naming shop/api and port %d only", err, pAPI)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("Sync = %v, want it to wrap EADDRINUSE", err)
	}
	expect(t, pWeb, http.StatusOK, web, 1, true)

	squatter.Close()
	if err := s.Sync(want); err != nil {
		t.Fatalf("Sync after the port freed up: %v", err)
	}
	expect(t, pAPI, http.StatusOK, api, 1, true)
	expect(t, pWeb, http.StatusOK, web, 1, true)
	if n := l.opened.Load(); n != 2 {
		t.Errorf("%d listeners opened, want 2: the retry must not reopen web", n)
	}
}

func TestServerPortsSwapped(t *testing.T) {
	s, _ := newServer(t)
	p1, p2 := freePort(t), freePort(t)
	if err := s.Sync(map[ServiceName]Service{web: {Port: p1, LocalEndpoints: 1}, api: {Port: p2, LocalEndpoints: 2}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := s.Sync(map[ServiceName]Service{web: {Port: p2, LocalEndpoints: 1}, api: {Port: p1, LocalEndpoints: 2}}); err != nil {
		t.Fatalf("Sync swapping ports: %v", err)
	}
	expect(t, p1, http.StatusOK, api, 2, true)
	expect(t, p2, http.StatusOK, web, 1, true)
}

func TestServerProxyUnhealthy(t *testing.T) {
	s, _ := newServer(t)
	var healthy atomic.Bool
	s.SetProxyHealth(healthy.Load)
	p := freePort(t)
	if err := s.Sync(map[ServiceName]Service{web: {Port: p, LocalEndpoints: 2}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	expect(t, p, http.StatusServiceUnavailable, web, 2, false)
	healthy.Store(true)
	expect(t, p, http.StatusOK, web, 2, true)
}
