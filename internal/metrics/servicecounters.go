package metrics

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nftproxy/nftproxy/internal/model"
)

// ServicePortCount is the packet and byte count of one service port: what the
// kernel counted for its addresses and node port.
type ServicePortCount struct {
	Port    model.ServicePortName
	Packets uint64
	Bytes   uint64
}

// CounterSource reads the kernel's per-service-port counters and the packets rejected
// for want of endpoints. One call is one read of the kernel; ServiceCounters makes at
// most one per interval, however many scrapes come.
type CounterSource func() (ports []ServicePortCount, rejects uint64, err error)

// readCostFactor bounds the CPU that reading the counters may take whatever the
// scrape rate: after a read that took d, the next one waits at least readCostFactor×d,
// so reads take at most 1/(readCostFactor+1) of a core (at 20,000 service ports a read
// takes about 0.15 s, and serves scrapes for 3 s).
const readCostFactor = 20

// ServiceCounters exposes the kernel's per-service packet and byte counters (read from
// nftproxy's counter sets: no per-packet work in userspace). A read costs CPU in
// proportion to the number of service ports, and scrapers are not to be trusted with
// it: the kernel is read at most once per interval — the configured minimum, or 20
// times as long as the last read took, whichever is longer — and scrapes within it get
// the values of the last read; concurrent scrapes wait for the one read in progress
// instead of starting their own.
//
// It is a prometheus.Gatherer of its own, not a Collector on a registry: a registry
// makes every series a const metric, rebuilds its label pairs, hashes them to check
// for duplicates and sorts the family, on every scrape — 60,000 series at 30,000
// service ports, for series whose labels only change when a service port comes or
// goes. Here each service port's label pairs are made once, when a read first finds
// it, and shared by every scrape until a read no longer finds it; a scrape only makes
// the samples' values, in the order the registry would sort them in. At 30,000 service
// ports the pairs hold about 2 MB more between scrapes than the sums alone.
type ServiceCounters struct {
	read     CounterSource
	interval time.Duration
	now      func() time.Time
	log      logr.Logger

	mu       sync.Mutex
	last     *counterSample
	inflight chan struct{} // closed when the read in progress ends; nil if none

	// prev are the ports of the last successful read, whose label pairs the next read
	// takes over: only the goroutine that reads the kernel (one at a time) uses it.
	prev []portSum
}

// counterSample is one read of the kernel. It keeps the sums and each port's label
// pairs, not metrics: a sample lives until the next read, and 60,000 const metrics
// (two per service port at 30k) held 40 MB between scrapes; Gather makes the metrics
// per scrape.
type counterSample struct {
	until    time.Time // it serves scrapes until then
	failed   bool      // the read failed: only the error gauge
	ports    []portSum // sorted as the registry sorts them
	rejected uint64
}

// portSum is one service port's counts (summed over the ports the labels cannot tell
// apart) and its label pairs: namespace, port, service (sorted by name, as the
// registry sorts them). The pairs are shared with other samples and scrapes: never
// modified.
type portSum struct {
	labels         [3]*dto.LabelPair
	packets, bytes uint64
}

// compare orders p by k as the registry orders series: by namespace, port, service.
func (p *portSum) compare(k portKey) int {
	return cmp.Or(strings.Compare(p.labels[0].GetValue(), k.ns),
		strings.Compare(p.labels[1].GetValue(), k.port),
		strings.Compare(p.labels[2].GetValue(), k.name))
}

type portKey struct{ ns, name, port string }

// The families, in the order of their names.
var (
	nameReadErrors = "nftproxy_counter_read_errors"
	nameRejects    = "nftproxy_no_endpoint_rejects_total"
	nameBytes      = "nftproxy_service_bytes_total"
	namePackets    = "nftproxy_service_packets_total"
	helpReadErrors = "1 when the last read of the kernel counters failed."
	helpRejects    = "Packets rejected because their service had no endpoints."
	helpBytes      = "Bytes sent to the service's addresses and node ports, counted by the kernel."
	helpPackets    = "Packets sent to the service's addresses and node ports, counted by the kernel."
	typeCounter    = dto.MetricType_COUNTER
	typeGauge      = dto.MetricType_GAUGE
	labelNamespace = "namespace"
	labelPort      = "port"
	labelService   = "service"
)

var _ prometheus.Gatherer = (*ServiceCounters)(nil)

// NewServiceCounters returns a gatherer over read that reads the kernel at most once
// per interval (see ServiceCounters; 0: only the bound by the read's own cost).
func NewServiceCounters(read CounterSource, interval time.Duration, log logr.Logger) *ServiceCounters {
	return &ServiceCounters{read: read, interval: interval, now: time.Now, log: log}
}

