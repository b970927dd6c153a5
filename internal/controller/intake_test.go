package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/source"
)

// A Service labelled with another proxy's name is not proxied at all; a Service whose
// EndpointSlice is labelled headless gets no endpoints from it (kube-proxy's filters).
func TestProxyNameAndHeadlessLabels(t *testing.T) {
	other := service("other", "10.96.0.2")
	other.Labels = map[string]string{source.LabelServiceProxyName: "some-other-proxy"}
	headless := slice("hl", "hl-1", "10.244.1.3")
	headless.Labels[v1.IsHeadlessService] = ""
	dp := &fakeDataplane{}
	_, _ = startProxy(t, dp,
		service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.1"),
		other, slice("other", "other-1", "10.244.1.2"),
		service("hl", "10.96.0.3"), headless)
	waitFor(t, "first sync", func() bool { return strings.Contains(dp.last(), "default/a:http") })
	out := dp.last()
	if !strings.Contains(out, "10.244.1.1 . 8080") {
		t.Errorf("unlabelled service a lost its endpoint:\n%s", out)
	}
	if strings.Contains(out, "default/other") || strings.Contains(out, "10.96.0.2") || strings.Contains(out, "10.244.1.2") {
		t.Errorf("service labelled %s=some-other-proxy was proxied:\n%s", source.LabelServiceProxyName, out)
	}
	if fate(dp.lastRuleset(), "10.244.0.5", "10.96.0.3:80") != "reject" || !strings.Contains(out, `10.96.0.3 . tcp . 80 comment "default/hl:http"`) ||
		strings.Contains(out, "10.244.1.3") {
		t.Errorf("the headless-labelled slice's endpoint was used (want service hl rejected for lack of endpoints):\n%s", out)
	}
}

// The filters are server-side: the list and watch requests carry kube-proxy's selectors.
func TestInformersSendKubeProxysSelectors(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	seen := map[string][]string{}
	record := func(verb string) k8stesting.ReactionFunc {
		return func(a k8stesting.Action) (bool, runtime.Object, error) {
			var sel string
			switch a := a.(type) {
			case k8stesting.ListAction:
				r := a.GetListRestrictions()
				sel = r.Labels.String() + " | " + r.Fields.String()
			case k8stesting.WatchAction:
				r := a.GetWatchRestrictions()
				sel = r.Labels.String() + " | " + r.Fields.String()
			}
			mu.Lock()
			seen[verb+" "+a.GetResource().Resource] = append(seen[verb+" "+a.GetResource().Resource], sel)
			mu.Unlock()
			return false, nil, nil
		}
	}
	client.PrependReactor("list", "*", record("list"))
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		_, _, _ = record("watch")(a)
		return false, nil, nil
	})
	p := New(client, &fakeDataplane{}, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-p.Synced():
	case <-time.After(5 * time.Second):
		t.Fatal("no first sync")
	}
	want := map[string]string{
		"services":       "!service.kubernetes.io/service-proxy-name | spec.clusterIP!=None",
		"endpointslices": "!service.kubernetes.io/headless | ",
		"nodes":          " | metadata.name=node-1",
	}
	// An informer starts its watch after its list has filled the cache, so the first
	// sync may come before every watch was asked for: wait for them (bounded).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		all := true
		for res := range want {
			all = all && len(seen["list "+res]) > 0 && len(seen["watch "+res]) > 0
		}
		mu.Unlock()
		if all {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for res, w := range want {
		for _, verb := range []string{"list", "watch"} {
			got := seen[verb+" "+res]
			if len(got) == 0 {
				t.Errorf("no %s of %s seen", verb, res)
			}
			for _, g := range got {
				if g != w {
					t.Errorf("%s %s with selectors %q, want %q", verb, res, g, w)
				}
			}
		}
	}
}

// Discovery that fails at first is retried; once the API answers, the ServiceCIDR
// informer starts and the first sync uses the ServiceCIDRs, not the flag.
func TestServiceCIDRDiscoveryIsRetried(t *testing.T) {
	cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/16"}}}
	client := fake.NewClientset(cidr, service("a", "10.97.0.1"))
	client.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "servicecidrs"}}}}
	var mu sync.Mutex
	failures := 3
	client.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	logs := &logLines{}
	p := New(client, &fakeDataplane{}, Config{
		NodeName:      "node-1",
		MinSyncPeriod: 10 * time.Millisecond,
		SyncPeriod:    time.Hour,
		APIServer:     "https://api.example:6443",
		Pipeline: pipeline.Config{
			ServiceCIDRs: nil,
		},
	}, logs.logger())
	p.src.DiscoveryBackoff = 10 * time.Millisecond
	dp := p.dataplane.(*fakeDataplane)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "first sync", func() bool { return strings.Contains(dp.last(), "default/a:http") })
	if out := dp.last(); !strings.Contains(out, "10.97.0.0/16") {
		t.Errorf("the first sync does not drop unallocated addresses of the ServiceCIDR:\n%s", out)
	}
	if logs.contains("does not serve") {
		t.Errorf("discovery errors were taken as \"not served\":\n%s", logs)
	}
	if !logs.contains("API server request failed") || !logs.contains("https://api.example:6443") {
		t.Errorf("the discovery failure is not logged with the server address:\n%s", logs)
	}
}

// An unreachable API server is logged at -v=0 with its address and the error,
// rate-limited, and the proxy keeps waiting instead of giving up.
func TestUnreachableAPIServerIsLoggedAndWaitedFor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := "https://" + ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	client, err := kubernetes.NewForConfig(&rest.Config{Host: server, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logLines{}
	p := New(client, &fakeDataplane{}, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour, APIServer: server}, logs.logger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, "the API error logged", func() bool { return logs.contains("API server request failed") })
	select {
	case err := <-done:
		t.Fatalf("Run returned while the API is unreachable: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
	n := logs.count("API server request failed")
	if n != 1 {
		t.Errorf("%d API error lines in 1.5 s, want 1 (at most one per %v):\n%s", n, source.APIErrorLogInterval, logs)
	}
	line := logs.first("API server request failed")
	if !strings.Contains(line, server) || !strings.Contains(line, "connection refused") {
		t.Errorf("the error line lacks the address or the cause: %s", line)
	}
	if logs.contains("does not serve") {
		t.Errorf("misleading cause logged:\n%s", logs)
	}
}

// logLines collects a logger's lines (verbosity 0 only: what -v=0 shows).
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: 0})
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

func (l *logLines) contains(s string) bool { return l.count(s) > 0 }

func (l *logLines) first(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return line
		}
	}
	return fmt.Sprint("no line with ", s)
}
