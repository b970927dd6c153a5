package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Reliability (docs/reliability.md: apiserver loss and least privilege): nftproxy runs under the manifests' ServiceAccount
// and ClusterRole (not admin) with kube-proxy's default health and metrics addresses, and
// survives the API server going away for a minute.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v -run TestReliability

// apiOutage is how long the API server is stopped.
const apiOutage = 60 * time.Second

func TestReliability(t *testing.T) {
	cluster.Require(t)
	e := newEnv(t, 2)
	c := e.c
	kubeconfig := c.LeastPrivilegeKubeconfigT(t)
	// No --healthz-bind-address / --metrics-bind-address: kube-proxy's defaults apply.
	e.startProxy(t, kubeconfig, "--min-sync-period", "100ms", "-v=2")

	e.run(t, "default-bind-addresses", e.testDefaultBindAddresses)
	e.run(t, "least-privilege", func(t *testing.T) { e.testLeastPrivilege(t, kubeconfig) })
	e.run(t, "apiserver-loss", e.testAPIServerLoss)
	// Last, so that it covers the whole run: start, services, outage, relist.
	e.run(t, "no-forbidden-in-log", e.testNoForbidden)
}

// testDefaultBindAddresses: started without the address flags, nftproxy serves health on
// 0.0.0.0:10256 (reachable on the node's address from the LAN) and metrics on
// 127.0.0.1:10249 only, kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1/defaults.go:
// bindAddress 0.0.0.0 → healthz "0.0.0.0:10256", metrics "127.0.0.1:10249").
func (e *env) testDefaultBindAddresses(t *testing.T) {
	c := e.c
	nodeIP := c.NodeIP.String()
	for _, x := range []struct{ ns, url string }{
		{c.ExternalNS, "http://" + hostPort(nodeIP, 10256) + "/healthz"},
		{c.ExternalNS, "http://" + hostPort(nodeIP, 10256) + "/livez"},
		{c.NodeNS, "http://127.0.0.1:10256/healthz"},
	} {
		code, body, err := c.HTTPGet(t.Context(), x.ns, x.url)
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"healthy":true`) {
			t.Errorf("GET %s from %s: %d %v %s", x.url, x.ns, code, err, body)
		}
	}
	code, body, err := c.HTTPGet(t.Context(), c.NodeNS, "http://127.0.0.1:10249/metrics")
	if err != nil || code != http.StatusOK || !strings.Contains(string(body), "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
		t.Errorf("metrics on 127.0.0.1:10249 in the node: %d %v (%d bytes)", code, err, len(body))
	}
	// Not on the node's own address: the metrics server is bound to loopback.
	for _, x := range []struct{ ns, url string }{
		{c.NodeNS, "http://" + hostPort(nodeIP, 10249) + "/metrics"},
		{c.ExternalNS, "http://" + hostPort(nodeIP, 10249) + "/metrics"},
	} {
		code, _, err := c.HTTPGet(t.Context(), x.ns, x.url)
		if err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("GET %s from %s: %d %v, want connection refused (metrics only on 127.0.0.1)", x.url, x.ns, code, err)
		}
	}
}

// testLeastPrivilege checks the identity nftproxy runs under: the manifests'
// ServiceAccount, allowed to read what the proxy watches and nothing more (no Secrets,
// no writes to Services), and that the check itself bites: the same nftproxy with a
// token of a ServiceAccount without the binding logs "forbidden".
func (e *env) testLeastPrivilege(t *testing.T, kubeconfig string) {
	c, ctx := e.c, t.Context()
	rbac, err := cluster.ManifestRBAC(cluster.ManifestsDir())
	if err != nil {
		t.Fatal(err)
	}
	lp, err := c.ClientFor(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	review, err := lp.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo.Username; got != rbac.Username() {
		t.Errorf("kubeconfig authenticates as %q, want %q", got, rbac.Username())
	}

	forbidden := map[string]func() error{
		"list secrets in kube-system": func() error {
			_, err := lp.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		},
		"list secrets in all namespaces": func() error {
			_, err := lp.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		},
		"create a service": func() error {
			_, err := lp.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "lp-must-not-create"},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}},
			}, metav1.CreateOptions{})
			return err
		},
		"delete the kubernetes service": func() error {
			return lp.CoreV1().Services(ns).Delete(ctx, "kubernetes", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		},
		"update a node": func() error {
			n, err := lp.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("get (allowed) failed: %w", err)
			}
			n.Labels["nftproxy-e2e"] = "x"
			_, err = lp.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		},
		"list pods": func() error {
			_, err := lp.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list configmaps": func() error {
			_, err := lp.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
			return err
		},
	}
	for what, f := range forbidden {
		if err := f(); !apierrors.IsForbidden(err) {
			t.Errorf("%s with the least-privilege kubeconfig: %v, want 403 Forbidden", what, err)
		}
	}
	allowed := map[string]func() error{
		"list services": func() error {
			_, err := lp.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list endpointslices": func() error {
			_, err := lp.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list servicecidrs": func() error {
			_, err := lp.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
			return err
		},
		"get its node": func() error {
			_, err := lp.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
			return err
		},
	}
	for what, f := range allowed {
		if err := f(); err != nil {
			t.Errorf("%s with the least-privilege kubeconfig: %v", what, err)
		}
	}

	// The control: the same binary with a token of a ServiceAccount that has no
	// binding is refused, and says "forbidden" in its output, which is what
	// no-forbidden-in-log looks for.
	unbound := relUnboundKubeconfig(t, c, kubeconfig)
	run, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := c.Exec(run, c.NodeNS, e.bin, "--dry-run", "--kubeconfig", unbound, "--hostname-override", c.NodeName, "--cluster-cidr", clusterCIDR)
	if !regexp.MustCompile(`(?i)forbidden`).Match(out) {
		t.Errorf("nftproxy --dry-run with an unbound ServiceAccount's token did not log \"forbidden\":\n%s", relTail(string(out), 20))
	}
}

// relUnboundKubeconfig writes a copy of kubeconfig whose token belongs to a new
// ServiceAccount without any binding.
func relUnboundKubeconfig(t *testing.T, c *cluster.Cluster, kubeconfig string) string {
	t.Helper()
	ctx := t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nftproxy-unbound", Namespace: "kube-system"}}
	if _, err := c.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Token = tr.Status.Token
	}
	path := kubeconfig + "-unbound"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// relHealthSample is one answer of the health server during testAPIServerLoss.
type relHealthSample struct {
	at   time.Time
	path string
	code int
	err  error
}

// testAPIServerLoss stops kube-apiserver for a minute while clients connect to a
// ClusterIP (from a pod) and a node port (from off-cluster) every 100 ms: not one
// connection may fail, /healthz and /livez stay 200 (nothing is queued: kube-proxy's
// rule), the table is unchanged after the minute (while the periodic syncs from the
// informer cache go on), nftproxy keeps running; after the API server
// returns, a new service works.
func (e *env) testAPIServerLoss(t *testing.T) {
	c, ctx := e.c, t.Context()
	svc := e.createService(t, "steady", corev1.ServiceTypeNodePort, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	clusterIP := hostPort(svc.Spec.ClusterIP, 80)
	nodePort := hostPort(c.NodeIP.String(), svc.Spec.Ports[0].NodePort)
	e.waitOK(t, "steady ClusterIP", e.client.NS, "tcp", clusterIP)
	e.waitOK(t, "steady node port", c.ExternalNS, "tcp", nodePort)

	// Bounded client loops: 2500 attempts each, 100 ms apart (a little over 4 minutes
	// when every attempt answers); stopped once the API server is back and a new service
	// works.
	spec := func(addr string) cluster.ProbeSpec {
		return cluster.ProbeSpec{Proto: "tcp", Addr: addr, Count: 2500, Timeout: time.Second, Interval: 100 * time.Millisecond}
	}
	cipRun, err := c.StartProbe(ctx, e.client.NS, spec(clusterIP))
	if err != nil {
		t.Fatal(err)
	}
	npRun, err := c.StartProbe(ctx, c.ExternalNS, spec(nodePort))
	if err != nil {
		t.Fatal(err)
	}

	// Health, as a load balancer sees it: from the LAN, every 250 ms.
	var (
		mu     sync.Mutex
		health []relHealthSample
	)
	pollCtx, stopPoll := context.WithCancel(ctx)
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for pollCtx.Err() == nil {
			for _, path := range []string{"/healthz", "/livez"} {
				code, _, err := c.HTTPGet(pollCtx, c.ExternalNS, "http://"+hostPort(c.NodeIP.String(), 10256)+path)
				if pollCtx.Err() != nil {
					return
				}
				mu.Lock()
				health = append(health, relHealthSample{time.Now(), path, code, err})
				mu.Unlock()
			}
			select {
			case <-pollCtx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	defer func() { stopPoll(); <-pollDone }()

	time.Sleep(2 * time.Second)
	before := e.relNftStateless(t)
	logBefore := e.relLogSize(t)
	if err := c.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	downAt := time.Now()
	probeCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(probeCtx)
	cancel()
	if err == nil {
		t.Fatal("kube-apiserver still answers /readyz after StopAPIServer")
	}
	t.Logf("kube-apiserver down at %s (/readyz: %v)", downAt.Format(time.TimeOnly), err)
	for time.Since(downAt) < apiOutage {
		if !e.proxy.Running() {
			t.Fatalf("nftproxy exited %v into the outage; log:\n%s", time.Since(downAt).Round(time.Second), e.proxy.Tail(40))
		}
		time.Sleep(time.Second)
	}
	after := e.relNftStateless(t)
	if after != before {
		t.Errorf("the ruleset changed during the outage:\n--- before\n%s\n--- after %v\n%s", before, apiOutage, after)
	}
	if !commentRE("steady").MatchString(after) {
		t.Errorf("default/steady is not in the table after the outage:\n%s", after)
	}
	// The sync loop keeps running during the outage (--sync-period, default 30 s),
	// from the informer cache; how many syncs it logs is reported, not asserted (what a
	// periodic sync rewrites is the controller's business).
	t.Logf("%d syncs logged during the outage; the table unchanged", strings.Count(e.relLogSince(t, logBefore), "Synced"))
	mu.Lock()
	outageHealth := append([]relHealthSample(nil), health...)
	mu.Unlock()

	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	backAt := time.Now()
	t.Logf("kube-apiserver ready again after %v down", backAt.Sub(downAt).Round(100*time.Millisecond))

	// A service created now must be programmed once the proxy's watches come back:
	// after a minute of failures client-go's reflectors retry every 30-60 s, so allow
	// two minutes.
	fresh := e.createService(t, "after-return", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, fresh, endpoint(e.web[1], ready))
	freshAddr := hostPort(fresh.Spec.ClusterIP, 80)
	var reachable time.Duration
	for deadline := backAt.Add(2 * time.Minute); ; {
		res := e.probe(t, e.client.NS, "tcp", freshAddr, 1, 300*time.Millisecond)
		if allOK(res) {
			reachable = time.Since(backAt)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service created after the API server returned is not reachable 2 minutes later: %s; log:\n%s", summary(res), e.proxy.Tail(30))
		}
		if !e.proxy.Running() {
			t.Fatalf("nftproxy exited after the API server returned; log:\n%s", e.proxy.Tail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("API server ready → new service reachable: %v", reachable.Round(100*time.Millisecond))
	expectAnswered(t, "after-return", e.probe(t, e.client.NS, "tcp", freshAddr, 10, time.Second), e.web[1:2], is(e.client.IP.String()))
	// Converged: both services are in the table, health is 200.
	table := e.relNftStateless(t)
	for _, name := range []string{"steady", "after-return"} {
		if !commentRE(name).MatchString(table) {
			t.Errorf("default/%s missing from the table after the return", name)
		}
	}
	time.Sleep(time.Second) // a few more health samples and connections after convergence
	stopPoll()
	<-pollDone

	for _, x := range []struct {
		what string
		run  *cluster.ProbeRun
	}{{"pod → ClusterIP " + clusterIP, cipRun}, {"external → node port " + nodePort, npRun}} {
		res, err := x.run.Stop()
		if err != nil {
			t.Error(err)
		}
		failed := 0
		for _, r := range res {
			if !r.OK {
				failed++
			}
		}
		if len(res) == 0 || res[0].At.After(downAt) || res[len(res)-1].At.Before(backAt.Add(reachable)) {
			t.Errorf("%s: the client loop did not cover the outage and the return (%d attempts)", x.what, len(res))
			continue
		}
		t.Logf("%s: %d connections from %s to %s, %d failed", x.what, len(res),
			res[0].At.Format(time.TimeOnly), res[len(res)-1].At.Format(time.TimeOnly), failed)
		if failed != 0 {
			t.Errorf("%s: %d of %d connections failed: %s", x.what, failed, len(res), summary(res))
		}
	}

	mu.Lock()
	defer mu.Unlock()
	codes := map[string]map[string]int{"outage": {}, "after": {}}
	for _, s := range health {
		phase := "after"
		if s.at.Before(backAt) {
			phase = "outage"
		}
		key := s.path + " " + fmt.Sprint(s.code)
		if s.err != nil {
			key = s.path + " error"
			t.Errorf("%s at %s: %v", s.path, s.at.Format(time.TimeOnly), s.err)
		}
		codes[phase][key]++
		if s.code != http.StatusOK && s.err == nil {
			t.Errorf("%s at %s: %d, want 200 (nothing queued: kube-proxy stays healthy without updates)", s.path, s.at.Format(time.TimeOnly), s.code)
		}
	}
	if len(outageHealth) < int(apiOutage/time.Second) {
		t.Errorf("only %d health samples before the return", len(outageHealth))
	}
	t.Logf("health answers during the outage: %s; after the return: %s", fmtCounts(codes["outage"]), fmtCounts(codes["after"]))
	if !e.proxy.Running() {
		t.Errorf("nftproxy is not running at the end; log:\n%s", e.proxy.Tail(40))
	}
}

// testNoForbidden: nftproxy, under the least-privilege ServiceAccount, never logged a
// "forbidden" (403) during the whole run.
func (e *env) testNoForbidden(t *testing.T) {
	b, err := os.ReadFile(e.proxy.Log)
	if err != nil {
		t.Fatal(err)
	}
	rbac, err := cluster.ManifestRBAC(cluster.ManifestsDir())
	if err != nil {
		t.Fatal(err)
	}
	var bad, warmup []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(strings.ToLower(line), "forbidden") {
			continue
		}
		// A restarted kube-apiserver refuses requests its RBAC authorizer has not
		// loaded the rules for yet (apiserver-loss restarts it): a 403 for what the
		// ClusterRole grants is that, not a missing permission.
		if m := forbiddenRequest.FindStringSubmatch(line); m != nil && grants(rbac.ClusterRole, m[1], m[2]) {
			warmup = append(warmup, line)
			continue
		}
		bad = append(bad, line)
	}
	if len(warmup) > 0 {
		t.Logf("%d 403s for permissions the ClusterRole grants (the restarted API server's authorizer warming up):\n%s", len(warmup), strings.Join(warmup[:min(len(warmup), 3)], "\n"))
	}
	if len(bad) > 0 {
		t.Errorf("%d forbidden lines in %s:\n%s", len(bad), e.proxy.Log, strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if n := strings.Count(string(b), "Synced") + strings.Count(string(b), "First sync done"); n < 3 {
		t.Errorf("only %d syncs logged: the log does not cover a real run", n)
	}
}

// forbiddenRequest finds the verb and resource of an API server's 403 message.
var forbiddenRequest = regexp.MustCompile(`cannot (\w+) resource \\?"([a-z.]+)\\?"`)

// grants reports whether the ClusterRole allows verb on resource (of any group).
func grants(role *rbacv1.ClusterRole, verb, resource string) bool {
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, resource) && (slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// relNftStateless lists nftproxy's IPv4 and IPv6 tables without counter values
// (`nft -s`), so traffic does not change the listing.
func (e *env) relNftStateless(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, fam := range []string{"ip", "ip6"} {
		out, err := e.c.Exec(t.Context(), e.c.NodeNS, "nft", "-s", "list", "table", fam, tableName)
		if err != nil {
			t.Fatalf("nft -s list table %s %s: %v: %s", fam, tableName, err, out)
		}
		b.Write(out)
	}
	return b.String()
}

func (e *env) relLogSize(t *testing.T) int64 {
	t.Helper()
	fi, err := os.Stat(e.proxy.Log)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func (e *env) relLogSince(t *testing.T, offset int64) string {
	t.Helper()
	b, err := os.ReadFile(e.proxy.Log)
	if err != nil {
		t.Fatal(err)
	}
	if offset > int64(len(b)) {
		return ""
	}
	return string(b[offset:])
}

func relTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
