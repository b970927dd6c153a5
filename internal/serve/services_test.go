package serve

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
)

// startMetrics serves the metrics server's handler h on a loopback port with limits, as
// main does, and returns the address.
func startMetrics(t *testing.T, h http.Handler, limits httplimit.Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := Start(ctx, logr.Discard(), "metrics", addr, h, limits); err != nil {
		t.Fatal(err)
	}
	return addr
}

// fetch GETs path with an Accept header (none if empty).
func fetch(client *http.Client, addr, path, accept string) (int, string, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, "", "", err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header.Get("Content-Type"), err
}

// The real recorder behind the real metrics server (Start, httplimit.Metrics): 32
// clients hammering /metrics get no per-service series and never make the kernel's
// counters be read; hammering /metrics/services as well, they get the series from one
// read for the whole interval. Both paths answer in the same content types. Fails if
// the per-service counters go back onto /metrics.
func TestServicesPathAlone(t *testing.T) {
	var reads atomic.Int32
	source := func() ([]metrics.ServicePortCount, uint64, error) {
		reads.Add(1)
		time.Sleep(50 * time.Millisecond) // a large table: concurrent scrapes overlap the read
		return []metrics.ServicePortCount{{Port: model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.ProtoTCP}, Packets: 7, Bytes: 70}}, 1, nil
	}
	rec := metrics.New(metrics.Options{ServiceCounters: source, ServiceCountersInterval: time.Hour, NoRuntimeMetrics: true})
	addr := startMetrics(t, MetricsPages{Metrics: rec.Handler(), Services: rec.ServicesHandler()}.Handler(), httplimit.Metrics)
	client := &http.Client{Timeout: 10 * time.Second}
	const perService = `nftproxy_service_packets_total{namespace="default",port="http",service="web"} 7`

	hammer := func(paths ...string) {
		t.Helper()
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 10 {
					path := paths[(i+j)%len(paths)]
					code, body, _, err := fetch(client, addr, path, "text/plain")
					switch {
					case err != nil || code != http.StatusOK:
						t.Errorf("%s: %d %v", path, code, err)
					case path == "/metrics" && strings.Contains(body, "nftproxy_service_packets_total"):
						t.Errorf("/metrics has the per-service counters:\n%s", body)
					case path == "/metrics" && !strings.Contains(body, "kubeproxy_sync_proxy_rules_duration_seconds"):
						t.Errorf("/metrics lacks kube-proxy's metrics:\n%s", body)
					case path == ServicesPath && !strings.Contains(body, perService):
						t.Errorf("%s lacks %s:\n%s", path, perService, body)
					}
				}
			}()
		}
		wg.Wait()
	}
	hammer("/metrics")
	if n := reads.Load(); n != 0 {
		t.Fatalf("320 scrapes of /metrics read the kernel's counters %d times, want 0", n)
	}
	hammer("/metrics", ServicesPath)
	if n := reads.Load(); n != 1 {
		t.Fatalf("scrapes of both paths within the interval read the kernel's counters %d times, want 1", n)
	}

	// the same content types on both paths, for each Accept
	for _, accept := range []string{"", "text/plain", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"} {
		_, _, want, err := fetch(client, addr, "/metrics", accept)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, got, err := fetch(client, addr, ServicesPath, accept); err != nil || got != want {
			t.Errorf("Accept %q: %s answers %q, /metrics %q (%v)", accept, ServicesPath, got, want, err)
		}
	}
}

// /metrics/services is on the metrics server's one connection budget: while clients
// hold every connection of it, a scrape of either path is refused.
func TestServicesPathSharesLimits(t *testing.T) {
	rec := metrics.New(metrics.Options{NoRuntimeMetrics: true,
		ServiceCounters: func() ([]metrics.ServicePortCount, uint64, error) { return nil, 0, nil }})
	limits := httplimit.Metrics
	limits.MaxConns, limits.LoopbackConns = 2, 2 // the test's clients are on loopback
	addr := startMetrics(t, MetricsPages{Metrics: rec.Handler(), Services: rec.ServicesHandler()}.Handler(), limits)
	var held []net.Conn
	for range limits.MaxConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // both accepted: the budget is full
	short := &http.Client{Timeout: 300 * time.Millisecond}
	for _, path := range []string{"/metrics", ServicesPath} {
		if code, _, _, err := fetch(short, addr, path, ""); err == nil {
			t.Errorf("%s answered %d with the connection budget full", path, code)
		}
	}
	held[0].Close()
	// the slot is free once the server has read the close: retry for a bounded while
	long := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _, _, err := fetch(long, addr, ServicesPath, "")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s with a connection free: %d %v", ServicesPath, code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
