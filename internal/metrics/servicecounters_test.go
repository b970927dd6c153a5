package metrics

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nftproxy/nftproxy/nft/kernel"
)

func TestServiceCounters(t *testing.T) {
	c := NewServiceCounters(func() ([]kernel.Count, []kernel.Count, error) {
		return []kernel.Count{
			{Comment: "default/web:http", Packets: 3, Bytes: 300}, // cluster IP
			{Comment: "default/web:http", Packets: 2, Bytes: 100}, // node port: summed
			{Comment: "kube-system/dns", Packets: 7, Bytes: 700},  // unnamed port
			{Comment: "garbage", Packets: 99, Bytes: 99},          // ignored
		}, []kernel.Count{{Packets: 4}, {Packets: 1}}, nil
	}, logr.Discard())
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	want := `
# HELP nftproxy_no_endpoint_rejects_total Packets rejected because their service had no endpoints.
# TYPE nftproxy_no_endpoint_rejects_total counter
nftproxy_no_endpoint_rejects_total 5
# HELP nftproxy_service_packets_total Packets sent to the service's addresses and node ports, counted by the kernel.
# TYPE nftproxy_service_packets_total counter
nftproxy_service_packets_total{namespace="default",port="http",service="web"} 5
nftproxy_service_packets_total{namespace="kube-system",port="",service="dns"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "nftproxy_service_packets_total", "nftproxy_no_endpoint_rejects_total"); err != nil {
		t.Fatal(err)
	}
}
