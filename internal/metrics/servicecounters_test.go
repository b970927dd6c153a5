package metrics

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/nftproxy/nftproxy/internal/model"
)

func port(ns, name, p string, proto uint8) model.ServicePortName {
	return model.ServicePortName{Namespace: ns, Name: name, Port: p, Protocol: proto}
}

// Series are keyed by service port, not by the element comment, which the kernel
// cuts at 128 bytes: two ports of a Service whose namespace and name take the whole
// 128 bytes used to be one series (their comments were both "ns/name:").
func TestServiceCounters(t *testing.T) {
	long63 := func(c string) string { return strings.Repeat(c, 63) }
	ns, name := long63("n"), long63("s")
	c := NewServiceCounters(func() ([]ServicePortCount, uint64, error) {
		return []ServicePortCount{
			{Port: port("default", "web", "http", model.ProtoTCP), Packets: 3, Bytes: 300}, // cluster IP
			{Port: port("default", "web", "http", model.ProtoTCP), Packets: 2, Bytes: 100}, // IPv6: summed
			{Port: port("kube-system", "dns", "", model.ProtoUDP), Packets: 7, Bytes: 700}, // unnamed port
			{Port: port(ns, name, "metrics-port-one", model.ProtoTCP), Packets: 1, Bytes: 10},
			{Port: port(ns, name, "metrics-port-two", model.ProtoTCP), Packets: 4, Bytes: 40},
		}, 5, nil
	}, 0, logr.Discard())
	if cut := ns + "/" + name + ":"; len(cut) != 128 {
		t.Fatalf("test names are %d bytes, want 128", len(cut))
	}
	want := `
# HELP nftproxy_no_endpoint_rejects_total Packets rejected because their service had no endpoints.
# TYPE nftproxy_no_endpoint_rejects_total counter
nftproxy_no_endpoint_rejects_total 5
# HELP nftproxy_service_packets_total Packets sent to the service's addresses and node ports, counted by the kernel.
# TYPE nftproxy_service_packets_total counter
nftproxy_service_packets_total{namespace="default",port="http",service="web"} 5
nftproxy_service_packets_total{namespace="kube-system",port="",service="dns"} 7
nftproxy_service_packets_total{namespace="` + ns + `",port="metrics-port-one",service="` + name + `"} 1
nftproxy_service_packets_total{namespace="` + ns + `",port="metrics-port-two",service="` + name + `"} 4
`
	if err := testutil.GatherAndCompare(c, strings.NewReader(want), "nftproxy_service_packets_total", "nftproxy_no_endpoint_rejects_total"); err != nil {
		t.Fatal(err)
	}
}

// 16 concurrent scrapes of /metrics/services cause one read of the kernel, and so do further
// scrapes within the interval; the next one after it reads again.
func TestServiceCountersOneReadPerInterval(t *testing.T) {
	var reads atomic.Int32
	var packets atomic.Uint64
	source := func() ([]ServicePortCount, uint64, error) {
		reads.Add(1)
		time.Sleep(200 * time.Millisecond) // a large table: the scrapes overlap
		return []ServicePortCount{{Port: port("default", "web", "http", model.ProtoTCP), Packets: packets.Load()}}, 0, nil
	}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	sc := NewServiceCounters(source, 10*time.Second, logr.Discard())
	sc.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := promhttp.HandlerFor(sc, promhttp.HandlerOpts{})
	get := func() string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics/services", nil))
		return rec.Body.String()
	}

	packets.Store(7)
	var wg sync.WaitGroup
	bodies := make([]string, 16)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies[i] = get()
		}()
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Fatalf("16 concurrent scrapes read the kernel %d times, want 1", n)
	}
	for i, b := range bodies {
		if !strings.Contains(b, `nftproxy_service_packets_total{namespace="default",port="http",service="web"} 7`) {
			t.Fatalf("scrape %d got:\n%s", i, b)
		}
	}
	packets.Store(9)
	mu.Lock()
	now = now.Add(9 * time.Second)
	mu.Unlock()
	if b := get(); reads.Load() != 1 || !strings.Contains(b, "} 7") {
		t.Fatalf("a scrape within the interval read the kernel again (%d reads) or changed values:\n%s", reads.Load(), b)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if b := get(); reads.Load() != 2 || !strings.Contains(b, "} 9") {
		t.Fatalf("a scrape after the interval: %d reads, want 2; got:\n%s", reads.Load(), b)
	}
}

