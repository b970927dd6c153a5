// Package options defines nftproxy's command line: kube-proxy's flag names with
// kube-proxy's meanings, so that a kube-proxy DaemonSet's arguments work unchanged. Flags
// of kube-proxy that have no meaning here are accepted and reported. --config reads
// kube-proxy's configuration file (see internal/config) and, as in kube-proxy, replaces
// the flags of the settings it holds (except logging flags and --hostname-override).
//
// Values that have a typed form (CIDRs, --nodeport-addresses, --detect-local-mode) are
// parsed once, by Complete, into Options' typed fields; everything after uses those.
package options

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/model"
)

// Options holds the parsed command line.
type Options struct {
	Kubeconfig         string
	Master             string
	HostnameOverride   string
	ClusterCIDR        string
	ServiceCIDR        string
	NodePortAddresses  []string
	MasqueradeAll      bool
	MasqueradeBit      int32
	MinSyncPeriod      time.Duration
	SyncPeriod         time.Duration
	HealthzBindAddress string
	MetricsBindAddress string
	Cleanup            bool
	DryRun             bool
	Verbosity          int
	LoggingFormat      string
	VModule            logsapi.VModuleConfiguration // --vmodule: -v per source file (text format)
	KubeAPIQPS         float32
	KubeAPIBurst       int32
	KubeAPIContentType string
	DetectLocalMode    string
	// BridgeInterface and InterfaceNamePrefix: --pod-bridge-interface and
	// --pod-interface-name-prefix, for --detect-local-mode BridgeInterface and
	// InterfaceNamePrefix.
	BridgeInterface     string
	InterfaceNamePrefix string
	ConfigFile          string
	WriteConfigTo       string
	// FeatureGates: --feature-gates (or the file's featureGates); only
	// AllowServiceExternalIPs has an effect.
	FeatureGates map[string]bool
	// Limits on what one Service, and the whole table, may cost every node (nftproxy
	// only; 0: no limit).
	MaxFrontendsPerService     int
	MaxEndpointsPerServicePort int
	MaxEndpointsPerService     int
	MaxSourceRangesPerService  int
	MaxTableElements           int
	// ExternalIPCIDRsFlag: --external-ip-cidrs, the only ranges Service externalIPs
	// are programmed in (nftproxy only; empty: anywhere).
	ExternalIPCIDRsFlag []string
	// NoMasqueradeCIDRsFlag: --no-masquerade-cidrs, destinations whose traffic keeps
	// its source address (nftproxy only; empty: kube-proxy's masquerading).
	NoMasqueradeCIDRsFlag []string
	// UDPKeepTerminatingFlows: --udp-keep-terminating-flows (nftproxy only).
	UDPKeepTerminatingFlows bool
	// MasqueradeToNodeIP: --masquerade-to-node-ip (nftproxy only).
	MasqueradeToNodeIP bool
	// FastPathInterfaces: --fast-path-interfaces, names or globs of the interfaces of
	// the fast path for established flows (nftproxy only; empty: off).
	FastPathInterfaces []string
	// LoadBalancingFlag: --load-balancing, "random" or "maglev" (nftproxy only).
	LoadBalancingFlag string
	// LoadBalancing: --load-balancing, parsed.
	LoadBalancing model.Balancing
	// ServiceCounters: export per-service counters (nftproxy only);
	// ServiceCountersMinInterval is the least time one kernel read of them serves.
	ServiceCounters            bool
	ServiceCountersMinInterval time.Duration
	// Profiling: --profiling, Go's profiles on the metrics server (/debug/pprof/).
	Profiling bool
	// Conntrack: the --conntrack-* flags (or the file's conntrack.*), kube-proxy's
	// sysctls.
	Conntrack config.Conntrack

	// The typed values, parsed once by Complete from the flags or the --config file.
	ClusterCIDRs []netip.Prefix // --cluster-cidr (clusterCIDR)
	ServiceCIDRs []netip.Prefix // --service-cluster-ip-range
	// ExternalIPCIDRs: --external-ip-cidrs
	ExternalIPCIDRs []netip.Prefix
	// NoMasqueradeCIDRs: --no-masquerade-cidrs
	NoMasqueradeCIDRs []netip.Prefix
	NodePorts         config.NodePortAddresses // --nodeport-addresses (nodePortAddresses)
	DetectLocal       compile.DetectLocal      // --detect-local-mode and its inputs

	healthzPort, metricsPort int32 // kube-proxy's deprecated --healthz-port, --metrics-port
	iptablesMasqueradeBit    int32 // --iptables-masquerade-bit: no effect (kube-proxy's nftables mode)

	ignored []string     // kube-proxy flags that were set but have no effect
	file    *config.File // the --config file, once Complete has loaded it
	notes   []string     // things to log once at startup
}

