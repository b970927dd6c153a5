package source

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestServesServiceCIDRsOnlyNoOnADefiniteAnswer(t *testing.T) {
	withCIDRs := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{Resources: []*metav1.APIResourceList{{
		GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "ingresses"}, {Name: "servicecidrs"}},
	}}}}
	without := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{Resources: []*metav1.APIResourceList{{
		GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "ingresses"}},
	}}}}
	noGroup := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{}} // 404
	failing := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{}}
	failing.AddReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
	})
	for name, c := range map[string]struct {
		d       *fakediscovery.FakeDiscovery
		want    bool
		wantErr bool
	}{
		"served": {withCIDRs, true, false}, "not in the group": {without, false, false},
		"group not found": {noGroup, false, false}, "unreachable": {failing, false, true},
	} {
		got, err := servesServiceCIDRs(context.Background(), c.d)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s: got %v, %v; want %v, error %v", name, got, err, c.want, c.wantErr)
		}
	}
}

func TestAPIErrorsAreRateLimited(t *testing.T) {
	logs := &logLines{}
	now := time.Unix(1000, 0)
	a := &apiErrors{log: logs.logger(), server: "https://x:6443", now: func() time.Time { return now }}
	for range 5 {
		a.report("list", errors.New("boom"))
		now = now.Add(time.Second)
	}
	if n := logs.count("API server request failed"); n != 1 {
		t.Fatalf("%d lines in 5 s, want 1", n)
	}
	now = now.Add(APIErrorLogInterval)
	a.report("list", errors.New("boom"))
	if n := logs.count("API server request failed"); n != 2 {
		t.Fatalf("%d lines after the interval, want 2", n)
	}
	if !strings.Contains(logs.String(), `"suppressedSinceLast"=4`) {
		t.Errorf("the second line does not count the 4 suppressed errors:\n%s", logs)
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
