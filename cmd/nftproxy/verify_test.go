package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/inspect"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/serve"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// kernelOf is a fake kernel holding what other rulesets encode to.
type kernelOf struct {
	tables map[nft.Family]*wire.TableState
	seen   int
}

func (k *kernelOf) Verify(rs *nft.Ruleset, opts ...readback.Option) (readback.Diff, error) {
	k.seen++
	return readback.Compare(k.tables[rs.Family], rs, opts...)
}

func fakeKernel(t *testing.T, rulesets []*nft.Ruleset) *kernelOf {
	k := &kernelOf{tables: map[nft.Family]*wire.TableState{}}
	for _, rs := range rulesets {
		st, err := wire.EncodeState(rs)
		if err != nil {
			t.Fatal(err)
		}
		k.tables[rs.Family] = st
	}
	return k
}

// proxyFlags is the controller configuration a proxy command line gives.
func proxyFlags(t *testing.T, args ...string) controller.Config {
	fs, o := options.NewFlagSet()
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	cfg, err := proxyConfig(o, localAddrs)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestVerifyOnce compiles the API objects as the proxy does with its flags and compares
// with the kernel: equal when the kernel holds what a proxy with the same flags (and
// another slot history) programmed; different when the flags or the objects differ.
func TestVerifyOnce(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(cluster()...)
	flags := []string{"--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16,fd00:244::/56"}
	cfg := proxyFlags(t, flags...)

	// what a proxy programmed: compiled after another service came and went
	svcs, _ := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	eps, _ := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	node, _ := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	slots := map[nft.Family]*compile.Slots{}
	extra := service("first", "ClusterIP", []string{"10.96.9.9"}, 80, 0)
	_, _, _, _ = pipeline.Compile(cfg.Pipeline, slots, append(ptrs(svcs.Items), extra), append(ptrs(eps.Items), slice("first", "first", "IPv4", "node-2", "10.244.9.1", "10.244.9.2")), node)
	withCIDRs := cfg
	withCIDRs.Pipeline.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")} // the ServiceCIDR object's
	_, programmed, _, err := pipeline.Compile(withCIDRs.Pipeline, slots, ptrs(svcs.Items), ptrs(eps.Items), node)
	if err != nil {
		t.Fatal(err)
	}
	k := fakeKernel(t, programmed)

	res, err := verifyOnce(ctx, client, cfg, k)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Diff.Empty() || k.seen != 2 || res.ServicePorts == 0 {
		t.Fatalf("same objects and flags: %d families compared, %d service ports, differences:\n%s", k.seen, res.ServicePorts, res.Diff)
	}

	// another masquerade bit
	// (the bit is nftables.masqueradeBit of --config: --iptables-masquerade-bit has no
	// effect in nftables mode, as in kube-proxy)
	bitFile := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(bitFile, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.244.0.0/16,fd00:244::/56\nnftables: {masqueradeBit: 15}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err = verifyOnce(ctx, client, proxyFlags(t, "--hostname-override", "node-1", "--config", bitFile), k)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Diff.String(), "ip nftproxy: chain mark-for-masquerade: rule 0 differs") {
		t.Errorf("other masquerade bit:\n%s", res.Diff)
	}

	// services deleted from the API but still in the kernel: one on the flat path (its
	// frontends and endpoints are elements), one with session affinity (a chain of its own)
	for _, name := range []string{"echo", "sticky"} {
		if err := client.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	res, err = verifyOnce(ctx, client, cfg, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`ip nftproxy: set cluster-frontends: extra element 10.96.0.10 . tcp . 80 comment "default/echo"`,
		`ip nftproxy: set endpoints: extra element 10.96.0.10 . tcp . 80 . 1 : 10.244.1.3 . 8080`,
		`ip6 nftproxy: set endpoints: extra element fd00:96::10 . tcp . 80 . 0 : fd00:244::1:2 . 8080`,
		`ip nftproxy: set service-ips: extra element 10.96.1.5 . tcp . 80 : goto svc-default/sticky/tcp/- comment "default/sticky"`,
		"ip nftproxy: chain svc-default/sticky/tcp/- extra",
	} {
		if !strings.Contains(res.Diff.String(), want) {
			t.Errorf("deleted service: no line %q in\n%s", want, res.Diff)
		}
	}
	var out bytes.Buffer
	if code := verifyLoop(ctx, client, cfg, k, 0, &out, &out); code != 1 || !strings.Contains(out.String(), "different: ") {
		t.Errorf("verifyLoop: code %d\n%s", code, out.String())
	}
}

// TestVerifyReadsRunningProxySettings: verify given --from-configz and the proxy's
// metrics address reads its settings from /configz (here a non-default --cluster-cidr
// and the node name), with a warning that nothing authenticates them, and finds no
// difference; flags given override them; an unreachable /configz is said and the flags
// alone count. Without --from-configz /configz is never asked.
func TestVerifyReadsRunningProxySettings(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewUnstartedServer(nil)
	addr := srv.Listener.Addr().String()
	proxyArgs := []string{"--hostname-override", "node-1", "--cluster-cidr", "10.99.0.0/16,fd00:99::/56", "--metrics-bind-address", addr}
	fs, o := options.NewFlagSet()
	if err := fs.Parse(proxyArgs); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = serve.MetricsPages{Metrics: http.NotFoundHandler(), Config: o.EffectiveConfig()}.Handler()
	srv.Start()

	client := fake.NewClientset(cluster()...)
	state, err := listAPI(ctx, client, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	_, programmed, _, err := state.compile(proxyFlags(t, proxyArgs...))
	if err != nil {
		t.Fatal(err)
	}
	k := fakeKernel(t, programmed)

	compare := func(args ...string) (readback.Diff, string) {
		t.Helper()
		var stderr bytes.Buffer
		o, cfg, _, code := verifySettings(args, &stderr)
		if o == nil {
			t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
		}
		res, err := verifyOnce(ctx, client, cfg, k)
		if err != nil {
			t.Fatal(err)
		}
		return res.Diff, stderr.String()
	}
	diff, msg := compare("--from-configz", "--metrics-bind-address", addr)
	if !diff.Empty() || !strings.Contains(msg, "using the running proxy's settings from http://"+addr+"/configz") ||
		!strings.Contains(msg, "warning: http://"+addr+"/configz is unauthenticated") {
		t.Errorf("settings from /configz: %q, differences:\n%s", msg, diff)
	}
	// an explicit flag wins over /configz: the proxy's cluster CIDR is not the default
	if diff, _ := compare("--from-configz", "--metrics-bind-address", addr, "--cluster-cidr", "10.244.0.0/16,fd00:244::/56"); diff.Empty() {
		t.Error("--cluster-cidr given to verify was not used")
	}
	// without --from-configz, the flags alone count
	if diff, msg := compare("--metrics-bind-address", addr, "--hostname-override", "node-1"); diff.Empty() || strings.Contains(msg, "/configz") {
		t.Errorf("without --from-configz the proxy's /configz was read: %q", msg)
	} else {
		t.Logf("flags alone: %d false differences", len(diff))
	}
	srv.Close()
	diff, msg = compare("--from-configz", "--metrics-bind-address", addr, "--hostname-override", "node-1")
	if diff.Empty() || !strings.Contains(msg, "could not read the running proxy's settings") || !strings.Contains(msg, "comparing with the flags given alone") {
		t.Errorf("unreachable /configz: %q, %d differences", msg, len(diff))
	}
}

// TestVerifyIgnoresFakeConfigz: the kernel masquerades everything (what a tampered
// proxy would program: every endpoint loses the client's address) and a process on the
// metrics port serves a /configz that says --masquerade-all. verify given the proxy's
// real settings must report the difference, not take the fake ones as its reference.
func TestVerifyIgnoresFakeConfigz(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewUnstartedServer(nil)
	addr := srv.Listener.Addr().String()
	tampered := []string{"--hostname-override", "node-1", "--masquerade-all", "--metrics-bind-address", addr}
	fs, o := options.NewFlagSet()
	if err := fs.Parse(tampered); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = serve.MetricsPages{Metrics: http.NotFoundHandler(), Config: o.EffectiveConfig()}.Handler()
	srv.Start()
	defer srv.Close()
	client := fake.NewClientset(cluster()...)
	state, err := listAPI(ctx, client, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	_, programmed, _, err := state.compile(proxyFlags(t, tampered...))
	if err != nil {
		t.Fatal(err)
	}
	k := fakeKernel(t, programmed)
	// the real proxy's settings, as its file holds them
	file := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: node-1\nmetricsBindAddress: "+addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--hostname-override", "node-1", "--metrics-bind-address", addr}, // the flags
		{"--config", file},
	} {
		var stderr bytes.Buffer
		o, cfg, _, code := verifySettings(args, &stderr)
		if o == nil {
			t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
		}
		res, err := verifyOnce(ctx, client, cfg, k)
		if err != nil {
			t.Fatal(err)
		}
		if res.Diff.Empty() {
			t.Errorf("%q: a masquerade-all kernel compared equal (stderr %q)", args, stderr.String())
		}
		if strings.Contains(stderr.String(), "using the running proxy's settings") {
			t.Errorf("%q: read /configz without --from-configz: %q", args, stderr.String())
		}
	}
	// asked for explicitly, /configz is used, with a warning
	var stderr bytes.Buffer
	if _, _, _, code := verifySettings([]string{"--from-configz", "--config", file}, &stderr); code != inspect.VerifyError {
		t.Errorf("--from-configz with --config: exit %d, want %d", code, inspect.VerifyError)
	}
}

// With --config (the proxy's own file, whose clientConnection.kubeconfig is the pod's
// path), a --kubeconfig given to verify is still the one it uses; without the flag the
// file's stands.
func TestVerifyKubeconfigOverConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection: {kubeconfig: /etc/nftproxy/kubeconfig.conf}\nclusterCIDR: 10.244.0.0/16\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", file, "--kubeconfig", "/tmp/admin.conf", "--hostname-override", "node-1"}, "/tmp/admin.conf"},
		{[]string{"--config", file, "--hostname-override", "node-1"}, "/etc/nftproxy/kubeconfig.conf"},
	} {
		var stderr bytes.Buffer
		o, _, _, code := verifySettings(tc.args, &stderr)
		if o == nil {
			t.Fatalf("%q: exit %d: %s", tc.args, code, stderr.String())
		}
		if o.Kubeconfig != tc.want {
			t.Errorf("%q: kubeconfig %q, want %q", tc.args, o.Kubeconfig, tc.want)
		}
	}
}