// NewFlagSet returns the flag set and the Options it fills.
func NewFlagSet() (*pflag.FlagSet, *Options) {
	o := &Options{MasqueradeBit: 14} // nftables.masqueradeBit's default; only --config sets it
	fs := pflag.NewFlagSet("nftproxy", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.ConfigFile, "config", "", "The path to a kube-proxy configuration file (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1). As in kube-proxy, the file replaces the flags of the settings it holds; only -v, --vmodule, --logging-format and --hostname-override given on the command line win over it.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", "", "If set, write the effective configuration (defaults, --config file and flags) to this file and exit.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to kubeconfig file with authorization information (the master location can be overridden by --master). In-cluster config is used when empty.")
	fs.StringVar(&o.Master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&o.HostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that nftproxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.StringVar(&o.ServiceCIDR, "service-cluster-ip-range", "", "The CIDR ranges of service cluster IPs (comma-separated, at most one per IP family), as given to kube-apiserver. Only used when the API serves no ServiceCIDR objects; new connections to unallocated addresses in them are dropped. (nftproxy only)")
	fs.StringVar(&o.ClusterCIDR, "cluster-cidr", "", "The CIDR range of the pods in the cluster (comma-separated, at most one per IP family). Traffic to a service from outside this range is masqueraded.")
	fs.StringSliceVar(&o.NodePortAddresses, "nodeport-addresses", nil, "A list of CIDR ranges and/or the keywords 'primary' (the node's primary IPs from its Node object; the default), 'localhost' (127.0.0.0/8 and ::1/128) and 'all' (0.0.0.0/0 and ::/0). NodePort connections are accepted on local IPs in these ranges; an IP family the list does not cover accepts them on all its local IPs, and loopback IPs never do (as kube-proxy's nftables mode).")
	fs.BoolVar(&o.MasqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs.")
	fs.Int32Var(&o.iptablesMasqueradeBit, "iptables-masquerade-bit", 14, "The bit of the packet mark (0-31) kube-proxy's iptables and ipvs modes mark packets to masquerade with. No effect, as in kube-proxy's nftables mode, which uses nftables.masqueradeBit of --config (default 14).")
	fs.DurationVar(&o.MinSyncPeriod, "min-sync-period", time.Second, "Bounds the time spent syncing the ruleset to the kernel: syncs may take 50ms per period on average (10 periods of idle saved up for bursts), so a sync of 50ms or longer is followed by a pause of the whole period, counted from its end as in kube-proxy, and a shorter one by that fraction of it. A change waits 10ms for others to join its sync, and never longer than one period after the previous sync ended. 0: every change is synced at once.")
	fs.DurationVar(&o.SyncPeriod, "sync-period", 30*time.Second, "An interval at which the proxy syncs even without changes (a no-op when nothing changed); the whole table is rewritten once an hour, and at once when the netlink monitor sees it altered.")
	fs.DurationVar(&o.MinSyncPeriod, "iptables-min-sync-period", time.Second, "kube-proxy's name for --min-sync-period.")
	fs.DurationVar(&o.SyncPeriod, "iptables-sync-period", 30*time.Second, "kube-proxy's name for --sync-period.")
	fs.DurationVar(&o.MinSyncPeriod, "nftables-min-sync-period", time.Second, "Same as --min-sync-period.")
	fs.DurationVar(&o.SyncPeriod, "nftables-sync-period", 30*time.Second, "Same as --sync-period.")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", "0.0.0.0:10256", "The IP address and port for the health check server (/healthz, /livez) to serve on; a bare IP gets port 10256. Set empty to disable.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:10249", "The IP address and port for the metrics server (/metrics) to serve on; a bare IP gets port 10249. Set empty to disable.")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "If true cleanup nftproxy's nftables tables and exit.")
	fs.BoolVar(&o.DryRun, "dry-run", false, "Print the ruleset that would be programmed, in nft syntax, and exit.")
	fs.IntVarP(&o.Verbosity, "v", "v", 0, "Number for the log level verbosity: 2 logs one line per sync, 4 and more add client-go's details.")
	fs.StringVar(&o.LoggingFormat, "logging-format", "text", `Sets the log format: "text" (klog's) or "json" (Kubernetes' JSON), as kube-proxy's.`)
	fs.Var(logsapi.VModuleConfigurationPflag(&o.VModule), "vmodule", "Comma-separated pattern=N settings: -v=N for the source files matching the pattern (file name without .go, glob). Text format only.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", 5, "QPS to use while talking with the Kubernetes API server.")
	fs.Int32Var(&o.KubeAPIBurst, "kube-api-burst", 10, "Burst to use while talking with the Kubernetes API server.")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "Content type of requests sent to the API server.")
	fs.StringVar(&o.DetectLocalMode, "detect-local-mode", "ClusterCIDR", "Mode to use to detect local traffic (from pods): ClusterCIDR (source in --cluster-cidr), NodeCIDR (source in the Node's spec.podCIDRs), BridgeInterface (entering through --pod-bridge-interface) or InterfaceNamePrefix (entering through an interface named --pod-interface-name-prefix*). Ignored with --config, as kube-proxy.")
	fs.StringVar(&o.BridgeInterface, "pod-bridge-interface", "", "A bridge interface name. When --detect-local-mode is BridgeInterface, traffic entering through it is local.")
	fs.StringVar(&o.InterfaceNamePrefix, "pod-interface-name-prefix", "", "An interface name prefix. When --detect-local-mode is InterfaceNamePrefix, traffic entering through an interface whose name begins with it is local.")
	fs.Var(&gatesValue{o: o}, "feature-gates", "A set of key=value pairs that describe feature gates, as kube-proxy's. Only AllowServiceExternalIPs has an effect: false programs no Service externalIPs at all. Others are reported and ignored.")
	fs.IntVar(&o.MaxFrontendsPerService, "max-frontends-per-service", admit.DefaultMaxFrontendsPerService, "The most frontends (ports × cluster, external and load-balancer IPs) one Service may have; a Service with more is not programmed and gets a Warning event. 0: no limit. (nftproxy only)")
	fs.IntVar(&o.MaxEndpointsPerServicePort, "max-endpoints-per-service-port", admit.DefaultMaxEndpointsPerServicePort, "The most endpoints one port of a Service may have; a Service with a port over it is not programmed and gets a Warning event. 0: no limit. (nftproxy only)")
	fs.IntVar(&o.MaxEndpointsPerService, "max-endpoints-per-service", admit.DefaultMaxEndpointsPerService, "The most endpoints one Service may have, summed over its ports; a Service with more is not programmed and gets a Warning event. 0: no limit. (nftproxy only)")
	fs.IntVar(&o.MaxTableElements, "max-table-elements", admit.DefaultMaxElements, "The element budget of each nftables table (estimated before compiling): when all Services together would exceed it, it is shared fairly between namespaces; a namespace within its share keeps every Service, one over it loses its newest, which get a Warning event. 0: no limit. (nftproxy only)")
	fs.StringSliceVar(&o.NoMasqueradeCIDRsFlag, "no-masquerade-cidrs", nil, "Destination CIDR ranges (comma-separated, both families) whose service traffic is never masqueraded: after DNAT, a packet to an endpoint in them keeps its source address even when kube-proxy's rules would masquerade it (traffic from the node itself, from outside the cluster CIDR, to node ports and external IPs). List only ranges whose replies come back through this node, such as the pod CIDR when node-to-pod routing is symmetric; hairpin traffic is still masqueraded. Empty: kube-proxy's behaviour. Also applies with --config. (nftproxy only)")
	fs.StringVar(&o.LoadBalancingFlag, "load-balancing", "random", "How a new connection's endpoint is chosen for Services without the nftproxy.io/load-balancing annotation: random (kube-proxy's uniform choice) or maglev (consistent hashing of the client's address and port through a Maglev lookup table of at least 4,093 entries per service port and family: every node picks the same endpoint for the same client address and port, and when one of N endpoints goes only about 1/N of clients move). Services with ClientIP session affinity keep their affinity. Also applies with --config. (nftproxy only)")
	fs.BoolVar(&o.MasqueradeToNodeIP, "masquerade-to-node-ip", false, "Source-NAT the service traffic kube-proxy masquerades to the node's primary IP of its family (the Node's InternalIP, else ExternalIP) instead of the address of the interface it leaves by, so that endpoints see one address per node whatever the route; while the Node has no such address traffic is masqueraded. Hairpin traffic is masqueraded either way. Also applies with --config. (nftproxy only)")
	fs.StringSliceVar(&o.FastPathInterfaces, "fast-path-interfaces", nil, "Names or shell globs (comma-separated, such as eth0,veth*) of the node's interfaces on which established TCP and UDP flows to Services' cluster IPs take a fast path: after a flow's first packets the kernel forwards it through an nf_tables flowtable, past every later netfilter hook of every table (other tables' forward filtering, counters and logging see only those first packets). The interfaces are matched again on every sync, so pod interfaces that come and go are followed. Needs a kernel with flowtables (CONFIG_NF_FLOW_TABLE, nf_flow_table_inet); on one without, nftproxy logs it once and programs everything else. Empty: off (kube-proxy's behaviour). Also applies with --config. (nftproxy only)")
	fs.BoolVar(&o.UDPKeepTerminatingFlows, "udp-keep-terminating-flows", false, "Keep a UDP flow's conntrack entry while its endpoint terminates, serving or not, until the endpoint leaves its EndpointSlice; kube-proxy deletes it as soon as the endpoint stops serving, moving the flow to another endpoint. For stateful UDP protocols (SIP, QUIC, game sessions) on pods with a graceful shutdown. New flows never go to an endpoint that does not serve. Also applies with --config. (nftproxy only)")
	fs.StringSliceVar(&o.ExternalIPCIDRsFlag, "external-ip-cidrs", nil, "CIDR ranges (comma-separated, any number, both families) Service externalIPs must lie in to be programmed; an externalIP outside them is refused with a Warning event. Empty: externalIPs anywhere (kube-proxy's behaviour). Listing the addresses you route to the nodes for externalIPs is the secure setting. Load-balancer IPs are not affected. Also applies with --config. (nftproxy only)")
	fs.IntVar(&o.MaxSourceRangesPerService, "max-source-ranges-per-service", admit.DefaultMaxSourceRangesPerService, "The most loadBalancerSourceRanges one Service may list; a Service with more is not programmed and gets a Warning event. 0: no limit. (nftproxy only)")
	fs.BoolVar(&o.ServiceCounters, "service-counters", true, "Export per-service packet and byte counters (nftproxy_service_packets_total, _bytes_total, nftproxy_no_endpoint_rejects_total) on the metrics server's /metrics/services; /metrics never has them. false: the kernel's counter sets are never read and /metrics/services answers 404. (nftproxy only)")
	fs.DurationVar(&o.ServiceCountersMinInterval, "service-counters-min-interval", 0, "Least time one read of the kernel's per-service counters serves scrapes for; a read always serves for 20 times as long as it took. (nftproxy only)")
	fs.BoolVar(&o.Profiling, "profiling", false, "If true enables profiling via web interface on /debug/pprof handler of the metrics server (--metrics-bind-address).")
	addConntrackFlags(fs, o)
	addIgnored(fs, o)
	return fs, o
}

// kube-proxy flags that nftproxy accepts without effect: name → is boolean.
var ignoredFlags = map[string]bool{
	"proxy-mode": false, "bind-address": false,
	"bind-address-hard-fail": true, "init-only": true,
	"iptables-localhost-nodeports": true, "config-sync-period": false,
	"ipvs-exclude-cidrs": false, "ipvs-min-sync-period": false, "ipvs-scheduler": false,
	"ipvs-strict-arp": true, "ipvs-sync-period": false, "ipvs-tcp-timeout": false,
	"ipvs-tcpfin-timeout": false, "ipvs-udp-timeout": false,
	"oom-score-adj":    false,
	"proxy-port-range": false, "show-hidden-metrics-for-version": false,
	"log-flush-frequency": false, "log-json-split-stream": true, "log-json-info-buffer-size": false,
	"log-text-split-stream": true, "log-text-info-buffer-size": false,
	"udp-timeout": false, "windows-service": true,
	"hostname-override-from-node": true,
}

// IgnoredFlags lists the kube-proxy flags that are accepted without effect, sorted.
func IgnoredFlags() []string {
	out := make([]string, 0, len(ignoredFlags))
	for name := range ignoredFlags {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func addIgnored(fs *pflag.FlagSet, o *Options) {
	for name, isBool := range ignoredFlags {
		if isBool {
			v := &ignoredValue{name: name, o: o, isBool: true}
			f := fs.VarPF(v, name, "", "Accepted for compatibility with kube-proxy; has no effect.")
			f.NoOptDefVal = "true"
			f.Hidden = true
		} else {
			fs.VarPF(&ignoredValue{name: name, o: o}, name, "", "Accepted for compatibility with kube-proxy; has no effect.").Hidden = true
		}
	}
}

type ignoredValue struct {
	name   string
	o      *Options
	isBool bool
	val    string
}

func (v *ignoredValue) String() string { return v.val }
func (v *ignoredValue) Set(s string) error {
	v.val = s
	if v.name == "proxy-mode" && s == "nftables" {
		return nil // what nftproxy does
	}
	v.o.ignored = append(v.o.ignored, "--"+v.name+"="+s)
	return nil
}
func (v *ignoredValue) Type() string {
	if v.isBool {
		return "bool"
	}
	return "string"
}

// gatesValue is the --feature-gates flag.
type gatesValue struct {
	o   *Options
	val string
}

func (v *gatesValue) String() string { return v.val }
func (v *gatesValue) Type() string   { return "mapStringBool" }
func (v *gatesValue) Set(s string) error {
	gates, err := config.ParseFeatureGates(s)
	if err != nil {
		return err
	}
	if v.o.FeatureGates == nil {
		v.o.FeatureGates = map[string]bool{}
	}
	for k, b := range gates { // repeated flags add up
		v.o.FeatureGates[k] = b
	}
	v.val = s
	return nil
}

// ExternalIPsAllowed reports whether Service externalIPs are programmed: false when the
// feature gate AllowServiceExternalIPs is false, as in kube-proxy.
func (o *Options) ExternalIPsAllowed() bool { return config.ExternalIPsAllowed(o.FeatureGates) }

// ServedPorts returns the TCP ports of nftproxy's own servers (health, metrics), their
// bind addresses when specific, and whether one binds every address (0.0.0.0 or ::): no
// Service may take these ports on the node's addresses (docs/security.md, item 1).
func (o *Options) ServedPorts() (ports []uint16, addrs []netip.Addr, anyAddr bool) {
	for _, b := range []string{o.HealthzBindAddress, o.MetricsBindAddress} {
		ap, err := netip.ParseAddrPort(b)
		if err != nil {
			continue // disabled (""); anything else was refused by Validate
		}
		if !slices.Contains(ports, ap.Port()) {
			ports = append(ports, ap.Port())
		}
		a := ap.Addr().Unmap()
		if a.IsUnspecified() {
			anyAddr = true
		} else if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return ports, addrs, anyAddr
}

// Ignored returns the kube-proxy flags given that have no effect, for a warning.
func (o *Options) Ignored() []string { return o.ignored }

// Notes returns what to log once at startup: kube-proxy flags and configuration file
// settings that have no effect, and other remarks about the configuration.
func (o *Options) Notes() []string {
	var out []string
	for _, f := range o.ignored {
		out = append(out, "kube-proxy flag "+f+" has no effect in nftproxy")
	}
	return append(out, o.notes...)
}

// binding ties the flags of one setting to its value in a configuration file.
type binding struct {
	flags []string // the flag and its aliases
	apply func(o *Options, v config.Values)
	store func(o *Options, v *config.Values)
}

var bindings = []binding{
	{[]string{"kubeconfig"}, func(o *Options, v config.Values) { o.Kubeconfig = v.Kubeconfig }, func(o *Options, v *config.Values) { v.Kubeconfig = o.Kubeconfig }},
	{[]string{"kube-api-qps"}, func(o *Options, v config.Values) { o.KubeAPIQPS = v.KubeAPIQPS }, func(o *Options, v *config.Values) { v.KubeAPIQPS = o.KubeAPIQPS }},
	{[]string{"kube-api-burst"}, func(o *Options, v config.Values) { o.KubeAPIBurst = v.KubeAPIBurst }, func(o *Options, v *config.Values) { v.KubeAPIBurst = o.KubeAPIBurst }},
	{[]string{"kube-api-content-type"}, func(o *Options, v config.Values) { o.KubeAPIContentType = v.KubeAPIContentType }, func(o *Options, v *config.Values) { v.KubeAPIContentType = o.KubeAPIContentType }},
	{[]string{"hostname-override"}, func(o *Options, v config.Values) { o.HostnameOverride = v.HostnameOverride }, func(o *Options, v *config.Values) { v.HostnameOverride = o.HostnameOverride }},
	{[]string{"cluster-cidr"}, func(o *Options, v config.Values) { o.ClusterCIDR = v.ClusterCIDR }, func(o *Options, v *config.Values) { v.ClusterCIDR = o.ClusterCIDR }},
	{[]string{"nodeport-addresses"}, func(o *Options, v config.Values) { o.NodePortAddresses = slices.Clone(v.NodePortAddresses) }, func(o *Options, v *config.Values) { v.NodePortAddresses = slices.Clone(o.NodePortAddresses) }},
	{[]string{"masquerade-all"}, func(o *Options, v config.Values) { o.MasqueradeAll = v.MasqueradeAll }, func(o *Options, v *config.Values) { v.MasqueradeAll = o.MasqueradeAll }},
	{nil, func(o *Options, v config.Values) { o.MasqueradeBit = v.MasqueradeBit }, func(o *Options, v *config.Values) { v.MasqueradeBit = o.MasqueradeBit }}, // no flag: nftables.masqueradeBit
	{[]string{"iptables-masquerade-bit"}, func(o *Options, v config.Values) { o.iptablesMasqueradeBit = v.IPTablesMasqueradeBit }, func(o *Options, v *config.Values) { v.IPTablesMasqueradeBit = o.iptablesMasqueradeBit }},
	{[]string{"sync-period", "iptables-sync-period", "nftables-sync-period"}, func(o *Options, v config.Values) { o.SyncPeriod = v.SyncPeriod }, func(o *Options, v *config.Values) { v.SyncPeriod = o.SyncPeriod }},
	{[]string{"min-sync-period", "iptables-min-sync-period", "nftables-min-sync-period"}, func(o *Options, v config.Values) { o.MinSyncPeriod = v.MinSyncPeriod }, func(o *Options, v *config.Values) { v.MinSyncPeriod = o.MinSyncPeriod }},
	{[]string{"healthz-bind-address"}, func(o *Options, v config.Values) { o.HealthzBindAddress = v.HealthzBindAddress }, func(o *Options, v *config.Values) { v.HealthzBindAddress = o.HealthzBindAddress }},
	{[]string{"metrics-bind-address"}, func(o *Options, v config.Values) { o.MetricsBindAddress = v.MetricsBindAddress }, func(o *Options, v *config.Values) { v.MetricsBindAddress = o.MetricsBindAddress }},
	{[]string{"profiling"}, func(o *Options, v config.Values) { o.Profiling = v.EnableProfiling }, func(o *Options, v *config.Values) { v.EnableProfiling = o.Profiling }},
	{[]string{"detect-local-mode"}, func(o *Options, v config.Values) { o.DetectLocalMode = v.DetectLocalMode }, func(o *Options, v *config.Values) { v.DetectLocalMode = o.DetectLocalMode }},
	{[]string{"pod-bridge-interface"}, func(o *Options, v config.Values) { o.BridgeInterface = v.BridgeInterface }, func(o *Options, v *config.Values) { v.BridgeInterface = o.BridgeInterface }},
	{[]string{"pod-interface-name-prefix"}, func(o *Options, v config.Values) { o.InterfaceNamePrefix = v.InterfaceNamePrefix }, func(o *Options, v *config.Values) { v.InterfaceNamePrefix = o.InterfaceNamePrefix }},
	{[]string{"v"}, func(o *Options, v config.Values) { o.Verbosity = v.Verbosity }, func(o *Options, v *config.Values) { v.Verbosity = o.Verbosity }},
	{[]string{"logging-format"}, func(o *Options, v config.Values) { o.LoggingFormat = v.LoggingFormat }, func(o *Options, v *config.Values) { v.LoggingFormat = o.LoggingFormat }},
	{[]string{"feature-gates"}, func(o *Options, v config.Values) { o.FeatureGates = maps.Clone(v.FeatureGates) }, func(o *Options, v *config.Values) { v.FeatureGates = maps.Clone(o.FeatureGates) }},
}

// flagsOverFile are the flags that, given on the command line, win over --config, as
// in kube-proxy v1.37: the logging flags (copied over the file's logging section) and a
// non-empty --hostname-override. Every other setting comes from the file alone.
var flagsOverFile = map[string]bool{"v": true, "logging-format": true, "hostname-override": true}

// Complete runs after fs.Parse: it loads --config, if given, which replaces the flags of
// the settings it holds except those in flagsOverFile (each such flag given is reported
// as ignored, as kube-proxy silently ignores it), completes server addresses given as a
// bare IP with the default port, and parses the typed values once (ClusterCIDRs,
// ServiceCIDRs, NodePorts, DetectLocal): an invalid one is an error naming its flag.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	if o.HostnameOverride != "" { // processHostnameOverrideFlag upstream
		if strings.TrimSpace(o.HostnameOverride) == "" {
			return fmt.Errorf("--hostname-override: empty hostname-override is invalid")
		}
		o.HostnameOverride = strings.ToLower(strings.TrimSpace(o.HostnameOverride))
	}
	if fs.Changed("iptables-masquerade-bit") && o.ConfigFile == "" {
		o.notes = append(o.notes, "--iptables-masquerade-bit has no effect (as in kube-proxy's nftables mode): the mark bit is nftables.masqueradeBit of --config, default 14")
	}
	if o.ConfigFile != "" {
		f, err := config.Load(o.ConfigFile)
		if err != nil {
			return err
		}
		o.file = f
		if err := gateConflict(fs, o.FeatureGates, o.ConfigFile, f); err != nil {
			return err
		}
		for _, b := range bindings {
			changed := slices.ContainsFunc(b.flags, fs.Changed)
			if changed && flagsOverFile[b.flags[0]] && (b.flags[0] != "hostname-override" || o.HostnameOverride != "") { // changed: b.flags is not empty
				continue
			}
			b.apply(o, f.Values)
			for _, name := range b.flags {
				if fs.Changed(name) {
					o.notes = append(o.notes, fmt.Sprintf("--%s is ignored: with --config the file's value is used (as in kube-proxy)", name))
				}
			}
		}
		o.notes = append(o.notes, f.Notes...)
	}
	if fs.Changed("feature-gates") && o.file == nil {
		o.notes = append(o.notes, config.GateNotes("--feature-gates", o.FeatureGates)...)
	}
	if !o.ExternalIPsAllowed() {
		o.notes = append(o.notes, "feature gate AllowServiceExternalIPs=false: no Service externalIPs are programmed")
	}
	o.applyDeprecatedPorts(fs)
	o.HealthzBindAddress = config.AppendPortIfNeeded(o.HealthzBindAddress, config.HealthzPort)
	o.MetricsBindAddress = config.AppendPortIfNeeded(o.MetricsBindAddress, config.MetricsPort)
	return o.parse()
}

// securityGates are the feature gates that change what a tenant can reach, each with
// its value under a set of gates (its default where they do not name it). Given as a
// flag, each must agree with the configuration file, whose value is the one used.
var securityGates = []struct {
	name  string
	value func(gates map[string]bool) bool
}{{config.GateAllowServiceExternalIPs, config.ExternalIPsAllowed}}

// gateConflict returns an error when --feature-gates sets a security gate to another
// value than the file at path gives it (in its featureGates, or by default): with
// --config the file's value is used, and the flag would make the operator believe the
// switch is set when it is not. flagGates are the flag's gates.
func gateConflict(fs *pflag.FlagSet, flagGates map[string]bool, path string, f *config.File) error {
	if !fs.Changed("feature-gates") {
		return nil
	}
	for _, g := range securityGates {
		fv, given := flagGates[g.name]
		if file := g.value(f.Values.FeatureGates); given && fv != file {
			return fmt.Errorf("--feature-gates %s=%t contradicts --config %s, which makes it %t (the file's value is used): set the gate in the file, or drop it from the flag", g.name, fv, path, file)
		}
	}
	return nil
}

// Values returns the effective settings that a configuration file can hold.
func (o *Options) Values() config.Values {
	var v config.Values
	for _, b := range bindings {
		b.store(o, &v)
	}
	return v
}

// EffectiveConfig returns the configuration nftproxy runs with, as a
// KubeProxyConfiguration: the --config file (or kube-proxy's defaults) with the
// effective settings written over it. This is what --write-config-to writes.
func (o *Options) EffectiveConfig() *v1alpha1.KubeProxyConfiguration {
	c := config.Defaulted()
	if o.file != nil {
		c = o.file.Config.DeepCopy()
	}
	o.Values().Apply(c)
	return c
}

// NodeName returns the node's name: --hostname-override or the hostname.
func (o *Options) NodeName() (string, error) {
	if o.HostnameOverride != "" {
		return strings.ToLower(strings.TrimSpace(o.HostnameOverride)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no --hostname-override and no hostname: %w", err)
	}
	return strings.ToLower(h), nil
}

// Validate checks values that flags' types do not (Complete parsed the typed ones). A
// value that came from the --config file was checked when it was loaded, with an error
// naming its field there.
func (o *Options) Validate() error {
	if err := config.CheckMasqueradeBit(o.iptablesMasqueradeBit); err != nil {
		return fmt.Errorf("--iptables-masquerade-bit: %w", err)
	}
	if o.SyncPeriod <= 0 {
		return fmt.Errorf("--sync-period: %v must be greater than 0", o.SyncPeriod)
	}
	if o.MinSyncPeriod < 0 {
		return fmt.Errorf("--min-sync-period: %v must not be negative", o.MinSyncPeriod)
	}
	if o.MinSyncPeriod > o.SyncPeriod {
		return fmt.Errorf("--min-sync-period (%v) must not exceed --sync-period (%v)", o.MinSyncPeriod, o.SyncPeriod)
	}
	if err := config.CheckBindAddress(o.HealthzBindAddress); err != nil {
		return fmt.Errorf("--healthz-bind-address: %w", err)
	}
	if err := config.CheckBindAddress(o.MetricsBindAddress); err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	if err := config.CheckLoggingFormat(o.LoggingFormat); err != nil {
		return fmt.Errorf("--logging-format: %w", err)
	}
	if len(o.VModule) > 0 && o.LoggingFormat == "json" {
		return fmt.Errorf("--vmodule works with --logging-format=text only (as kube-proxy's)")
	}
	for flag, n := range map[string]int{"--max-frontends-per-service": o.MaxFrontendsPerService,
		"--max-endpoints-per-service-port": o.MaxEndpointsPerServicePort, "--max-endpoints-per-service": o.MaxEndpointsPerService,
		"--max-table-elements": o.MaxTableElements, "--max-source-ranges-per-service": o.MaxSourceRangesPerService} {
		if n < 0 {
			return fmt.Errorf("%s: %d must not be negative (0: no limit)", flag, n)
		}
	}
	if err := o.validateConntrack(); err != nil {
		return err
	}
	if o.Verbosity < 0 {
		return fmt.Errorf("-v: %d must not be negative", o.Verbosity)
	}
	if o.KubeAPIBurst < 0 || o.KubeAPIQPS < 0 {
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must not be negative")
	}
	return nil
}

// parse fills the typed values: from the --config file's parsed values when it gave
// them, else from the flags.
func (o *Options) parse() error {
	var err error
	if o.file != nil {
		o.ClusterCIDRs, o.NodePorts = o.file.Parsed.ClusterCIDRs, o.file.Parsed.NodePorts
	} else {
		if o.ClusterCIDRs, err = config.ParseClusterCIDRs(o.ClusterCIDR); err != nil {
			return fmt.Errorf("--cluster-cidr: %w", err)
		}
		if o.NodePorts, err = config.ParseNodePortAddresses("--nodeport-addresses", o.NodePortAddresses); err != nil {
			return err
		}
		if err := config.CheckDetectLocalMode(o.DetectLocalMode); err != nil {
			return fmt.Errorf("--detect-local-mode: %w", err)
		}
		switch o.DetectLocalMode {
		case config.LocalModeBridgeInterface:
			if err := config.CheckInterfaceName(o.BridgeInterface); err != nil {
				return fmt.Errorf("--pod-bridge-interface: %w (--detect-local-mode is BridgeInterface)", err)
			}
		case config.LocalModeInterfaceNamePrefix:
			if err := config.CheckInterfaceName(o.InterfaceNamePrefix); err != nil {
				return fmt.Errorf("--pod-interface-name-prefix: %w (--detect-local-mode is InterfaceNamePrefix)", err)
			}
		}
	}
	if o.ServiceCIDRs, err = config.ParseClusterCIDRs(o.ServiceCIDR); err != nil {
		return fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	if o.ExternalIPCIDRs, err = config.ParseCIDRs(o.ExternalIPCIDRsFlag); err != nil {
		return fmt.Errorf("--external-ip-cidrs: %w", err)
	}
	var okBalancing bool
	if o.LoadBalancing, okBalancing = model.ParseBalancing(o.LoadBalancingFlag); !okBalancing {
		return fmt.Errorf("--load-balancing: %q is neither random nor maglev", o.LoadBalancingFlag)
	}
	if o.NoMasqueradeCIDRs, err = config.ParseCIDRs(o.NoMasqueradeCIDRsFlag); err != nil {
		return fmt.Errorf("--no-masquerade-cidrs: %w", err)
	}
	for _, p := range o.FastPathInterfaces {
		if _, err := path.Match(p, ""); err != nil || p == "" || len(p) > 15 && !strings.ContainsAny(p, "*?[") {
			return fmt.Errorf("--fast-path-interfaces: %q is not an interface name (at most 15 bytes) or glob", p)
		}
	}
	o.notes = append(o.notes, o.NodePorts.Notes()...)
	o.DetectLocal = compile.DetectLocal{Mode: compile.LocalMode(o.DetectLocalMode), ClusterCIDRs: o.ClusterCIDRs}
	switch o.DetectLocal.Mode {
	case "":
		o.DetectLocal.Mode = compile.LocalClusterCIDR
	case compile.LocalBridgeInterface:
		o.DetectLocal.Interface = o.BridgeInterface
	case compile.LocalInterfaceNamePrefix:
		o.DetectLocal.Interface = o.InterfaceNamePrefix
	}
	if o.DetectLocal.Mode != compile.LocalClusterCIDR {
		o.DetectLocal.ClusterCIDRs = nil // --cluster-cidr is not used (as kube-proxy)
	}
	return nil
}