// A failed read says so, and is not retried by every scrape either.
func TestServiceCountersReadError(t *testing.T) {
	reads := 0
	c := NewServiceCounters(func() ([]ServicePortCount, uint64, error) {
		reads++
		return nil, 0, errors.New("netlink: permission denied")
	}, time.Minute, logr.Discard())
	for range 3 {
		if err := testutil.GatherAndCompare(c, strings.NewReader(`
# HELP nftproxy_counter_read_errors 1 when the last read of the kernel counters failed.
# TYPE nftproxy_counter_read_errors gauge
nftproxy_counter_read_errors 1
`), "nftproxy_counter_read_errors", "nftproxy_service_packets_total"); err != nil {
			t.Fatal(err)
		}
	}
	if reads != 1 {
		t.Errorf("%d reads for 3 scrapes within the interval, want 1", reads)
	}
}

// /metrics has no per-service series and never reads the kernel, however often it is
// scraped; ServicesHandler (/metrics/services) has them, and only it reads. Fails if
// the counters are registered on /metrics again.
func TestServiceCountersOnlyOnServicesHandler(t *testing.T) {
	reads := 0
	source := func() ([]ServicePortCount, uint64, error) {
		reads++
		return []ServicePortCount{{Port: port("default", "web", "http", model.ProtoTCP), Packets: 3, Bytes: 30}}, 2, nil
	}
	p := New(Options{ServiceCounters: source, NoRuntimeMetrics: true})
	p.ServicePorts(1)
	for range 3 {
		body := scrape(t, p.Handler())
		for _, name := range []string{"nftproxy_service_packets_total", "nftproxy_service_bytes_total", "nftproxy_no_endpoint_rejects_total", "nftproxy_counter_read_errors"} {
			if strings.Contains(body, name) {
				t.Fatalf("/metrics has %s:\n%s", name, body)
			}
		}
		expect(t, body, "nftproxy_service_ports 1") // nftproxy's own small ones stay
	}
	if reads != 0 {
		t.Fatalf("3 scrapes of /metrics read the kernel's counters %d times, want 0", reads)
	}
	if p.ServicesHandler() == nil {
		t.Fatal("no ServicesHandler with the counters on")
	}
	body := scrape(t, p.ServicesHandler())
	expect(t, body,
		`nftproxy_service_packets_total{namespace="default",port="http",service="web"} 3`,
		`nftproxy_service_bytes_total{namespace="default",port="http",service="web"} 30`,
		`nftproxy_no_endpoint_rejects_total 2`,
		`nftproxy_counter_read_errors 0`)
	if reads != 1 {
		t.Fatalf("a scrape of /metrics/services: %d reads, want 1", reads)
	}
	if strings.Contains(body, "kubeproxy_") || strings.Contains(body, "nftproxy_service_ports") {
		t.Errorf("/metrics/services has more than the per-service counters:\n%s", body)
	}
}

// The operator's switch: no per-service series anywhere, no ServicesHandler, and the
// kernel is never read.
func TestServiceCountersSwitchedOff(t *testing.T) {
	reads := 0
	source := func() ([]ServicePortCount, uint64, error) {
		reads++
		return []ServicePortCount{{Port: port("default", "web", "http", model.ProtoTCP), Packets: 1}}, 1, nil
	}
	on := New(Options{ServiceCounters: source, NoRuntimeMetrics: true})
	if body := scrape(t, on.ServicesHandler()); !strings.Contains(body, "nftproxy_service_packets_total") || reads != 1 {
		t.Fatalf("counters on: %d reads, body:\n%s", reads, body)
	}
	off := New(Options{ServiceCounters: source, NoServiceCounters: true, NoRuntimeMetrics: true})
	if h := off.ServicesHandler(); h != nil {
		t.Fatalf("counters off, yet a ServicesHandler: %v", h)
	}
	body := scrape(t, off.Handler())
	if strings.Contains(body, "nftproxy_service_packets_total") || strings.Contains(body, "nftproxy_service_bytes_total") || strings.Contains(body, "nftproxy_no_endpoint_rejects_total") || reads != 1 {
		t.Fatalf("counters off: %d reads, body:\n%s", reads, body)
	}
	if New(Options{NoRuntimeMetrics: true}).ServicesHandler() != nil {
		t.Fatal("a ServicesHandler without a counter source")
	}
}