// TestVerifyWithoutUnavailableFastPath: on a kernel that refuses flowtables the proxy
// runs without the fast path, so verify compares without it (and says so); where the
// kernel has them, or without the option, the settings stay.
func TestVerifyWithoutUnavailableFastPath(t *testing.T) {
	refuse := func(nft.Family) error { return errors.New("no such file or directory") }
	accept := func(nft.Family) error { return nil }
	for _, tc := range []struct {
		name   string
		ifs    []string
		probe  func(nft.Family) error
		want   []string
		logged bool
	}{
		{"refused", []string{"eth0"}, refuse, nil, true},
		{"accepted", []string{"eth0"}, accept, []string{"eth0"}, false},
		{"off", nil, refuse, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg controller.Config
			cfg.Pipeline.FastPathInterfaces = tc.ifs
			var log strings.Builder
			withoutUnavailableFastPath(&cfg, tc.probe, &log)
			if !slices.Equal(cfg.Pipeline.FastPathInterfaces, tc.want) {
				t.Errorf("fast path interfaces %q, want %q", cfg.Pipeline.FastPathInterfaces, tc.want)
			}
			if got := strings.Contains(log.String(), "refuses flowtables"); got != tc.logged {
				t.Errorf("logged %v, want %v: %q", got, tc.logged, log.String())
			}
		})
	}
}
