package e2e

// TestHostileKernelMemory: a tenant's ClientIP affinity and loadBalancerSourceRanges,
// at sizes the default limits admit, on a real apiserver with real packets. Affinity
// still sticks and the source-range filter still drops off-range and admits in-range
// traffic, while the node's kernel memory (slab and vmalloc, not only nftproxy's heap)
// stays bounded and a source-range check stays one set lookup, however many ranges.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v -run TestHostileKernelMemory

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const (
	// kmemAffinityEndpoints is the size of the tenant's ClientIP Service: declared with
	// size 65535, each endpoint's set had its hash table sized for 65,535 clients up
	// front, about 0.66 MiB of kernel memory each (330 MiB here); without a size, about
	// 3 KB.
	kmemAffinityEndpoints = 500
	// kmemAffinityBound bounds the node's kernel memory growth for that Service.
	kmemAffinityBound = 64 << 20
	// kmemRanges is the number of source ranges of the tenant's load balancers.
	kmemRanges = 10000
	// kmemRangesBound bounds the node's kernel memory growth for both of them.
	kmemRangesBound = 64 << 20
	tenantFencedIP  = "198.51.100.41"
	tenantOpenIP    = "198.51.100.42"
)

// nodeKernelMemory is the machine's unreclaimable slab plus vmalloc, in bytes
// (/proc/meminfo's SUnreclaim and VmallocUsed): where nf_tables allocates its objects,
// whichever network namespace they are in.
func nodeKernelMemory(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && (fields[0] == "SUnreclaim:" || fields[0] == "VmallocUsed:") {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			n += kb << 10
		}
	}
	return n
}