// Gather implements prometheus.Gatherer: the families of the last read (reading the
// kernel if it is too old), sorted by name, their series by label values.
func (c *ServiceCounters) Gather() ([]*dto.MetricFamily, error) {
	s := c.sample()
	readErr := 0.0
	if s.failed {
		readErr = 1
	}
	errFam := &dto.MetricFamily{Name: &nameReadErrors, Help: &helpReadErrors, Type: &typeGauge,
		Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: &readErr}}}}
	if s.failed {
		return []*dto.MetricFamily{errFam}, nil
	}
	rejected := float64(s.rejected)
	fams := []*dto.MetricFamily{
		errFam,
		{Name: &nameRejects, Help: &helpRejects, Type: &typeCounter, Metric: []*dto.Metric{{Counter: &dto.Counter{Value: &rejected}}}},
	}
	n := len(s.ports)
	if n == 0 {
		return fams, nil // as a registry: no family without series
	}
	// one allocation of each kind for all 2n series (not four per series)
	metrics := make([]dto.Metric, 2*n)
	counters := make([]dto.Counter, 2*n)
	values := make([]float64, 2*n)
	ptrs := make([]*dto.Metric, 2*n)
	for i := range s.ports {
		p := &s.ports[i]
		for j, v := range [2]uint64{p.bytes, p.packets} {
			k := j*n + i
			values[k] = float64(v)
			counters[k].Value = &values[k]
			metrics[k].Label = p.labels[:] // in the sample, which outlives the scrape
			metrics[k].Counter = &counters[k]
			ptrs[k] = &metrics[k]
		}
	}
	return append(fams,
		&dto.MetricFamily{Name: &nameBytes, Help: &helpBytes, Type: &typeCounter, Metric: ptrs[:n:n]},
		&dto.MetricFamily{Name: &namePackets, Help: &helpPackets, Type: &typeCounter, Metric: ptrs[n:]},
	), nil
}

// sample returns the last read if it is recent enough, else waits for the read in
// progress or makes one.
func (c *ServiceCounters) sample() *counterSample {
	c.mu.Lock()
	if s := c.last; s != nil && c.now().Before(s.until) {
		c.mu.Unlock()
		return s
	}
	if wait := c.inflight; wait != nil {
		c.mu.Unlock()
		<-wait
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.last
	}
	done := make(chan struct{})
	c.inflight = done
	c.mu.Unlock()

	s := c.readKernel()
	c.mu.Lock()
	c.last, c.inflight = s, nil
	close(done)
	c.mu.Unlock()
	return s
}

// readKernel reads the counters once and sums them: one series per
// service port (the labels cannot tell two ports apart only if the API let a Service
// have two ports of one name, when they are summed). Only one runs at a time.
func (c *ServiceCounters) readKernel() *counterSample {
	s := &counterSample{}
	start := c.now()
	defer func() {
		end := c.now()
		s.until = end.Add(max(c.interval, readCostFactor*end.Sub(start)))
	}()
	ports, rejected, err := c.read()
	if err != nil {
		c.log.V(2).Info("Reading kernel counters failed", "err", err.Error())
		s.failed = true
		return s // the labels stay for the next read
	}
	type sum struct {
		portKey
		packets, bytes uint64
	}
	at := make(map[portKey]int, len(ports)) // index in sums
	sums := make([]sum, 0, len(ports))
	for _, p := range ports {
		k := portKey{p.Port.Namespace, p.Port.Name, p.Port.Port}
		i, seen := at[k]
		if !seen {
			i = len(sums)
			at[k] = i
			sums = append(sums, sum{portKey: k})
		}
		sums[i].packets += p.Packets
		sums[i].bytes += p.Bytes
	}
	// in the order the registry sorts a family's series in (by label value, labels by
	// name: namespace, port, service), as the exposition formats expect them; the last
	// read's ports are in it too
	slices.SortFunc(sums, func(a, b sum) int {
		return cmp.Or(strings.Compare(a.ns, b.ns), strings.Compare(a.port, b.port), strings.Compare(a.name, b.name))
	})
	// the label pairs: the last read's where it had the port (found walking both in
	// order), new ones (sharing the namespace's and port name's pair) for ports it did
	// not have; those of ports gone go with the last read
	shared := map[[2]string]*dto.LabelPair{} // by {name, value}: one namespace or port pair each
	pair := func(name *string, value string) *dto.LabelPair {
		k := [2]string{*name, value}
		lp := shared[k]
		if lp == nil {
			lp = &dto.LabelPair{Name: name, Value: &value}
			shared[k] = lp
		}
		return lp
	}
	s.ports = make([]portSum, len(sums))
	prev := c.prev
	for i, sm := range sums {
		for len(prev) > 0 && prev[0].compare(sm.portKey) < 0 {
			prev = prev[1:]
		}
		ps := &s.ports[i]
		ps.packets, ps.bytes = sm.packets, sm.bytes
		if len(prev) > 0 && prev[0].compare(sm.portKey) == 0 {
			ps.labels = prev[0].labels
			// new ports share these namespace and port pairs too
			shared[[2]string{labelNamespace, sm.ns}] = ps.labels[0]
			shared[[2]string{labelPort, sm.port}] = ps.labels[1]
		} else {
			service := sm.name
			ps.labels = [3]*dto.LabelPair{pair(&labelNamespace, sm.ns), pair(&labelPort, sm.port), {Name: &labelService, Value: &service}}
		}
	}
	c.prev = s.ports
	s.rejected = rejected
	return s
}
