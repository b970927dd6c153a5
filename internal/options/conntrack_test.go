package options

import (
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/config"
)

// The --conntrack-* flags take effect (no longer "no effect"), with kube-proxy's
// defaults; with --config the file's conntrack.* replaces them (as kube-proxy).
func TestConntrackFlagsAndFile(t *testing.T) {
	o, err := parse(t, "--conntrack-max-per-core=0", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Conntrack{MaxPerCore: 0, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
		TCPBeLiberal: true, UDPTimeout: 30 * time.Second}
	if o.Conntrack != want {
		t.Errorf("flags: %+v, want %+v", o.Conntrack, want)
	}
	if len(o.Ignored()) != 0 || strings.Contains(strings.Join(o.Notes(), "\n"), "conntrack") {
		t.Errorf("conntrack flags reported as without effect: %q %q", o.Ignored(), o.Notes())
	}
	path := writeFile(t, "conntrack: {maxPerCore: 1000, min: 5, tcpEstablishedTimeout: 0s, udpStreamTimeout: 2m, tcpBeLiberal: true}\n")
	o, err = parse(t, "--config", path, "--conntrack-min=7", "--conntrack-tcp-be-liberal=false")
	if err != nil {
		t.Fatal(err)
	}
	want = config.Conntrack{MaxPerCore: 1000, Min: 5, TCPEstablishedTimeout: 0, TCPCloseWaitTimeout: time.Hour,
		TCPBeLiberal: true, UDPStreamTimeout: 2 * time.Minute}
	if o.Conntrack != want {
		t.Errorf("file and flags: %+v, want %+v (the file's)", o.Conntrack, want)
	}
	if notes := strings.Join(o.Notes(), "\n"); !strings.Contains(notes, "--conntrack-min is ignored") || !strings.Contains(notes, "--conntrack-tcp-be-liberal is ignored") {
		t.Errorf("conntrack flags given with --config not reported: %s", notes)
	}
	if got := config.ConntrackFrom(o.EffectiveConfig()); got != want {
		t.Errorf("--write-config-to would write %+v", got)
	}
	if _, err := parse(t, "--conntrack-udp-timeout=-1s"); err == nil || !strings.Contains(err.Error(), "--conntrack-udp-timeout: -1s must be greater than or equal to 0") {
		t.Errorf("negative timeout: %v", err)
	}
	if _, err := parse(t, "--conntrack-min=-1"); err == nil || !strings.Contains(err.Error(), "--conntrack-min") {
		t.Errorf("negative min: %v", err)
	}
}

// --healthz-port and --metrics-port as kube-proxy: 0 disables the server, another
// port completes a bare-IP bind address, an address with a port keeps it; with
// --config they have no effect.
func TestDeprecatedPortFlags(t *testing.T) {
	for _, tc := range []struct {
		args             []string
		healthz, metrics string
	}{
		{nil, "0.0.0.0:10256", "127.0.0.1:10249"},
		{[]string{"--healthz-port=0"}, "", "127.0.0.1:10249"},
		{[]string{"--metrics-port=0"}, "0.0.0.0:10256", ""},
		{[]string{"--healthz-port=0", "--healthz-bind-address=10.0.0.1"}, "", "127.0.0.1:10249"},
		{[]string{"--healthz-port=12345", "--healthz-bind-address=10.0.0.1"}, "10.0.0.1:12345", "127.0.0.1:10249"},
		{[]string{"--healthz-port=12345"}, "0.0.0.0:10256", "127.0.0.1:10249"}, // the address has a port
		{[]string{"--metrics-port=9999", "--metrics-bind-address=::1"}, "0.0.0.0:10256", "[::1]:9999"},
	} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if o.HealthzBindAddress != tc.healthz || o.MetricsBindAddress != tc.metrics {
			t.Errorf("%q: healthz %q metrics %q, want %q %q", tc.args, o.HealthzBindAddress, o.MetricsBindAddress, tc.healthz, tc.metrics)
		}
		ports, _, _ := o.ServedPorts()
		if tc.healthz == "" && len(ports) != 1 {
			t.Errorf("%q: served ports %v with the health server disabled", tc.args, ports)
		}
	}
	path := writeFile(t, "healthzBindAddress: 0.0.0.0:10256\n")
	o, err := parse(t, "--config", path, "--healthz-port=0")
	if err != nil {
		t.Fatal(err)
	}
	if o.HealthzBindAddress != "0.0.0.0:10256" || !strings.Contains(strings.Join(o.Notes(), "\n"), "--healthz-port has no effect with --config") {
		t.Errorf("with --config: %q, notes %q", o.HealthzBindAddress, o.Notes())
	}
	if _, err := parse(t, "--healthz-port=70000"); err == nil {
		t.Error("--healthz-port=70000 accepted")
	}
}
