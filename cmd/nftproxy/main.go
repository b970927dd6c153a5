// Command nftproxy is a Kubernetes service proxy that programs nftables over netlink. It
// takes kube-proxy's flags; see docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/internal/serve"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

func main() {
	fs, o := options.NewFlagSet()
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "nftproxy:", err)
		os.Exit(2)
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "nftproxy:", err)
		os.Exit(2)
	}
	log := newLogger(o)
	for _, f := range o.Ignored() {
		log.Info("Ignoring kube-proxy flag that has no effect in nftproxy", "flag", f)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error(err, "nftproxy failed")
		os.Exit(1)
	}
}

func newLogger(o *options.Options) logr.Logger {
	cfg := zap.NewProductionConfig()
	if o.LoggingFormat == "text" {
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	}
	cfg.Level = zap.NewAtomicLevelAt(zapcore.Level(-o.Verbosity)) // logr V(n) is zap level -n
	cfg.Sampling = nil
	cfg.DisableStacktrace = true
	z, err := cfg.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftproxy: logger:", err)
		os.Exit(1)
	}
	log := zapr.NewLogger(z)
	klog.SetLogger(log.WithName("client-go")) // route client-go's logs through zap
	return log
}

func run(ctx context.Context, o *options.Options, log logr.Logger) error {
	applier := kernel.New()
	if o.Cleanup {
		for _, fam := range controller.Families {
			if err := applier.Delete(fam, compile.TableName); err != nil {
				return fmt.Errorf("cleanup of %s %s: %w", fam, compile.TableName, err)
			}
		}
		log.Info("Removed nftproxy's tables")
		return nil
	}
	nodeName, err := o.NodeName()
	if err != nil {
		return err
	}
	cidrs, _ := o.ClusterCIDRs()
	cfg := controller.Config{
		NodeName:          nodeName,
		ClusterCIDRs:      cidrs,
		MasqueradeAll:     o.MasqueradeAll,
		MasqueradeBit:     uint32(o.MasqueradeBit),
		NodePortAddresses: o.NodePortAddresses,
		MinSyncPeriod:     o.MinSyncPeriod,
		SyncPeriod:        o.SyncPeriod,
		LocalAddrs:        localAddrs,
	}
	if len(cidrs) == 0 && !o.MasqueradeAll {
		log.Info("No --cluster-cidr: traffic from outside the cluster to cluster IPs will not be masqueraded")
	}
	client, err := newClient(o)
	if err != nil {
		return err
	}
	if o.DryRun {
		return dryRun(ctx, client, cfg)
	}
	log.Info("Starting nftproxy", "node", nodeName, "clusterCIDRs", o.ClusterCIDR)
	p := controller.New(client, applier, cfg, log)
	if err := serve.Start(ctx, log, "healthz", o.HealthzBindAddress, healthMux(p, o)); err != nil {
		return err
	}
	if err := serve.Start(ctx, log, "metrics", o.MetricsBindAddress, serve.MetricsHandler(p.Status)); err != nil {
		return err
	}
	err = p.Run(ctx)
	log.Info("Stopped; nftables rules are left in place for the next nftproxy to take over")
	return err
}

func healthMux(p *controller.Proxy, o *options.Options) http.Handler {
	mux := http.NewServeMux()
	h := serve.HealthHandler(p.Status, o.SyncPeriod)
	mux.Handle("/healthz", h)
	mux.Handle("/livez", h)
	return mux
}

func newClient(o *options.Options) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: o.Master}}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("building API client config: %w", err)
	}
	rc.QPS, rc.Burst = o.KubeAPIQPS, int(o.KubeAPIBurst)
	rc.ContentType = o.KubeAPIContentType
	rc.UserAgent = "nftproxy"
	return kubernetes.NewForConfig(rc)
}

// dryRun lists the API once and prints the rulesets that would be programmed.
func dryRun(ctx context.Context, client kubernetes.Interface, cfg controller.Config) error {
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing services: %w", err)
	}
	slices, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing endpoint slices: %w", err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		node = nil // unknown node: no node ports on primary IPs
	}
	_, rulesets, problems, err := controller.Compile(cfg, map[nft.Family]*compile.Slots{}, ptrs(svcs.Items), ptrs(slices.Items), node)
	if err != nil {
		return err
	}
	for _, p := range problems {
		fmt.Fprintf(os.Stderr, "# ignored: %s\n", p)
	}
	for _, rs := range rulesets {
		fmt.Print(nft.Render(rs))
	}
	return nil
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

func localAddrs() ([]netip.Addr, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
