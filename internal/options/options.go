// Package options defines nftproxy's command line: kube-proxy's flag names with
// kube-proxy's meanings, so that a kube-proxy DaemonSet's arguments work unchanged. Flags
// of kube-proxy that have no meaning here are accepted and reported.
package options

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Options holds the parsed command line.
type Options struct {
	Kubeconfig         string
	Master             string
	HostnameOverride   string
	ClusterCIDR        string
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
	KubeAPIQPS         float32
	KubeAPIBurst       int32
	KubeAPIContentType string
	DetectLocalMode    string

	ignored []string // kube-proxy flags that were set but have no effect
}

// NewFlagSet returns the flag set and the Options it fills.
func NewFlagSet() (*pflag.FlagSet, *Options) {
	o := &Options{}
	fs := pflag.NewFlagSet("nftproxy", pflag.ContinueOnError)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to kubeconfig file with authorization information (the master location can be overridden by --master). In-cluster config is used when empty.")
	fs.StringVar(&o.Master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&o.HostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that nftproxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.StringVar(&o.ClusterCIDR, "cluster-cidr", "", "The CIDR range of the pods in the cluster (comma-separated, at most one per IP family). Traffic to a service from outside this range is masqueraded.")
	fs.StringSliceVar(&o.NodePortAddresses, "nodeport-addresses", nil, "A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary'. NodePort connections are accepted on local IPs in these ranges; 'primary' (the default) means the node's primary IPs from its Node object.")
	fs.BoolVar(&o.MasqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs.")
	fs.Int32Var(&o.MasqueradeBit, "iptables-masquerade-bit", 14, "The bit of the packet mark (0-31) used to mark packets for masquerading, as kube-proxy's iptables and nftables modes.")
	fs.DurationVar(&o.MinSyncPeriod, "min-sync-period", time.Second, "The minimum period between syncs of the ruleset to the kernel; changes within it are batched.")
	fs.DurationVar(&o.SyncPeriod, "sync-period", 30*time.Second, "An interval at which the whole ruleset is rewritten even without changes, correcting drift.")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", "0.0.0.0:10256", "The IP address and port for the health check server to serve on. Set empty to disable.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:10249", "The IP address and port for the metrics server to serve on. Set empty to disable.")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "If true cleanup nftproxy's nftables tables and exit.")
	fs.BoolVar(&o.DryRun, "dry-run", false, "Print the ruleset that would be programmed, in nft syntax, and exit.")
	fs.IntVarP(&o.Verbosity, "v", "v", 0, "Number for the log level verbosity.")
	fs.StringVar(&o.LoggingFormat, "logging-format", "text", `Sets the log format: "text" or "json".`)
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", 5, "QPS to use while talking with the Kubernetes API server.")
	fs.Int32Var(&o.KubeAPIBurst, "kube-api-burst", 10, "Burst to use while talking with the Kubernetes API server.")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "Content type of requests sent to the API server.")
	fs.StringVar(&o.DetectLocalMode, "detect-local-mode", "ClusterCIDR", "Mode to use to detect local traffic. Only ClusterCIDR is supported.")
	addIgnored(fs, o)
	return fs, o
}

// kube-proxy flags that nftproxy accepts without effect: name → is boolean.
var ignoredFlags = map[string]bool{
	"proxy-mode": false, "config": false, "write-config-to": false, "bind-address": false,
	"bind-address-hard-fail": true, "feature-gates": false, "init-only": true,
	"iptables-min-sync-period": false, "iptables-sync-period": false, "iptables-localhost-nodeports": true,
	"ipvs-exclude-cidrs": false, "ipvs-min-sync-period": false, "ipvs-scheduler": false,
	"ipvs-strict-arp": true, "ipvs-sync-period": false, "ipvs-tcp-timeout": false,
	"ipvs-tcpfin-timeout": false, "ipvs-udp-timeout": false,
	"conntrack-max-per-core": false, "conntrack-min": false, "conntrack-tcp-be-liberal": true,
	"conntrack-tcp-timeout-close-wait": false, "conntrack-tcp-timeout-established": false,
	"conntrack-udp-timeout": false, "conntrack-udp-timeout-stream": false,
	"nftables-min-sync-period": false, "nftables-sync-period": false,
	"oom-score-adj": false, "pod-bridge-interface": false, "pod-interface-name-prefix": false,
	"profiling": true, "proxy-port-range": false, "show-hidden-metrics-for-version": false,
	"log-flush-frequency": false, "log-json-split-stream": true, "log-json-info-buffer-size": false,
	"log-text-split-stream": true, "log-text-info-buffer-size": false, "vmodule": false,
	"healthz-port": false, "metrics-port": false, "udp-timeout": false, "windows-service": true,
	"hostname-override-from-node": true,
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
	v.o.ignored = append(v.o.ignored, "--"+v.name+"="+s)
	return nil
}
func (v *ignoredValue) Type() string {
	if v.isBool {
		return "bool"
	}
	return "string"
}

// Ignored returns the kube-proxy flags given that have no effect, for a warning.
func (o *Options) Ignored() []string { return o.ignored }

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

// ClusterCIDRs parses --cluster-cidr: at most one CIDR per family.
func (o *Options) ClusterCIDRs() ([]netip.Prefix, error) {
	if strings.TrimSpace(o.ClusterCIDR) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	var seen4, seen6 bool
	for _, s := range strings.Split(o.ClusterCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--cluster-cidr: %q is not a CIDR", s)
		}
		if (p.Addr().Is4() && seen4) || (p.Addr().Is6() && seen6) {
			return nil, fmt.Errorf("--cluster-cidr: at most one CIDR per IP family, got %q", o.ClusterCIDR)
		}
		seen4, seen6 = seen4 || p.Addr().Is4(), seen6 || p.Addr().Is6()
		out = append(out, p.Masked())
	}
	return out, nil
}

// Validate checks values that flags' types do not.
func (o *Options) Validate() error {
	if _, err := o.ClusterCIDRs(); err != nil {
		return err
	}
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		return fmt.Errorf("--iptables-masquerade-bit: %d is not in 0..31", o.MasqueradeBit)
	}
	if o.MinSyncPeriod < 0 || o.SyncPeriod <= 0 {
		return fmt.Errorf("--min-sync-period must be >= 0 and --sync-period > 0")
	}
	if o.MinSyncPeriod > o.SyncPeriod {
		return fmt.Errorf("--min-sync-period (%v) must not exceed --sync-period (%v)", o.MinSyncPeriod, o.SyncPeriod)
	}
	for _, a := range o.NodePortAddresses {
		if a == "primary" && len(o.NodePortAddresses) == 1 {
			continue
		}
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("--nodeport-addresses: %q is not a CIDR (or the single value \"primary\")", a)
		}
	}
	if o.LoggingFormat != "text" && o.LoggingFormat != "json" {
		return fmt.Errorf("--logging-format: %q is not text or json", o.LoggingFormat)
	}
	if o.DetectLocalMode != "ClusterCIDR" && o.DetectLocalMode != "" {
		return fmt.Errorf("--detect-local-mode: only ClusterCIDR is supported, got %q", o.DetectLocalMode)
	}
	return nil
}