func TestHostileKernelMemory(t *testing.T) {
	cluster.Require(t)
	e := &env{bin: buildNftproxy(t)}
	e.c = cluster.StartT(t, cluster.Config{})
	c := e.c
	e.setupRoutes(t)
	pod := func(name string) *cluster.Pod {
		p, err := c.AddPod(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	t1, t2, client := pod("tenant-1"), pod("tenant-2"), pod("client")
	e.client = client
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), cluster.WatchedFlags...)
	tenants := []*cluster.Pod{t1, t2}

	e.run(t, "affinity-sticks-without-preallocating", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "sticky", corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}})
		e.nsSlice(t, s, t1.IP.String(), t2.IP.String())
		addr := hostPort(s.Spec.ClusterIP, 80)
		e.waitOK(t, "sticky cluster IP", client.NS, "tcp", addr)
		res := e.probe(t, client.NS, "tcp", addr, 12, time.Second)
		expectAnswered(t, "pod -> sticky "+addr, res, tenants, nil)
		if sticky(res) == "" {
			t.Errorf("12 connections from one client not all to one endpoint: %s", summary(res))
		}

		before := nodeKernelMemory(t)
		many := e.nsService(t, tenantNS, "sticky-many", corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)},
			SessionAffinity: corev1.ServiceAffinityClientIP})
		for k := 0; k < kmemAffinityEndpoints; k += 100 {
			var addrs []string
			for i := k; i < k+100 && i < kmemAffinityEndpoints; i++ {
				addrs = append(addrs, fmt.Sprintf("10.250.%d.%d", i/250, 1+i%250))
			}
			if err := e.tryNsSlice(t, many, fmt.Sprintf("sticky-many-%d", k/100), addrs...); err != nil {
				t.Fatal(err)
			}
		}
		sets := regexp.MustCompile(`(?m)^\s*set affinity-` + regexp.QuoteMeta(tenantNS+"/sticky-many/"))
		e.waitTable(t, "the 500 endpoints' affinity sets", func(table string) bool {
			return len(sets.FindAllStringIndex(table, -1)) == kmemAffinityEndpoints
		})
		grew := nodeKernelMemory(t) - before
		t.Logf("ClientIP Service with %d endpoints: node kernel memory +%.1f MiB", kmemAffinityEndpoints, float64(grew)/(1<<20))
		if grew > kmemAffinityBound {
			t.Errorf("a ClientIP Service with %d endpoints grew the node's kernel memory by %.1f MiB, over the bound of %d MiB",
				kmemAffinityEndpoints, float64(grew)/(1<<20), kmemAffinityBound>>20)
		}
		// the small Service still sticks beside it
		res = e.probe(t, client.NS, "tcp", addr, 8, time.Second)
		expectAnswered(t, "pod -> sticky, beside sticky-many", res, tenants, nil)
		if sticky(res) == "" {
			t.Errorf("beside sticky-many, 8 connections not all to one endpoint: %s", summary(res))
		}
	})

	e.run(t, "source-ranges-one-lookup", func(t *testing.T) {
		var ranges []string
		for i := range kmemRanges { // single addresses two apart: none merges
			ranges = append(ranges, fmt.Sprintf("100.64.%d.%d/32", i>>7, (i&127)<<1))
		}
		before := nodeKernelMemory(t)
		fenced := e.nsService(t, tenantNS, "fenced", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}, LoadBalancerSourceRanges: ranges})
		open := e.nsService(t, tenantNS, "fenced-open", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}, LoadBalancerSourceRanges: append(ranges[1:], c.ExternalIP.String()+"/32")})
		for _, s := range []*corev1.Service{fenced, open} {
			e.nsSlice(t, s, t1.IP.String(), t2.IP.String())
		}
		e.setIngress(t, fenced, tenantFencedIP)
		e.setIngress(t, open, tenantOpenIP)
		lbOpen, lbFenced := hostPort(tenantOpenIP, 80), hostPort(tenantFencedIP, 80)
		e.waitOK(t, "in-range source -> LB IP", c.ExternalNS, "tcp", lbOpen)
		expectAnswered(t, "external (in range) -> "+lbOpen, e.probe(t, c.ExternalNS, "tcp", lbOpen, 6, time.Second), tenants, nil)
		// the fenced one is programmed (its cluster IP answers) and drops the off-range
		// external client
		e.waitOK(t, "fenced cluster IP", client.NS, "tcp", hostPort(fenced.Spec.ClusterIP, 80))
		if res := e.probe(t, c.ExternalNS, "tcp", lbFenced, 4, time.Second); !noneOK(res) || anyRefused(res) {
			t.Errorf("external (off range) -> %s: %s, want all dropped", lbFenced, summary(res))
		}
		// one lookup: each firewall chain is a set lookup and a drop, not a rule a range
		table, err := e.nftList(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"fenced", "fenced-open"} {
			chain := regexp.MustCompile(`(?s)chain fw-` + regexp.QuoteMeta(tenantNS+"/"+name+"/tcp/http") + ` \{(.*?)\n\t\}`).FindStringSubmatch(table)
			if chain == nil {
				t.Fatalf("no firewall chain for %s in the table", name)
			}
			if rules := strings.Count(strings.TrimSpace(chain[1]), "\n") + 1; rules > 2 {
				t.Errorf("firewall chain of %s has %d rules for %d ranges, want a set lookup and a drop", name, rules, kmemRanges)
			}
		}
		grew := nodeKernelMemory(t) - before
		t.Logf("two load balancers with %d source ranges each: node kernel memory +%.1f MiB", kmemRanges, float64(grew)/(1<<20))
		if grew > kmemRangesBound {
			t.Errorf("two load balancers with %d source ranges grew the node's kernel memory by %.1f MiB, over the bound of %d MiB",
				kmemRanges, float64(grew)/(1<<20), kmemRangesBound>>20)
		}
	})
}

func anyRefused(res []cluster.ProbeResult) bool {
	for _, r := range res {
		if r.Refused {
			return true
		}
	}
	return false
}

// waitTable waits until the node's table satisfies ok.
func (e *env) waitTable(t *testing.T, what string, ok func(table string) bool) {
	t.Helper()
	const wait = 90 * time.Second // a busy machine's sync of hundreds of chains and sets
	deadline := time.Now().Add(wait)
	for {
		table, err := e.nftList(t.Context())
		if err == nil && ok(table) {
			return
		}
		if time.Now().After(deadline) || !e.proxy.Running() {
			t.Fatalf("%s: not in the table within %v (err %v); log:\n%s", what, wait, err, e.proxy.Tail(20))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