// Without a configured interval, a read serves scrapes for 20 times as long as it
// took: a scraper hammering /metrics/services gets the kernel read at most 1/21 of the time.
func TestServiceCountersCostBound(t *testing.T) {
	now := time.Unix(1000, 0)
	reads := 0
	c := NewServiceCounters(func() ([]ServicePortCount, uint64, error) {
		reads++
		now = now.Add(100 * time.Millisecond) // the read takes 100 ms
		return nil, 0, nil
	}, 0, logr.Discard())
	c.now = func() time.Time { return now }
	gather := func() {
		if _, err := c.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	gather()
	for range 19 { // 1.9 s of scrapes every 100 ms
		now = now.Add(100 * time.Millisecond)
		gather()
	}
	if reads != 1 {
		t.Fatalf("%d reads within 2 s of a 100 ms read, want 1", reads)
	}
	now = now.Add(200 * time.Millisecond)
	gather()
	if reads != 2 {
		t.Fatalf("%d reads 2.1 s after a 100 ms read, want 2", reads)
	}
}

// BenchmarkServiceCountersScrape is one scrape of the per-service counters at 30,000
// service ports, from a sample already read (the kernel read is BenchmarkCounterRead
// in nft/kernel): gathering and text encoding of 60,000 series, into a
// ResponseRecorder (whose growing body buffer is about 20 MB of the bytes allocated).
func BenchmarkServiceCountersScrape(b *testing.B) {
	h := scrapeBenchHandler()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code)
		}
	}
}

// BenchmarkServiceCountersScrapeStreamed is the same scrape written to a connection
// that keeps nothing, as a server's: what the proxy itself allocates.
func BenchmarkServiceCountersScrapeStreamed(b *testing.B) {
	h := scrapeBenchHandler()
	w := &discardWriter{header: http.Header{}}
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	for b.Loop() {
		clear(w.header)
		h.ServeHTTP(w, req)
	}
}

type discardWriter struct{ header http.Header }

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

func scrapeBenchHandler() http.Handler {
	const n = 30000
	ports := make([]ServicePortCount, n)
	for i := range ports {
		// the kernel's order: by element, not by name
		k := (i * 7919) % n
		ports[i] = ServicePortCount{Port: port(fmt.Sprintf("ns-%d", k%50), fmt.Sprintf("svc-%06d", k), "http", model.ProtoTCP), Packets: uint64(i), Bytes: uint64(100 * i)}
	}
	c := NewServiceCounters(func() ([]ServicePortCount, uint64, error) { return ports, 0, nil }, time.Hour, logr.Discard())
	return promhttp.HandlerFor(c, promhttp.HandlerOpts{})
}

// reference is what a registry serves for these counts, as the collector of const
// metrics nftproxy had before ServiceCounters gathered itself: the expected output.
type reference struct {
	ports    []ServicePortCount
	rejected uint64
}

func (r reference) Describe(chan<- *prometheus.Desc) {} // unchecked

func (r reference) Collect(ch chan<- prometheus.Metric) {
	labels := []string{"namespace", "service", "port"}
	packets := prometheus.NewDesc("nftproxy_service_packets_total", "Packets sent to the service's addresses and node ports, counted by the kernel.", labels, nil)
	bytes := prometheus.NewDesc("nftproxy_service_bytes_total", "Bytes sent to the service's addresses and node ports, counted by the kernel.", labels, nil)
	type sums struct{ packets, bytes uint64 }
	m := map[[3]string]*sums{}
	for _, p := range r.ports {
		k := [3]string{p.Port.Namespace, p.Port.Name, p.Port.Port}
		if m[k] == nil {
			m[k] = &sums{}
		}
		m[k].packets += p.Packets
		m[k].bytes += p.Bytes
	}
	for k, s := range m {
		ch <- prometheus.MustNewConstMetric(packets, prometheus.CounterValue, float64(s.packets), k[0], k[1], k[2])
		ch <- prometheus.MustNewConstMetric(bytes, prometheus.CounterValue, float64(s.bytes), k[0], k[1], k[2])
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("nftproxy_no_endpoint_rejects_total", "Packets rejected because their service had no endpoints.", nil, nil), prometheus.CounterValue, float64(r.rejected))
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("nftproxy_counter_read_errors", "1 when the last read of the kernel counters failed.", nil, nil), prometheus.GaugeValue, 0)
}

