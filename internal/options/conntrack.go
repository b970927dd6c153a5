package options

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/nftproxy/nftproxy/internal/config"
)

// addConntrackFlags adds kube-proxy's --conntrack-* flags, with its defaults and
// meanings (0 leaves the kernel's value alone).
func addConntrackFlags(fs *pflag.FlagSet, o *Options) {
	d := config.DefaultConntrack()
	ct := &o.Conntrack
	fs.Int32Var(&ct.MaxPerCore, "conntrack-max-per-core", d.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(&ct.Min, "conntrack-min", d.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).")
	fs.DurationVar(&ct.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", d.TCPEstablishedTimeout, "Idle timeout for established TCP connections (0 to leave as-is).")
	fs.DurationVar(&ct.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", d.TCPCloseWaitTimeout, "NAT timeout for TCP connections in the CLOSE_WAIT state (0 to leave as-is).")
	fs.BoolVar(&ct.TCPBeLiberal, "conntrack-tcp-be-liberal", d.TCPBeLiberal, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1.")
	fs.DurationVar(&ct.UDPTimeout, "conntrack-udp-timeout", d.UDPTimeout, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is).")
	fs.DurationVar(&ct.UDPStreamTimeout, "conntrack-udp-timeout-stream", d.UDPStreamTimeout, "Idle timeout for ASSURED UDP connections (0 to leave as-is).")
	fs.Int32Var(&o.healthzPort, "healthz-port", int32(config.HealthzPort), "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", int32(config.MetricsPort), "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")
}

func init() {
	bindings = append(bindings, binding{
		[]string{"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established", "conntrack-tcp-timeout-close-wait",
			"conntrack-tcp-be-liberal", "conntrack-udp-timeout", "conntrack-udp-timeout-stream"},
		func(o *Options, v config.Values) { o.Conntrack = v.Conntrack },
		func(o *Options, v *config.Values) { v.Conntrack = o.Conntrack },
	})
}

// applyDeprecatedPorts gives --healthz-port and --metrics-port kube-proxy's meaning:
// without --config (and --write-config-to), a bind address that is a bare IP gets that
// port, and port 0 disables the server. With --config kube-proxy ignores them; so does
// nftproxy, with a note.
func (o *Options) applyDeprecatedPorts(fs *pflag.FlagSet) {
	for _, p := range []struct {
		flag string
		port int32
		addr *string
	}{{"healthz-port", o.healthzPort, &o.HealthzBindAddress}, {"metrics-port", o.metricsPort, &o.MetricsBindAddress}} {
		if o.ConfigFile != "" || o.WriteConfigTo != "" {
			if fs.Changed(p.flag) {
				o.notes = append(o.notes, fmt.Sprintf("--%s has no effect with --config or --write-config-to (as in kube-proxy)", p.flag))
			}
			continue
		}
		if p.port == 0 {
			*p.addr = ""
			continue
		}
		*p.addr = config.AppendPortIfNeeded(*p.addr, int(p.port))
	}
}

// validateConntrack refuses negative conntrack settings, naming the flag.
func (o *Options) validateConntrack() error {
	flags := map[string]string{"maxPerCore": "--conntrack-max-per-core", "min": "--conntrack-min",
		"tcpEstablishedTimeout": "--conntrack-tcp-timeout-established", "tcpCloseWaitTimeout": "--conntrack-tcp-timeout-close-wait",
		"udpTimeout": "--conntrack-udp-timeout", "udpStreamTimeout": "--conntrack-udp-timeout-stream"}
	if err := o.Conntrack.Check(func(f string) string { return flags[f] }); err != nil {
		return err
	}
	if o.healthzPort < 0 || o.healthzPort > 65535 || o.metricsPort < 0 || o.metricsPort > 65535 {
		return fmt.Errorf("--healthz-port and --metrics-port must be between 0 and 65535")
	}
	return nil
}
