package config

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Conntrack are kube-proxy's conntrack settings (the file's conntrack.*, the
// --conntrack-* flags), with kube-proxy's meaning: 0 (false for TCPBeLiberal) leaves
// the kernel's value alone; MaxPerCore 0 also ignores Min.
type Conntrack struct {
	MaxPerCore            int32         // conntrack.maxPerCore
	Min                   int32         // conntrack.min
	TCPEstablishedTimeout time.Duration // conntrack.tcpEstablishedTimeout
	TCPCloseWaitTimeout   time.Duration // conntrack.tcpCloseWaitTimeout
	TCPBeLiberal          bool          // conntrack.tcpBeLiberal
	UDPTimeout            time.Duration // conntrack.udpTimeout
	UDPStreamTimeout      time.Duration // conntrack.udpStreamTimeout
}

// DefaultConntrack returns kube-proxy v1.37's defaults.
func DefaultConntrack() Conntrack {
	return ConntrackFrom(Defaulted())
}

func init() {
	for _, f := range []string{"maxPerCore", "min", "tcpEstablishedTimeout", "tcpCloseWaitTimeout",
		"tcpBeLiberal", "udpTimeout", "udpStreamTimeout"} {
		mapped["conntrack."+f] = true
	}
}

// ConntrackFrom reads the conntrack settings of a defaulted configuration.
func ConntrackFrom(c *v1alpha1.KubeProxyConfiguration) Conntrack {
	ct := Conntrack{
		TCPBeLiberal:     c.Conntrack.TCPBeLiberal,
		UDPTimeout:       c.Conntrack.UDPTimeout.Duration,
		UDPStreamTimeout: c.Conntrack.UDPStreamTimeout.Duration,
	}
	if c.Conntrack.MaxPerCore != nil {
		ct.MaxPerCore = *c.Conntrack.MaxPerCore
	}
	if c.Conntrack.Min != nil {
		ct.Min = *c.Conntrack.Min
	}
	if c.Conntrack.TCPEstablishedTimeout != nil {
		ct.TCPEstablishedTimeout = c.Conntrack.TCPEstablishedTimeout.Duration
	}
	if c.Conntrack.TCPCloseWaitTimeout != nil {
		ct.TCPCloseWaitTimeout = c.Conntrack.TCPCloseWaitTimeout.Duration
	}
	return ct
}

// ApplyTo writes ct into c.
func (ct Conntrack) ApplyTo(c *v1alpha1.KubeProxyConfiguration) {
	c.Conntrack.MaxPerCore = ptr(ct.MaxPerCore)
	c.Conntrack.Min = ptr(ct.Min)
	c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: ct.TCPEstablishedTimeout}
	c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: ct.TCPCloseWaitTimeout}
	c.Conntrack.TCPBeLiberal = ct.TCPBeLiberal
	c.Conntrack.UDPTimeout.Duration = ct.UDPTimeout
	c.Conntrack.UDPStreamTimeout.Duration = ct.UDPStreamTimeout
}

// Check refuses negative values, as kube-proxy's validation; each error names the
// setting with name(field), e.g. "conntrack.min" or "--conntrack-min".
func (ct Conntrack) Check(name func(field string) string) error {
	for _, n := range []struct {
		field string
		neg   bool
		val   any
	}{
		{"maxPerCore", ct.MaxPerCore < 0, ct.MaxPerCore},
		{"min", ct.Min < 0, ct.Min},
		{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout < 0, ct.TCPEstablishedTimeout},
		{"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout < 0, ct.TCPCloseWaitTimeout},
		{"udpTimeout", ct.UDPTimeout < 0, ct.UDPTimeout},
		{"udpStreamTimeout", ct.UDPStreamTimeout < 0, ct.UDPStreamTimeout},
	} {
		if n.neg {
			return fmt.Errorf("%s: %v must be greater than or equal to 0 (0 leaves the kernel's value alone)", name(n.field), n.val)
		}
	}
	return nil
}
