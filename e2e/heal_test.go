package e2e

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestSelfHealing runs nftproxy with its default --min-sync-period (1s) and
// --sync-period (30s) and tampers with its table from the node namespace with nft, as
// an administrator or another agent might: the table deleted, the shared chain that
// load-balances cluster IPs flushed, the service's cluster-frontends element and one of
// its endpoint entries deleted, a drop rule added. Each time the kernel's table must
// be back (the same listing, modulo counters) within a second — long before the
// periodic resync — new connections must work again, and
// nftproxy_dataplane_repairs_total must count the repair. A foreign table in the same
// namespace is never touched.
//
// While the table is gone, a new connection's SYN is forwarded without DNAT, and
// conntrack keeps that entry (SYN_SENT, unreplied) for 120 s. A later connection to
// which the client's kernel gives the same source port matches it, is not DNATed either
// and is refused by the cluster-IP check, however sound the table is. The client's
// ephemeral ports do come back within a run, so this refused a later subtest's
// connection at random (once in CI: one connection before add-drop-rule's tampering).
// The repairing sync deletes such entries (conntrack.Escaped): after each repair none
// may be left once that sync is over (polled for a few seconds), and with the table
// stable none may appear (checked before each tampering and at the end). The test
// never deletes them after a repair itself.
func TestSelfHealing(t *testing.T) {
	cluster.Require(t)
	e := newEnv(t, 2)
	c, ctx := e.c, t.Context()
	const foreign = `table ip foreign {
	set allowed {
		type ipv4_addr
		elements = { 192.0.2.77 }
	}

	chain keep {
		ip saddr @allowed counter accept
	}
}
`
	if out, err := c.ExecInput(ctx, c.NodeNS, foreign, "nft", "-f", "-"); err != nil {
		t.Fatalf("creating the foreign table: %v\n%s", err, out)
	}
	foreignBefore := e.mustNft(t, "list", "table", "ip", "foreign")

	// No --min-sync-period: the default applies.
	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), "-v=2",
		"--healthz-bind-address", "0.0.0.0:10256", "--metrics-bind-address", "127.0.0.1:10249")

	svc := e.createService(t, "heal", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "service answers", e.client.NS, "tcp", addr)
	// the service is on the flat path: no chain of its own; its cluster IP goes
	// through the shared chain cluster-frontend
	const frontChain = "cluster-frontend"
	baseline := e.waitStableListing(t)
	if !strings.Contains(baseline, "chain "+frontChain+" {") {
		t.Fatalf("no chain %s in the table:\n%s", frontChain, baseline)
	}
	// waitOK may have tried the cluster IP before nftproxy programmed it
	if early := e.deleteNotDNATed(t, svc.Spec.ClusterIP, 80); len(early) > 0 {
		t.Logf("deleted %d conntrack entries of connections tried before the service was programmed:\n%s", len(early), strings.Join(early, "\n"))
	}

	const attemptTimeout = 300 * time.Millisecond // of each client connection
	var latencies []time.Duration
	for i, tamper := range []struct {
		name string
		nft  []string
	}{
		{"delete-table", []string{"delete", "table", "ip", tableName}},
		{"flush-frontend-chain", []string{"flush", "chain", "ip", tableName, frontChain}},
		{"delete-frontend-element", []string{"delete", "element", "ip", tableName, "cluster-frontends", "{ " + svc.Spec.ClusterIP + " . tcp . 80 }"}},
		{"delete-endpoint-entry", []string{"delete", "element", "ip", tableName, "endpoints", "{ " + svc.Spec.ClusterIP + " . tcp . 80 . 1 }"}},
		{"add-drop-rule", []string{"insert", "rule", "ip", tableName, "services", "ip", "daddr", svc.Spec.ClusterIP, "drop"}},
	} {
		t.Run(tamper.name, func(t *testing.T) {
			if !e.proxy.Running() {
				t.Fatalf("nftproxy is not running; log:\n%s", e.proxy.Tail(40))
			}
			if escaped := e.notDNATed(t, svc.Spec.ClusterIP, 80); len(escaped) > 0 {
				t.Errorf("with the table stable, %d connections to the cluster IP were not DNATed:\n%s", len(escaped), strings.Join(escaped, "\n"))
			}
			repairsBefore := metricValue(e.scrape(t), "nftproxy_dataplane_repairs_total")
			// A client opening a new connection every 20 ms across the tampering.
			run, err := c.StartProbe(ctx, e.client.NS, cluster.ProbeSpec{Proto: "tcp", Addr: addr, Count: 100, Timeout: attemptTimeout, Interval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			// Whether one of the client's connections escapes NAT depends on timing; this
			// entry stands for one that did, every time: an unanswered SYN from a port
			// the client does not use (one per tampering), to the cluster IP, not DNATed.
			e.insertNotDNATed(t, e.client.IP.String(), escapedPort+i, svc.Spec.ClusterIP, 80)

			tamperStart := time.Now()
			e.mustNft(t, tamper.nft...)
			tampered := time.Now()
			took, last := e.waitListing(t, baseline, tampered, 3*time.Second)
			if took < 0 {
				t.Fatalf("table not restored within 3s of `nft %s`\n--- want:\n%s\n--- last listing:\n%s\n--- nftproxy log:\n%s",
					strings.Join(tamper.nft, " "), baseline, last, e.proxy.Tail(20))
			}
			latencies = append(latencies, took)
			t.Logf("nft %s: table restored %v after the command returned", strings.Join(tamper.nft, " "), took.Round(time.Millisecond))
			// connections the broken table let through without DNAT (see above): the
			// repairing sync deletes their conntrack entries right after the kernel took
			// the table
			if escaped, seen, took := e.waitNoNotDNATed(t, svc.Spec.ClusterIP, 80, 3*time.Second); len(escaped) > 0 {
				t.Errorf("%v after the restored listing, %d conntrack entries of connections tried while the table was broken are still not DNATed; each would refuse a new connection from the same source port for up to 120 s:\n%s\n--- nftproxy log:\n%s",
					took.Round(time.Millisecond), len(escaped), strings.Join(escaped, "\n"), e.proxy.Tail(20))
			} else if seen > 0 {
				t.Logf("%d un-DNATed conntrack entries to the cluster IP seen after the restored listing, gone %v later", seen, took.Round(time.Millisecond))
			}
			for _, l := range logLines(e.proxy.Tail(80), tamperStart, "escaped NAT") {
				t.Logf("nftproxy: %s", l)
			}
			restored := time.Now()

			select {
			case <-run.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("client probe did not finish within 30s")
			}
			res, err := run.Stop()
			if err != nil {
				t.Fatal(err)
			}
			var before, during, after []cluster.ProbeResult
			for _, r := range res {
				switch {
				case r.At.Add(attemptTimeout).Before(tamperStart): // over before nft ran
					before = append(before, r)
				case r.At.After(restored.Add(100 * time.Millisecond)):
					after = append(after, r)
				default:
					during = append(during, r)
				}
			}
			t.Logf("client: before %s; around the tampering and repair %s; after %s", summary(before), summary(during), summary(after))
			if len(after) < 10 {
				t.Errorf("only %d connection attempts after the repair", len(after))
			}
			expectAnswered(t, "connections before the tampering", before, e.web, is(e.client.IP.String()))
			expectAnswered(t, "connections after the repair", after, e.web, is(e.client.IP.String()))

			repairs := metricValue(e.scrape(t), "nftproxy_dataplane_repairs_total")
			if repairs < repairsBefore+1 {
				t.Errorf("nftproxy_dataplane_repairs_total went from %v to %v, want an increase", repairsBefore, repairs)
			}
			if detected, synced := repairLog(e.proxy.Tail(80), tamperStart); detected.IsZero() || synced.IsZero() {
				t.Errorf("nftproxy did not log the detection and the repairing sync; log:\n%s", e.proxy.Tail(20))
			} else {
				t.Logf("from nftproxy's log: change detected %v and repairing sync done %v after the nft command started (it took %v)",
					detected.Sub(tamperStart).Round(time.Millisecond), synced.Sub(tamperStart).Round(time.Millisecond), tampered.Sub(tamperStart).Round(time.Millisecond))
			}
			// Let the runner's --min-sync-period since the repair pass, so that the
			// next tampering is measured from an idle proxy, as in production.
			time.Sleep(time.Second)
		})
	}
	t.Logf("repair latency (tamper command returned → restored listing seen): %v", latencies)
	if escaped := e.notDNATed(t, svc.Spec.ClusterIP, 80); len(escaped) > 0 {
		t.Errorf("after the last repair, %d connections to the cluster IP were not DNATed:\n%s", len(escaped), strings.Join(escaped, "\n"))
	}
	if m := e.scrape(t); metricValue(m, `nftproxy_dataplane_repairs_total{cause="events_lost"}`) != 0 {
		t.Errorf("events were lost: %v", metricValue(m, `nftproxy_dataplane_repairs_total{cause="events_lost"}`))
	}
	if after := e.mustNft(t, "list", "table", "ip", "foreign"); after != foreignBefore {
		t.Errorf("the foreign table changed\n--- before:\n%s\n--- after:\n%s", foreignBefore, after)
	}
}

func (e *env) mustNft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.c.Exec(t.Context(), e.c.NodeNS, append([]string{"nft"}, args...)...)
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// notDNATed returns the node's conntrack entries (conntrack -L lines) of TCP connections
// to ip:port that nothing DNATed: their replies would come from ip itself.
func (e *env) notDNATed(t *testing.T, ip string, port int32) []string {
	t.Helper()
	out, err := e.c.Exec(t.Context(), e.c.NodeNS, "conntrack", "-L", "-p", "tcp", "--orig-dst", ip, "--orig-port-dst", fmt.Sprint(port), "--reply-src", ip)
	if err != nil {
		t.Fatalf("conntrack -L: %v\n%s", err, out)
	}
	var entries []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "tcp ") {
			entries = append(entries, line)
		}
	}
	return entries
}

