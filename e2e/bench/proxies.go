package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Proxy is one proxy under test.
type Proxy struct {
	Name string // "nftproxy", "kube-proxy-nftables", "kube-proxy-iptables"
	Bin  string
	Mode string // kube-proxy's --proxy-mode; "" for nftproxy
	// SyncedLog is the log text that says the informer caches are synced (the last of
	// them, for kube-proxy: one line per informer).
	SyncedLog []string
	// KernelMetric is the histogram of the proxy's kernel-write (or whole sync) time.
	KernelMetric string
	// Env is added to the proxy's environment (a variant of nftproxy's defaults).
	Env []string
	// OnlyNamed: measured only when BENCH_PROXIES (Options.Proxies) names it.
	OnlyNamed bool
}

// Proxies returns the proxies: nftproxy and upstream kube-proxy in nftables and
// iptables mode, and nftproxy-list, nftproxy with client-go's WatchListClient off (its
// informers' first list is one LIST response instead of a stream of watch events;
// measured only when BENCH_PROXIES names it).
func Proxies(nftproxyBin, kubeProxyBin string) []Proxy {
	// kube-proxy's shared informers log `"Caches are synced" controller="service
	// config"` and `... controller="endpoint slice config"` (and node config).
	kp := []string{`"Caches are synced" controller="service config"`, `"Caches are synced" controller="endpoint slice config"`}
	return []Proxy{
		{Name: "nftproxy", Bin: nftproxyBin, SyncedLog: []string{"Informer caches synced"}, KernelMetric: "nftproxy_sync_kernel_duration_seconds"},
		{Name: "kube-proxy-nftables", Bin: kubeProxyBin, Mode: "nftables", SyncedLog: kp, KernelMetric: "kubeproxy_sync_proxy_rules_duration_seconds"},
		{Name: "kube-proxy-iptables", Bin: kubeProxyBin, Mode: "iptables", SyncedLog: kp, KernelMetric: "kubeproxy_sync_proxy_rules_duration_seconds"},
		{Name: "nftproxy-list", Bin: nftproxyBin, SyncedLog: []string{"Informer caches synced"}, KernelMetric: "nftproxy_sync_kernel_duration_seconds",
			Env: []string{"KUBE_FEATURE_WatchListClient=false"}, OnlyNamed: true},
	}
}

const (
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
	clusterCIDR = "10.244.0.0/16,fd00:244::/56"
)

// args returns the proxy's command line. Both proxies get the same sync periods
// (their defaults: 1 s minimum, 30 s periodic) and API client settings (defaults).
func (p Proxy) args(c *cluster.Cluster) []string {
	var args []string
	if len(p.Env) > 0 {
		args = append([]string{"env"}, p.Env...)
	}
	args = append(args, p.Bin,
		"--kubeconfig", c.Kubeconfig,
		"--hostname-override", c.NodeName,
		"--cluster-cidr", clusterCIDR,
		"--metrics-bind-address", metricsAddr,
		"--healthz-bind-address", healthzAddr,
		"-v=2",
	)
	if p.Mode != "" {
		args = append(args,
			"--proxy-mode", p.Mode,
			// Leave the host-wide conntrack sysctls alone (nf_conntrack_max is not
			// per-namespace; the bench never changes the root namespace).
			"--conntrack-max-per-core=0",
			"--conntrack-tcp-timeout-established=0",
			"--conntrack-tcp-timeout-close-wait=0",
		)
	}
	return args
}

// cleanupArgs returns the command that removes the proxy's rules.
func (p Proxy) cleanupArgs(c *cluster.Cluster) []string {
	if p.Mode == "" {
		return []string{p.Bin, "--cleanup"}
	}
	return []string{p.Bin, "--cleanup", "--proxy-mode", p.Mode, "--kubeconfig", c.Kubeconfig, "--hostname-override", c.NodeName, "-v=0"}
}

// logWatch follows a process log from an offset, reporting when lines first appear.
type logWatch struct {
	path   string
	offset int64
	tail   string // end of the previous read, for matches across reads
	seen   map[string]bool
}

func newLogWatch(path string) *logWatch {
	w := &logWatch{path: path, seen: map[string]bool{}}
	if fi, err := os.Stat(path); err == nil {
		w.offset = fi.Size()
	}
	return w
}

// poll reads what was appended since the last poll and reports whether all of wants
// have been seen since the watch started.
func (w *logWatch) poll(wants []string) bool {
	if f, err := os.Open(w.path); err == nil {
		if _, err := f.Seek(w.offset, 0); err == nil {
			b := make([]byte, 1<<20)
			for {
				n, _ := f.Read(b)
				if n <= 0 {
					break
				}
				w.offset += int64(n)
				chunk := w.tail + string(b[:n])
				for _, want := range wants {
					if strings.Contains(chunk, want) {
						w.seen[want] = true
					}
				}
				w.tail = chunk[max(0, len(chunk)-512):]
			}
		}
		f.Close()
	}
	for _, want := range wants {
		if !w.seen[want] {
			return false
		}
	}
	return true
}

// ensureEmptyRuleset makes sure the node's ruleset is empty before the next proxy
// starts. What a proxy's --cleanup left behind is returned as residue (kube-proxy's
// iptables mode works through iptables-nft: its cleanup leaves the iptables tables, their
// base chains and the KUBE-FIREWALL chain it shares with the kubelet); it is then
// flushed, in the node namespace only, and the ruleset checked to be empty.
func ensureEmptyRuleset(ctx context.Context, c *cluster.Cluster) (residue string, err error) {
	out, err := c.Exec(ctx, c.NodeNS, "nft", "list", "ruleset")
	if err != nil {
		return "", fmt.Errorf("nft list ruleset: %v: %s", err, out)
	}
	if strings.TrimSpace(string(out)) == "" {
		return "", nil
	}
	fp, err := listJSON(ctx, c)
	if err != nil {
		return "", err
	}
	residue = fmt.Sprintf("%d tables, %d chains, %d rules, %d set elements", fp.Tables, fp.Chains, fp.Rules, fp.Elements)
	if out, err := c.Exec(ctx, c.NodeNS, "nft", "flush", "ruleset"); err != nil {
		return residue, fmt.Errorf("nft flush ruleset in %s: %v: %s", c.NodeNS, err, out)
	}
	out, err = c.Exec(ctx, c.NodeNS, "nft", "list", "ruleset")
	if err != nil || strings.TrimSpace(string(out)) != "" {
		return residue, fmt.Errorf("node ruleset still not empty after flush: %v: %s", err, truncate(string(out), 2000))
	}
	return residue, nil
}

func listJSON(ctx context.Context, c *cluster.Cluster) (Footprint, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := c.Exec(ctx, c.NodeNS, "nft", "-j", "list", "ruleset")
	if err != nil {
		return Footprint{}, fmt.Errorf("nft -j list ruleset: %v: %s", err, truncate(string(out), 500))
	}
	return countRuleset(out)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
