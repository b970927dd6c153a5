package realcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The `make conformance` selection of upstream's e2e.test v1.37.0: every [sig-network]
// Services / Networking / Conntrack / EndpointSlice / Endpoints / ServiceCIDR / dual-stack /
// traffic-distribution spec, minus what a two-node single-stack IPv4 cluster without a
// cloud load balancer cannot run. docs/conformance.md lists the skipped ones and why.
const (
	ConformanceFocus = `\[sig-network\] (Services|Networking|Conntrack|EndpointSlice|EndpointSliceMirroring|EndpointsController|Endpoints|Service endpoints latency|Service CIDRs|ServiceCIDR and IPAddress API|Traffic Distribution|Topology Hints|KubeProxy|NoSNAT|HostPort|\[Feature:IPv6DualStack\]) `
	ConformanceSkip  = `\[Serial\]|\[Disruptive\]|\[Feature:|LoadBalancer|\[Provider:|\[Slow\]|SCTP`
	// ServicesConformanceFocus is the 15 `[sig-network] Services ... [Conformance]` specs.
	ServicesConformanceFocus = `\[sig-network\] Services .*\[Conformance\]`
)

// TestConformance runs the selection against a fresh cluster per proxy (kube-proxy
// v1.37.0 nftables mode, then nftproxy from manifests/), writes each proxy's results to
// $CONFORMANCE_OUT/<proxy>.json and the comparison table to
// $CONFORMANCE_OUT/table.md, and ends with "N passed, N failed" for nftproxy. It fails
// if nftproxy fails a spec that kube-proxy passes. Run by `make conformance`
// (NFTPROXY_CONFORMANCE=1); CONFORMANCE_PROXIES, CONFORMANCE_FOCUS, CONFORMANCE_SKIP and
// CONFORMANCE_TIMEOUT (e2e.test's whole run, default 4h) change it.
func TestConformance(t *testing.T) {
	if os.Getenv("NFTPROXY_CONFORMANCE") != "1" {
		t.Skip("set NFTPROXY_CONFORMANCE=1 (make conformance) to run upstream's e2e.test against real clusters")
	}
	out := os.Getenv("CONFORMANCE_OUT")
	if out == "" {
		out = filepath.Join(os.TempDir(), "nftproxy-conformance")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	focus := os.Getenv("CONFORMANCE_FOCUS")
	if focus == "" {
		focus = ConformanceFocus
	}
	proxies := []string{proxyKubeProxy, proxyNftproxy}
	if p := os.Getenv("CONFORMANCE_PROXIES"); p != "" {
		proxies = strings.Split(p, ",")
	}
	for _, proxy := range proxies {
		t.Run(proxy, func(t *testing.T) {
			res := conformanceRun(t, proxy, focus)
			b, _ := json.MarshalIndent(res, "", "  ")
			if err := os.WriteFile(filepath.Join(out, proxy+".json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
	kp, _ := readResults(filepath.Join(out, proxyKubeProxy+".json"))
	np, err := readResults(filepath.Join(out, proxyNftproxy+".json"))
	table := ConformanceTable(kp, np)
	if err := os.WriteFile(filepath.Join(out, "table.md"), []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("results in %s; table:\n%s", out, table)
	if err != nil {
		if strings.Contains(strings.Join(proxies, ","), proxyNftproxy) {
			t.Fatalf("no nftproxy results: %v", err)
		}
		return
	}
	passed, failed := 0, 0
	for _, r := range np {
		switch r.State {
		case "passed":
			passed++
		case "skipped":
		default:
			failed++
			if k, ok := kp[r.Name]; ok && k.State == "passed" {
				t.Errorf("nftproxy fails a spec kube-proxy passes: %s\n%s", r.Name, r.Failure)
			}
		}
	}
	summary := fmt.Sprintf("%d passed, %d failed", passed, failed)
	if err := os.WriteFile(filepath.Join(out, "summary.txt"), []byte(summary+"\n"), 0o644); err != nil {
		t.Error(err)
	}
	t.Log("nftproxy: " + summary)
}

// conformanceRun starts a cluster, installs proxy, waits for CoreDNS and runs e2e.test.
func conformanceRun(t *testing.T, proxy, focus string) []SpecResult {
	c, _ := startWithProxy(t, proxy)
	ctx := t.Context()
	if err := installProxy(ctx, c, proxy); err != nil {
		t.Fatal(err)
	}
	if c.CoreDNSImage() != "" {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if err := c.h.WaitFor(wctx, "CoreDNS ready", nil, func(ctx2 context.Context) error {
			d, err := c.Client.AppsV1().Deployments("kube-system").Get(ctx2, "coredns", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if d.Status.ReadyReplicas < 1 {
				return fmt.Errorf("not ready")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	bin, err := E2ETest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	skip := ConformanceSkip
	if s := os.Getenv("CONFORMANCE_SKIP"); s != "" {
		skip = s
	}
	timeout := 4 * time.Hour
	if d, err := time.ParseDuration(os.Getenv("CONFORMANCE_TIMEOUT")); err == nil {
		timeout = d // ginkgo stops there; specs not reached are absent from the results
	}
	res, err := c.RunE2E(ctx, bin, filepath.Join(c.WorkDir, "e2e-"+proxy), focus, skip, timeout)
	if err != nil {
		t.Fatal(err)
	}
	passed, skipped := 0, 0
	for _, r := range res {
		switch r.State {
		case "passed":
			passed++
		case "skipped":
			skipped++
		default:
			t.Logf("%s: %s: %s\n%s", proxy, r.State, r.Name, r.Failure)
		}
	}
	t.Logf("%s: %d specs in %v: %d passed, %d skipped themselves, %d failed", proxy, len(res),
		time.Since(t0).Round(time.Second), passed, skipped, len(res)-passed-skipped)
	if len(res) == 0 {
		t.Fatal("no spec ran")
	}
	return res
}

func readResults(path string) (map[string]SpecResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rs []SpecResult
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, err
	}
	m := map[string]SpecResult{}
	for _, r := range rs {
		m[r.Name] = r
	}
	return m, nil
}

// ConformanceTable is the markdown table of docs/conformance.md: one row per spec.
func ConformanceTable(kp, np map[string]SpecResult) string {
	names := map[string]bool{}
	for n := range kp {
		names[n] = true
	}
	for n := range np {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	cell := func(m map[string]SpecResult, n string) (string, string) {
		r, ok := m[n]
		if !ok {
			return "not run", ""
		}
		return r.State, fmt.Sprintf("%.0f s", r.Seconds)
	}
	var b strings.Builder
	b.WriteString("| Test | kube-proxy | nftproxy | Time (kube-proxy / nftproxy) |\n|---|---|---|---|\n")
	for _, n := range sorted {
		ks, kt := cell(kp, n)
		ns, nt := cell(np, n)
		fmt.Fprintf(&b, "| %s | %s | %s | %s / %s |\n", strings.ReplaceAll(strings.TrimPrefix(n, "[sig-network] "), "|", `\|`), ks, ns, kt, nt)
	}
	return b.String()
}
