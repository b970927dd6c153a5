package e2e

// TestHostileHealthServers: a tenant's pod holds more connections to the node's health
// servers than their whole connection budgets (400 to the healthz port 10256, budget
// 256; 800 to a healthCheckNodePort, budget 512 for all), keep-alive connections (300
// and 600: each more than the budget) and unfinished requests, and keeps them. Throughout, the kubelet's liveness probe (127.0.0.1:10256/livez, from the
// node), an external load balancer's probe of the healthz port and of a Local
// load balancer's healthCheckNodePort are answered within 5 s, and nftproxy keeps
// running. kube-proxy has no connection bound: none of this can starve it either.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v -run TestHostileHealthServers

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

func TestHostileHealthServers(t *testing.T) {
	cluster.Require(t)
	e := newEnv(t, 1)
	c := e.c
	e.setupRoutes(t)
	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), cluster.WatchedFlags...)
	attacker := e.client // a pod: it reaches every address of the node

	// a Local load balancer with a local endpoint: its health check answers 200
	svc := e.nsService(t, ns, "lb-local", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
		Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal})
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort")
	}
	e.nsSlice(t, svc, e.web[0].IP.String())
	node := c.NodeIP.String()
	probes := []struct {
		what, from, url, want string
	}{
		{"kubelet liveness probe (node, loopback)", c.NodeNS, "http://127.0.0.1:10256/livez", `"healthy":true`},
		{"load balancer -> node healthz", c.ExternalNS, fmt.Sprintf("http://%s/healthz", hostPort(node, 10256)), "lastUpdated"},
		{"load balancer -> healthCheckNodePort", c.ExternalNS, fmt.Sprintf("http://%s/", hostPort(node, hc)), `"localEndpoints":1`},
	}
	probeAll := func(t *testing.T, when string) {
		t.Helper()
		for _, p := range probes {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			code, body, err := c.HTTPGet(ctx, p.from, p.url)
			cancel()
			if err != nil || code != http.StatusOK || !strings.Contains(string(body), p.want) {
				t.Errorf("%s: %s %s answered %d %q (%v), want 200 with %q", when, p.what, p.url, code, body, err, p.want)
			}
		}
	}
	// before: every probe answers (the check is not vacuous)
	deadline := time.Now().Add(converge)
	for {
		ok := true
		for _, p := range probes {
			code, body, err := c.HTTPGet(t.Context(), p.from, p.url)
			ok = ok && err == nil && code == http.StatusOK && strings.Contains(string(body), p.want)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			probeAll(t, "before")
			t.Fatal("the probes did not answer before the attack")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// the attack: more than each budget (256 for healthz, 512 for all healthCheckNodePorts)
	a := &holder{dial: cluster.NSDialer(attacker.NS)}
	defer a.closeAll()
	a.hold(t, hostPort(node, hc), "/", 800)
	a.hold(t, hostPort(node, 10256), "/healthz", 400)
	t.Logf("attacker %s: %d connections made (the server may reset them after), %d answered and kept alive, %d reset before connect returned",
		attacker.IP, a.open.Load(), a.keptAlive.Load(), a.refused.Load())
	probeAll(t, "attacker holding its connections")
	// and again, later in the keep-alive time the attacker's connections ask for
	time.Sleep(3 * time.Second)
	probeAll(t, "3 s later")
	if !e.proxy.Running() {
		t.Fatalf("nftproxy exited; log:\n%s", e.proxy.Tail(40))
	}
}

// holder opens connections and keeps them until closeAll.
type holder struct {
	dial                     func(ctx context.Context, network, addr string) (net.Conn, error)
	mu                       sync.Mutex
	conns                    []net.Conn
	open, keptAlive, refused atomic.Int64
}

// hold opens n connections to addr: three in four send a keep-alive GET of path and
// read its answer (then idle, as a keep-alive client does), the others send an
// unfinished request. All answers are awaited at once, 3 s at most.
func (h *holder) hold(t *testing.T, addr, path string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		c, err := h.dial(ctx, "tcp", addr)
		cancel()
		if err != nil {
			h.refused.Add(1)
			continue
		}
		h.mu.Lock()
		h.conns = append(h.conns, c)
		h.mu.Unlock()
		h.open.Add(1)
		if i%4 == 3 {
			_, _ = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n") // no final CRLF
			continue
		}
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			h.refused.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if !resp.Close {
				h.keptAlive.Add(1)
			}
			_ = c.SetReadDeadline(time.Time{})
		}()
	}
	wg.Wait()
}

func (h *holder) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}
