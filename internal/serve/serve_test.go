package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
	"github.com/nftproxy/nftproxy/internal/status"
)

type probes struct{ got []string }

func (p *probes) Probe(path string, code int) {
	p.got = append(p.got, path+" "+http.StatusText(code))
}

// fixture is a Health with a settable status, node and clock.
type fixture struct {
	st     status.Sync
	node   *v1.Node
	now    time.Time
	probes probes
	h      *Health
}

func newFixture() *fixture {
	f := &fixture{now: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC), node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}}
	f.h = &Health{
		Status:     func() status.Sync { return f.st },
		SyncPeriod: 30 * time.Second,
		Node:       func() *v1.Node { return f.node },
		Now:        func() time.Time { return f.now },
		Probes:     &f.probes,
	}
	return f
}

// get returns the status code and the decoded body (as a map, to see which keys exist).
func (f *fixture) get(t *testing.T, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	f.h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: body %q: %v", path, rec.Body, err)
	}
	return rec.Code, body
}

func ts(t time.Time) string { return t.Format(time.RFC3339Nano) }

func TestHealthTransitions(t *testing.T) {
	f := newFixture()
	lastSync := f.now.Add(-time.Minute)
	f.st = status.Sync{LastSync: lastSync, Syncs: 5, Failures: 1}

	// Synced, nothing pending: healthy; lastUpdated is "now" like kube-proxy's.
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := f.get(t, path)
		if code != 200 || body["healthy"] != true || body["lastUpdated"] != ts(f.now) || body["currentTime"] != ts(f.now) {
			t.Errorf("%s synced: %d %v", path, code, body)
		}
		if body["syncs"] != 5.0 || body["failures"] != 1.0 || body["lastSync"] != ts(lastSync) {
			t.Errorf("%s counters: %v", path, body)
		}
	}
	if _, body := f.get(t, "/healthz"); body["nodeEligible"] != true {
		t.Errorf("/healthz nodeEligible: %v", body)
	}
	if _, body := f.get(t, "/livez"); body["nodeEligible"] != nil {
		t.Errorf("/livez carries nodeEligible: %v", body)
	}

	// A change queued just under 2× the sync period ago: still healthy.
	queued := f.now
	f.st.OldestPending = queued
	f.now = queued.Add(60*time.Second - time.Nanosecond)
	for _, path := range []string{"/healthz", "/livez"} {
		if code, body := f.get(t, path); code != 200 || body["oldestPending"] != ts(queued) {
			t.Errorf("%s pending <2×: %d %v", path, code, body)
		}
	}
	// At 2× the sync period: unhealthy, and lastUpdated is the last sync.
	f.now = queued.Add(60 * time.Second)
	f.st.LastError = "kernel said no"
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := f.get(t, path)
		if code != 503 || body["healthy"] != false || body["lastUpdated"] != ts(lastSync) || body["lastError"] != "kernel said no" {
			t.Errorf("%s pending 2×: %d %v", path, code, body)
		}
	}
	// The change is programmed: healthy again.
	f.st.OldestPending, f.st.LastSync = time.Time{}, f.now
	if code, _ := f.get(t, "/livez"); code != 200 {
		t.Errorf("/livez after sync: %d", code)
	}

	// The node is being deleted: /healthz fails, /livez does not (restarting would
	// not help).
	f.node.DeletionTimestamp = &metav1.Time{Time: f.now}
	code, body := f.get(t, "/healthz")
	if code != 503 || body["nodeEligible"] != false {
		t.Errorf("/healthz node deleting: %d %v", code, body)
	}
	if code, _ := f.get(t, "/livez"); code != 200 {
		t.Errorf("/livez node deleting: %d", code)
	}
	// Tainted for deletion by the autoscaler, or not known at all: not eligible.
	f.node.DeletionTimestamp = nil
	f.node.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	if code, _ := f.get(t, "/healthz"); code != 503 {
		t.Errorf("/healthz tainted: %d", code)
	}
	f.node = nil
	if code, _ := f.get(t, "/healthz"); code != 503 {
		t.Errorf("/healthz unknown node: %d", code)
	}
	// Without a node source the node is not checked.
	f.h.Node = nil
	if code, body := f.get(t, "/healthz"); code != 200 || body["nodeEligible"] != true {
		t.Errorf("/healthz without node check: %d %v", code, body)
	}

	want := "/healthz OK,/livez OK,/healthz OK,/livez OK,/healthz OK,/livez OK,/healthz Service Unavailable,/livez Service Unavailable,/livez OK,/healthz Service Unavailable,/livez OK,/healthz Service Unavailable,/healthz Service Unavailable,/healthz OK"
	if got := strings.Join(f.probes.got, ","); got != want {
		t.Errorf("probes:\n got %s\nwant %s", got, want)
	}
}

