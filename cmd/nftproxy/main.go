// Command nftproxy is a Kubernetes service proxy that programs nftables over netlink. It
// takes kube-proxy's flags; see docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/healthcheck"
	"github.com/nftproxy/nftproxy/internal/leftovers"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/serve"
	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
	"github.com/nftproxy/nftproxy/internal/version"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/monitor"
)

func main() {
	featureOverrides := quietClientGoFeatures() // before any client-go use, subcommands too
	if len(os.Args) > 1 && os.Args[1] == "explain" {
		os.Exit(runExplain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "verify" {
		os.Exit(runVerify(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "list" {
		os.Exit(runList(os.Args[2:], os.Stdout, os.Stderr))
	}
	mem := startMemoryPolicy(os.Getenv) // memory.go
	fs, o := options.NewFlagSet()
	if code, exit := configure(fs, o, os.Args[1:], os.Stderr); exit {
		os.Exit(code)
	}
	log, err := newLogger(os.Stderr, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftproxy: logger:", err)
		os.Exit(1)
	}
	defer flushLogs() // and before os.Exit below
	logVersion(log, kernel.RunningRelease)
	for _, n := range o.Notes() {
		log.Info("Configuration", "note", n)
	}
	for _, f := range featureOverrides {
		log.Info("client-go feature gate set from the environment", "feature", f)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, fs, log, mem); err != nil {
		log.Error(err, "nftproxy failed")
		flushLogs()
		os.Exit(1)
	}
}

// configure parses the command line, loads --config and validates; it handles
// --help and --write-config-to. exit tells main to exit with code right away.
func configure(fs *pflag.FlagSet, o *options.Options, args []string, stderr io.Writer) (code int, exit bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() { proxyUsage(stderr, fs) } // args.go
	showVersion := addVersionFlag(fs)
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") { // before flags that only a subcommand knows
		fmt.Fprintln(stderr, "nftproxy:", checkArgs(args[:1]))
		return 2, true
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0, true
		}
		fmt.Fprintln(stderr, "nftproxy:", err)
		return 2, true
	}
	if printVersion(showVersion, stdout) {
		return 0, true
	}
	if err := checkArgs(fs.Args()); err != nil {
		fmt.Fprintln(stderr, "nftproxy:", err)
		return 2, true
	}
	if err := o.Complete(fs); err != nil {
		fmt.Fprintln(stderr, "nftproxy:", err)
		return 2, true
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, "nftproxy:", err)
		return 2, true
	}
	if o.WriteConfigTo != "" {
		for _, n := range o.Notes() {
			fmt.Fprintln(stderr, "nftproxy: note:", n)
		}
		if err := config.WriteFile(o.WriteConfigTo, o.EffectiveConfig()); err != nil {
			fmt.Fprintln(stderr, "nftproxy: --write-config-to:", err)
			return 1, true
		}
		fmt.Fprintln(stderr, "nftproxy: wrote the effective configuration to", o.WriteConfigTo)
		return 0, true
	}
	if err := checkPlaceholder(o); err != nil { // placeholder.go
		fmt.Fprintln(stderr, "nftproxy:", err)
		return 2, true
	}
	return 0, false
}

// quietClientGoFeatures replaces client-go's own feature gates, which log the default
// state of each of its features (ten INFO lines at -v=1 and above) when first used, with
// the same defaults and the same KUBE_FEATURE_<name>=true|false environment overrides,
// silently (as kube-proxy, which hands them to its own feature gate). It returns the
// overrides found, for one log line each.
func quietClientGoFeatures() (overrides []string) {
	specs := featureSpecs{}
	_ = clientfeatures.AddFeaturesToExistingFeatureGates(specs) // featureSpecs.Add cannot fail
	gates := clientGoGates{}
	for f, spec := range specs {
		gates[f] = spec.Default
		v, ok := os.LookupEnv("KUBE_FEATURE_" + string(f))
		if !ok {
			continue
		}
		b, err := strconv.ParseBool(v)
		switch {
		case err != nil:
			overrides = append(overrides, fmt.Sprintf("%s: %q is not true or false; default %v kept", f, v, spec.Default))
		case spec.LockToDefault && b != spec.Default:
			overrides = append(overrides, fmt.Sprintf("%s is locked to %v; %q ignored", f, spec.Default, v))
		default:
			gates[f] = b
			overrides = append(overrides, fmt.Sprintf("%s=%v", f, b))
		}
	}
	clientfeatures.ReplaceFeatureGates(gates)
	slices.Sort(overrides)
	return overrides
}

type featureSpecs map[clientfeatures.Feature]clientfeatures.FeatureSpec

func (s featureSpecs) Add(m map[clientfeatures.Feature]clientfeatures.FeatureSpec) error {
	maps.Copy(s, m)
	return nil
}

type clientGoGates map[clientfeatures.Feature]bool

func (g clientGoGates) Enabled(f clientfeatures.Feature) bool { return g[f] }

// run runs the proxy until ctx ends; mem is the memory policy's state (nil when GOGC
// is set), moved to its next phase when the caches are synced and after the first sync.
func run(ctx context.Context, o *options.Options, fs *pflag.FlagSet, log logr.Logger, mem *memoryPolicy) error {
	started := time.Now()
	applier := kernel.New()
	if o.Cleanup {
		for _, fam := range pipeline.Families {
			if err := applier.Delete(fam, compile.TableName); err != nil {
				return fmt.Errorf("cleanup of %s %s: %w", fam, compile.TableName, err)
			}
		}
		log.Info("Removed nftproxy's tables")
		return nil
	}
	cfg, err := proxyConfig(o, localAddrs)
	if err != nil {
		return err
	}
	nodeName := cfg.NodeName
	if dl := cfg.Pipeline.Compile.DetectLocal; dl.Mode == compile.LocalClusterCIDR && len(dl.ClusterCIDRs) == 0 && !o.MasqueradeAll {
		log.Info("No --cluster-cidr: traffic from outside the cluster to cluster IPs will not be masqueraded")
	}
	rc, err := clientConfig(o)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	cfg.APIServer = rc.Host
	if o.DryRun {
		return dryRun(ctx, client, cfg)
	}
	if err := checkKernel(log, kernel.RunningRelease); err != nil {
		return err
	}
	if err := conntrack.SetSysctls(log, o.Conntrack, conntrack.SysctlEnv{}); err != nil {
		return fmt.Errorf("could not set conntrack parameters: %w", err)
	}
	log.Info("Starting nftproxy", "node", nodeName, "detectLocalMode", cfg.Pipeline.Compile.DetectLocal.Mode, "clusterCIDRs", o.ClusterCIDRs, "apiServer", rc.Host)
	leftovers.Warn(log, applier)
	ct, err := netlink.NewHandle(unix.NETLINK_NETFILTER) // stale UDP conntrack entries
	if err != nil {
		return fmt.Errorf("netlink handle for conntrack: %w", err)
	}
	defer ct.Close()
	cfg.Conntrack = ct
	hc := healthcheck.New(net.Listen, "", log.WithName("healthcheck")) // healthCheckNodePorts
	defer hc.Close()
	cfg.HealthChecks = hc
	rec := metrics.New(metrics.Options{
		// per-service counters, attributed by element key, served on /metrics/services
		// only and read at most once per interval however often scraped
		ServiceCounters:         metrics.KernelCounters(applier, pipeline.Families),
		NoServiceCounters:       !o.ServiceCounters,
		ServiceCountersInterval: o.ServiceCountersMinInterval,
		Log:                     log,
		// client-go's rest_client_* and the Go and process metrics, from
		// component-base's registry as kube-proxy serves them
		Also:             metrics.Legacy(),
		NoRuntimeMetrics: true,
	})
	rec.Registry().MustRegister(version.NewCollector())
	cfg.Metrics = rec
	if mem != nil {
		cfg.CachesSynced = mem.cachesSynced
	}
	p := controller.New(client, applier, cfg, log)
	// Self-healing: another process changing our tables is noticed at once (not only
	// at the hourly full sync) and repaired by the next sync. The monitor starts after
	// the first sync: that sync rewrites the whole table anyway, and with a listener the
	// kernel also builds a change event for every object of that transaction, which at
	// 30,000 service ports made the first sync's kernel time 3.7 s → 17 s.
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-p.Synced():
		}
		// repairs back off while another process keeps changing the tables
		repairs := controller.NewRepairer(p, controller.RepairBackoff{})
		mon := monitor.New(controller.Tables(), repairs.Changed, monitor.IgnoreWritesOf(applier))
		if err := mon.Start(ctx); err != nil {
			log.Error(err, "Cannot watch nftables for changes by other processes; drift is only repaired by the hourly full sync")
			return
		}
		log.Info("Watching nftables for changes to our tables by other processes; they are repaired within --min-sync-period", "minSyncPeriod", o.MinSyncPeriod)
		<-mon.Done()
		if err := mon.Err(); err != nil {
			log.Error(err, "nftables monitor stopped; drift is only repaired by the hourly full sync")
		}
	}()
	if mem != nil {
		go func() {
			select {
			case <-ctx.Done():
			case <-p.Synced():
				mem.firstSyncDone()
			}
		}()
	}
	hc.SetProxyHealth(func() bool { return serve.Healthy(p.Status(), o.SyncPeriod, time.Now()) })
	health := &serve.Health{Status: p.Status, SyncPeriod: o.SyncPeriod, Node: p.Node, Probes: rec,
		Started: started, StartupGrace: serve.StartupGrace}
	// Both servers answer from now on, while p.Run waits for the API server.
	if err := serve.Start(ctx, log, "healthz", o.HealthzBindAddress, health.Handler(), httplimit.Health); err != nil {
		return err
	}
	configz := o.EffectiveConfig()
	configz.EnableProfiling = o.Profiling
	pages := serve.MetricsPages{Metrics: rec.Handler(), Services: rec.ServicesHandler(), Config: configz, Flags: func() map[string]string { return flagValues(fs) },
		Started: started, Version: version.Get().GitVersion, Profiling: o.Profiling}
	if err := serve.Start(ctx, log, "metrics", o.MetricsBindAddress, pages.Handler(), httplimit.Metrics); err != nil {
		return err
	}
	err = p.Run(ctx)
	log.Info("Stopped; nftables rules are left in place for the next nftproxy to take over")
	return err
}