// waitNoNotDNATed polls notDNATed until it finds no entry or limit has passed; it
// returns the entries left (none: all gone), how many the first look found and how
// long it waited.
func (e *env) waitNoNotDNATed(t *testing.T, ip string, port int32, limit time.Duration) (left []string, seen int, took time.Duration) {
	t.Helper()
	start := time.Now()
	left = e.notDNATed(t, ip, port)
	seen = len(left)
	for len(left) > 0 && time.Since(start) < limit {
		time.Sleep(50 * time.Millisecond)
		left = e.notDNATed(t, ip, port)
	}
	return left, seen, time.Since(start)
}

// escapedPort is the first client port of the entries insertNotDNATed adds: far below
// the ephemeral range the client's connections use.
const escapedPort = 1

// insertNotDNATed adds to the node's conntrack table the entry of an unanswered TCP SYN
// from client:clientPort to ip:port that nothing DNATed, as one that escaped a broken
// table leaves.
func (e *env) insertNotDNATed(t *testing.T, client string, clientPort int, ip string, port int32) {
	t.Helper()
	if out, err := e.c.Exec(t.Context(), e.c.NodeNS, "conntrack", "-I", "-p", "tcp", "-s", client, "-d", ip,
		"--sport", fmt.Sprint(clientPort), "--dport", fmt.Sprint(port), "-r", ip, "-q", client,
		"--reply-port-src", fmt.Sprint(port), "--reply-port-dst", fmt.Sprint(clientPort),
		"--state", "SYN_SENT", "-t", "120"); err != nil {
		t.Fatalf("conntrack -I: %v\n%s", err, out)
	}
}

