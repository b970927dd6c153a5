package metrics

import (
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftproxy/nftproxy/nft/kernel"
)

// ServiceCounters exposes the kernel's per-service packet and byte counters (read from
// nftproxy's counter sets at scrape time: no per-packet work in userspace).
type ServiceCounters struct {
	read             func() (services, rejects []kernel.Count, err error)
	log              logr.Logger
	packets, bytes   *prometheus.Desc
	rejects, readErr *prometheus.Desc
}

// NewServiceCounters returns a collector over read, which returns the counted elements
// (their comments are "namespace/name:port" or "namespace/name") and the reject rule
// counters.
func NewServiceCounters(read func() (services, rejects []kernel.Count, err error), log logr.Logger) *ServiceCounters {
	labels := []string{"namespace", "service", "port"}
	return &ServiceCounters{
		read: read, log: log,
		packets: prometheus.NewDesc("nftproxy_service_packets_total", "Packets sent to the service's addresses and node ports, counted by the kernel.", labels, nil),
		bytes:   prometheus.NewDesc("nftproxy_service_bytes_total", "Bytes sent to the service's addresses and node ports, counted by the kernel.", labels, nil),
		rejects: prometheus.NewDesc("nftproxy_no_endpoint_rejects_total", "Packets rejected because their service had no endpoints.", nil, nil),
		readErr: prometheus.NewDesc("nftproxy_counter_read_errors", "1 when the last scrape could not read the kernel counters.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ServiceCounters) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.bytes
	ch <- c.rejects
	ch <- c.readErr
}

// Collect implements prometheus.Collector.
func (c *ServiceCounters) Collect(ch chan<- prometheus.Metric) {
	services, rejects, err := c.read()
	if err != nil {
		c.log.V(2).Info("Reading kernel counters failed", "err", err.Error())
		ch <- prometheus.MustNewConstMetric(c.readErr, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.readErr, prometheus.GaugeValue, 0)
	type key struct{ ns, name, port string }
	type sum struct{ packets, bytes uint64 }
	sums := map[key]*sum{}
	for _, s := range services {
		nsName, port, _ := strings.Cut(s.Comment, ":")
		ns, name, ok := strings.Cut(nsName, "/")
		if !ok {
			continue
		}
		k := key{ns, name, port}
		if sums[k] == nil {
			sums[k] = &sum{}
		}
		sums[k].packets += s.Packets
		sums[k].bytes += s.Bytes
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(v.packets), k.ns, k.name, k.port)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(v.bytes), k.ns, k.name, k.port)
	}
	var rejected uint64
	for _, r := range rejects {
		rejected += r.Packets
	}
	ch <- prometheus.MustNewConstMetric(c.rejects, prometheus.CounterValue, float64(rejected))
}