// body is what h answers with this Accept header.
func body(t *testing.T, h http.Handler, accept string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics/services", nil)
	req.Header.Set("Accept", accept)
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	return rec.Header().Get("Content-Type") + "\n" + rec.Body.String()
}

var accepts = []string{"text/plain", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "text/plain;version=1.0.0;escaping=allow-utf-8"}

// Services come and go between reads, in the kernel's order, with ports summed over
// families and names needing escapes: every read, each format's answer is byte for byte
// what a registry of const metrics answers for the same counts; a port's label pairs
// are made once and kept while reads find it.
func TestServiceCountersComeAndGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	odd := []string{"default", "kube-system", `quo"te`, `back\slash`, "new\nline", "ünïcode", ""}
	var current []ServicePortCount
	var rejected uint64
	now := time.Unix(1000, 0)
	c := NewServiceCounters(func() ([]ServicePortCount, uint64, error) { return current, rejected, nil }, time.Second, logr.Discard())
	c.now = func() time.Time { return now }
	h := promhttp.HandlerFor(c, promhttp.HandlerOpts{})
	var kept map[portKey]*dto.LabelPair
	for round := range 8 {
		current = nil
		for range rng.IntN(300) {
			p := port(odd[rng.IntN(len(odd))], fmt.Sprintf("svc-%d", rng.IntN(60)), odd[rng.IntN(len(odd))]+"p", model.ProtoTCP)
			current = append(current, ServicePortCount{Port: p, Packets: rng.Uint64N(1 << 40), Bytes: rng.Uint64N(1 << 50)})
		}
		rejected = uint64(round)
		now = now.Add(2 * time.Second) // a new read
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(reference{current, rejected})
		want := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
		for _, accept := range accepts {
			if got, want := body(t, h, accept), body(t, want, accept); got != want {
				t.Fatalf("round %d, Accept %s:\ngot\n%s\nwant\n%s", round, accept, got, want)
			}
		}
		// the label pairs: the same as the last read's for ports both have
		for i := range c.prev {
			p := &c.prev[i]
			if old, ok := kept[keyOf(p)]; ok && old != p.labels[2] {
				t.Fatalf("round %d: the label pairs of %v were made again", round, keyOf(p))
			}
		}
		kept = map[portKey]*dto.LabelPair{}
		for i := range c.prev {
			kept[keyOf(&c.prev[i])] = c.prev[i].labels[2]
		}
	}
}

// Scrapes encoding the label pairs of one read while another read replaces the ports
// (run with -race): no race, and every scrape answers.
func TestServiceCountersConcurrentChurn(t *testing.T) {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(3, 4))
	c := NewServiceCounters(func() ([]ServicePortCount, uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		ports := make([]ServicePortCount, rng.IntN(200))
		for i := range ports {
			ports[i] = ServicePortCount{Port: port(fmt.Sprintf("ns-%d", rng.IntN(5)), fmt.Sprintf("svc-%d", rng.IntN(100)), "http", model.ProtoTCP), Packets: 1}
		}
		return ports, 0, nil
	}, 0, logr.Discard()) // a read serves for 20 times its few microseconds: most scrapes read
	h := promhttp.HandlerFor(c, promhttp.HandlerOpts{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics/services", nil))
				if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "nftproxy_counter_read_errors 0") {
					t.Errorf("scrape: %d\n%s", rec.Code, rec.Body)
					return
				}
				if _, err := c.Gather(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func keyOf(p *portSum) portKey {
	return portKey{ns: p.labels[0].GetValue(), port: p.labels[1].GetValue(), name: p.labels[2].GetValue()}
}