// logLines returns the lines of log (klog text format) at or after since that contain
// substr.
func logLines(log string, since time.Time, substr string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if at, ok := klogLineTime(line, since.Year()); ok && !at.Before(since.Truncate(time.Microsecond)) && strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// klogLineTime is the time of a klog line, in year.
func klogLineTime(line string, year int) (time.Time, bool) {
	m := klogTime.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return at.AddDate(year, 0, 0), true
}

// deleteNotDNATed deletes the entries notDNATed returns and returns them.
func (e *env) deleteNotDNATed(t *testing.T, ip string, port int32) []string {
	t.Helper()
	entries := e.notDNATed(t, ip, port)
	if len(entries) > 0 {
		if out, err := e.c.Exec(t.Context(), e.c.NodeNS, "conntrack", "-D", "-p", "tcp", "--orig-dst", ip, "--orig-port-dst", fmt.Sprint(port), "--reply-src", ip); err != nil {
			t.Fatalf("conntrack -D: %v\n%s", err, out)
		}
	}
	return entries
}

var counterValuesRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// normalizedListing is `nft list table ip nftproxy` without counter values and with
// its sets and chains sorted (nft lists them in creation order, which a rewrite may
// change); "" if the table does not exist.
func (e *env) normalizedListing(ctx context.Context) string {
	out, err := e.nftList(ctx)
	if err != nil {
		return ""
	}
	s := counterValuesRE.ReplaceAllString(strings.TrimSpace(out), "counter")
	s = strings.TrimSuffix(strings.TrimPrefix(s, "table ip "+tableName+" {"), "}")
	blocks := strings.Split(strings.TrimSpace(s), "\n\n")
	for i := range blocks {
		blocks[i] = strings.TrimSpace(blocks[i])
	}
	sort.Strings(blocks)
	return strings.Join(blocks, "\n\n")
}

// waitStableListing returns the normalized listing once it has not changed for 2s.
func (e *env) waitStableListing(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(converge)
	last, since := "", time.Now()
	for time.Now().Before(deadline) {
		cur := e.normalizedListing(t.Context())
		if cur != last {
			last, since = cur, time.Now()
		} else if cur != "" && time.Since(since) >= 2*time.Second {
			return cur
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the table did not settle within %v:\n%s", converge, last)
	return ""
}

// waitListing polls the listing until it equals want; it returns how long after start
// that was, or -1 and the last listing after limit.
func (e *env) waitListing(t *testing.T, want string, start time.Time, limit time.Duration) (time.Duration, string) {
	t.Helper()
	var last string
	for time.Since(start) < limit {
		if last = e.normalizedListing(t.Context()); last == want {
			return time.Since(start), last
		}
		time.Sleep(5 * time.Millisecond)
	}
	return -1, last
}

// klogTime is klog's header: severity, then local time without a year.
var klogTime = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) `)

// repairLog finds, in nftproxy's log (klog text format, -v=2), the first detection of a
// foreign change at or after since and the end of the next full sync.
func repairLog(log string, since time.Time) (detected, synced time.Time) {
	for _, line := range strings.Split(log, "\n") {
		at, ok := klogLineTime(line, since.Year())
		if !ok || at.Before(since.Truncate(time.Microsecond)) {
			continue
		}
		switch {
		case detected.IsZero() && strings.Contains(line, "repairing"):
			detected = at
		case !detected.IsZero() && strings.Contains(line, `] "Synced" `) && strings.Contains(line, " full=true "):
			return detected, at
		}
	}
	return detected, time.Time{}
}
