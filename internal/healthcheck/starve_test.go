package healthcheck

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
	"github.com/nftproxy/nftproxy/internal/testnetns"
)

// An attack on the healthCheckNodePorts' shared budget with real TCP sockets, in a
// throwaway network namespace where 10.9.0.0/24 is local (any source address in it is
// another host, as the server sees it).

// A tenant holding, from one pod's address, more connections than the whole budget of
// every healthCheckNodePort (unfinished requests, the most a client can hold once the
// server closes after each answer): a load balancer's probe from another address, and
// a probe from the node itself, still get the service's answer within 5 s.
func TestHealthCheckNodePortsNotStarvedByOneSource(t *testing.T) {
	ns := testnetns.New(t)
	ns.MustRun(t, "", "ip", "link", "set", "lo", "up")
	ns.MustRun(t, "", "ip", "route", "add", "local", "10.9.0.0/24", "dev", "lo")
	listen := func(network, addr string) (ln net.Listener, err error) {
		err = ns.Do(func() (err error) { ln, err = net.Listen(network, addr); return err })
		return ln, err
	}
	s := New(listen, "", logr.Discard())
	t.Cleanup(s.Close)
	// the production limits' shape, scaled down (the production budget is 512)
	l := httplimit.HealthCheckNodePorts
	l.MaxConns, l.MaxConnsPerSource, l.LoopbackConns = 8, 4, 2
	s.limits, s.pool = l, httplimit.NewPool(l)
	const victim, tenant = 31001, 31002
	if err := s.Sync(map[ServiceName]Service{{"victim", "web"}: {Port: victim, LocalEndpoints: 1}, {"tenant", "x"}: {Port: tenant, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 * l.MaxConns {
		c, err := ns.DialTCP("10.9.0.66", "10.9.0.1", int([]uint16{victim, tenant}[i%2]))
		if errors.Is(err, syscall.ECONNRESET) {
			continue // closed at once over the bound
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n") // no final CRLF: held
	}
	for _, src := range []string{"10.9.0.7", "127.0.0.1"} {
		dst := "10.9.0.1"
		if src == "127.0.0.1" {
			dst = src
		}
		c, err := ns.DialTCP(src, dst, int(victim))
		if err != nil {
			t.Errorf("probe from %s: %v", src, err)
			continue
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("probe from %s of the victim's healthCheckNodePort while 10.9.0.66 holds %d connections: %v", src, 3*l.MaxConns, err)
		} else if resp.StatusCode != 200 {
			t.Errorf("probe from %s: %s, want 200", src, resp.Status)
		}
		c.Close()
	}
}
