package options

import (
	"fmt"
	"strings"
	"testing"
)

// --external-ip-cidrs is parsed into ranges of both families, applies with --config
// too (the file has no such setting), and refuses garbage.
func TestExternalIPCIDRsFlag(t *testing.T) {
	o, err := parse(t, "--external-ip-cidrs=203.0.113.0/24, 2001:db8:e::1/64", "--external-ip-cidrs=198.51.100.7/32")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(o.ExternalIPCIDRs); got != "[203.0.113.0/24 2001:db8:e::/64 198.51.100.7/32]" {
		t.Errorf("ExternalIPCIDRs = %s", got)
	}
	o, err = parse(t, "--config", writeFile(t, "clusterCIDR: 10.1.0.0/16\n"), "--external-ip-cidrs=203.0.113.0/24")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(o.ExternalIPCIDRs, o.ClusterCIDRs); got != "[203.0.113.0/24] [10.1.0.0/16]" {
		t.Errorf("with --config: ExternalIPCIDRs, ClusterCIDRs = %s", got)
	}
	if o, err = parse(t); err != nil || o.ExternalIPCIDRs != nil {
		t.Errorf("default: %v, %v; want none (externalIPs anywhere)", o.ExternalIPCIDRs, err)
	}
	for _, bad := range []string{"203.0.113.0", "::ffff:10.0.0.0/104", "nonsense/8"} {
		if _, err := parse(t, "--external-ip-cidrs="+bad); err == nil || !strings.Contains(err.Error(), "--external-ip-cidrs") {
			t.Errorf("%q: err %v, want one naming --external-ip-cidrs", bad, err)
		}
	}
}