func TestHealthyRule(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		pendingFor time.Duration
		want       bool
	}{{0, true}, {59 * time.Second, true}, {60 * time.Second, false}, {time.Hour, false}} {
		st := status.Sync{OldestPending: now.Add(-tc.pendingFor)}
		if got := Healthy(st, 30*time.Second, now); got != tc.want {
			t.Errorf("pending for %v: %v, want %v", tc.pendingFor, got, tc.want)
		}
	}
	if !Healthy(status.Sync{}, time.Nanosecond, now) {
		t.Error("nothing pending must be healthy")
	}
}

func TestStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{})
	if err := Start(ctx, log, "off", "", nil, httplimit.Health); err != nil {
		t.Fatalf("empty address must disable the server: %v", err)
	}
	if err := Start(ctx, log, "bad", "256.0.0.1:1", nil, httplimit.Health); err == nil {
		t.Fatal("bad address accepted")
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hi") })
	if err := Start(ctx, log, "test", "127.0.0.1:0", h, httplimit.Limits{ReadHeaderTimeout: time.Second, IdleTimeout: 300 * time.Millisecond, MaxConns: 8}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	line := logged[len(logged)-1]
	mu.Unlock()
	i := strings.Index(line, `"address"="`)
	if i < 0 {
		t.Fatalf("no address logged: %s", line)
	}
	addr := strings.Trim(line[i+len(`"address"=`):], `"`)
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hi" {
		t.Errorf("body %q", body)
	}
	// Start applies the limits: an idle keep-alive connection is closed after the
	// idle timeout.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(r, nil); err != nil {
		t.Fatal(err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("idle keep-alive connection not closed by the server: %v", err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := http.Get("http://" + addr + "/"); err != nil {
			break // shut down with ctx
		}
		if time.Now().After(deadline) {
			t.Fatal("server still up after ctx ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHealthLikeKubeProxy pins kube-proxy's rule (pkg/proxy/healthcheck/proxy_health.go
// in v1.37, healthTimeout 2 × sync period): no change arriving is not staleness, so a
// proxy that has heard nothing for an hour (the API server is gone) stays healthy on
// both endpoints; a change queued for 2 × the sync period without a successful sync
// makes both fail. The body carries kube-proxy's per-family "status".
func TestHealthLikeKubeProxy(t *testing.T) {
	f := newFixture()
	lastSync := f.now.Add(-time.Hour)
	f.st = status.Sync{LastSync: lastSync, Syncs: 1}
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := f.get(t, path)
		if code != 200 || body["lastUpdated"] != ts(f.now) {
			t.Errorf("%s, nothing heard for an hour, nothing queued: %d %v", path, code, body)
		}
		want := map[string]any{"lastUpdated": ts(lastSync), "healthy": true}
		st, _ := body["status"].(map[string]any)
		if len(st) != 2 || !reflect.DeepEqual(st["IPv4"], want) || !reflect.DeepEqual(st["IPv6"], want) {
			t.Errorf("%s status: %v, want IPv4 and IPv6 %v", path, body["status"], want)
		}
	}
	// A change queued 2 × the sync period ago, still not synced: both 503, and each
	// family says so.
	f.st.OldestPending = f.now.Add(-60 * time.Second)
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := f.get(t, path)
		want := map[string]any{"lastUpdated": ts(lastSync), "healthy": false}
		st, _ := body["status"].(map[string]any)
		if code != 503 || body["lastUpdated"] != ts(lastSync) || !reflect.DeepEqual(st["IPv4"], want) || !reflect.DeepEqual(st["IPv6"], want) {
			t.Errorf("%s, queued for 2× sync period: %d %v", path, code, body)
		}
	}
	// Before the first sync kube-proxy has no per-family entry.
	f.st = status.Sync{}
	if code, body := f.get(t, "/livez"); code != 200 || body["status"] != nil {
		t.Errorf("/livez before the first sync: %d %v", code, body)
	}
}

// Before the first sync /healthz is not ready and /livez is OK for StartupGrace, then
// fails so that the kubelet restarts the pod; the first sync makes both OK.
func TestHealthWhileStarting(t *testing.T) {
	f := newFixture()
	f.h.Started, f.h.StartupGrace = f.now, StartupGrace
	f.st = status.Sync{}
	f.now = f.h.Started.Add(StartupGrace - time.Second)
	if code, body := f.get(t, "/healthz"); code != 503 || body["starting"] != true {
		t.Errorf("/healthz before the first sync: %d %v", code, body)
	}
	if code, body := f.get(t, "/livez"); code != 200 || body["starting"] != true {
		t.Errorf("/livez within the startup grace: %d %v", code, body)
	}
	f.now = f.h.Started.Add(StartupGrace)
	if code, _ := f.get(t, "/livez"); code != 503 {
		t.Errorf("/livez after %v without a sync: %d, want 503", StartupGrace, code)
	}
	f.st = status.Sync{LastSync: f.now, Syncs: 1}
	for _, path := range []string{"/healthz", "/livez"} {
		if code, body := f.get(t, path); code != 200 || body["starting"] != nil {
			t.Errorf("%s after the first sync: %d %v", path, code, body)
		}
	}
}