// flagValues is every flag of the command line with its value, for /flagz.
func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// proxyConfig is the controller configuration the flags (and --config) give. It is the
// only one: the proxy, --dry-run, verify and explain all compile with it, so none can
// disagree with the proxy. addrs lists the node's addresses: the machine's (localAddrs)
// where nftproxy runs on the node; explain, which may run elsewhere, gives the Node
// object's.
func proxyConfig(o *options.Options, addrs func() ([]netip.Addr, error)) (controller.Config, error) {
	nodeName, err := o.NodeName()
	if err != nil {
		return controller.Config{}, err
	}
	served, own, anyAddr := o.ServedPorts()
	if anyAddr { // a server on 0.0.0.0 answers on every address the node has now
		if local, err := addrs(); err == nil {
			own = append(own, local...)
		}
	}
	return controller.Config{
		NodeName:      nodeName,
		MinSyncPeriod: o.MinSyncPeriod,
		SyncPeriod:    o.SyncPeriod,
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				DetectLocal:        o.DetectLocal,
				MasqueradeAll:      o.MasqueradeAll,
				MasqueradeBit:      uint32(o.MasqueradeBit),
				NoMasquerade:       o.NoMasqueradeCIDRs,
				MasqueradeToNodeIP: o.MasqueradeToNodeIP,
				DefaultBalancing:   o.LoadBalancing,
				Policy: admit.Policy{
					NoExternalIPs:   !o.ExternalIPsAllowed(),
					ServedPorts:     served,
					OwnAddrs:        own,
					ClusterCIDRs:    o.ClusterCIDRs,
					ExternalIPCIDRs: o.ExternalIPCIDRs,
					Limits: admit.Limits{
						MaxFrontendsPerService:     o.MaxFrontendsPerService,
						MaxEndpointsPerServicePort: o.MaxEndpointsPerServicePort,
						MaxEndpointsPerService:     o.MaxEndpointsPerService,
						MaxSourceRangesPerService:  o.MaxSourceRangesPerService,
						MaxElements:                o.MaxTableElements,
					},
				},
			},
			NodePortAddresses:  o.NodePorts,
			LocalAddrs:         addrs,
			ServiceCIDRs:       o.ServiceCIDRs,
			FastPathInterfaces: o.FastPathInterfaces,
		},
		UDPKeepTerminatingFlows: o.UDPKeepTerminatingFlows,
	}, nil
}

func newClient(o *options.Options) (kubernetes.Interface, error) {
	rc, err := clientConfig(o)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// clientConfig is the API client configuration: --kubeconfig (or the config file's
// clientConnection.kubeconfig) and --master, else the in-cluster configuration, whose
// address is KUBERNETES_SERVICE_HOST and _PORT.
func clientConfig(o *options.Options) (*rest.Config, error) {
	if err := checkPlaceholder(o); err != nil {
		return nil, err
	}
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
	return rc, nil
}

// dryRun lists the API once and prints the rulesets that would be programmed.
func dryRun(ctx context.Context, client kubernetes.Interface, cfg controller.Config) error {
	state, err := listAPI(ctx, client, cfg.NodeName)
	if err != nil {
		return err
	}
	_, rulesets, problems, err := state.compile(cfg)
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
