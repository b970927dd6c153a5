package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// --- dialing from inside a network namespace ------------------------------------------

// nsPool dials TCP from inside one network namespace: its worker goroutines are locked
// to OS threads switched into the namespace for good (their threads are discarded when
// the pool closes), so a dial costs no setns.
type nsPool struct {
	reqs chan dialReq
	wg   sync.WaitGroup
}

type dialReq struct {
	addr    string
	timeout time.Duration
	done    chan attempt
}

// attempt is one TCP connection attempt: connect, then read the echo server's line
// ("<pod> <client addr>").
type attempt struct {
	Start time.Time
	OK    bool
	Pod   string
	Err   string
}

func newNSPool(nsName string, workers int) (*nsPool, error) {
	target, err := netns.GetFromName(nsName)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", nsName, err)
	}
	p := &nsPool{reqs: make(chan dialReq)}
	ready := make(chan error, workers)
	for range workers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			runtime.LockOSThread() // never unlocked: the thread stays in the namespace and dies with the goroutine
			if err := netns.Set(target); err != nil {
				ready <- err
				return
			}
			ready <- nil
			for r := range p.reqs {
				r.done <- dialOnce(r.addr, r.timeout)
			}
		}()
	}
	var errs []string
	for range workers {
		if err := <-ready; err != nil {
			errs = append(errs, err.Error())
		}
	}
	target.Close()
	if len(errs) > 0 {
		p.Close()
		return nil, fmt.Errorf("setns %s: %s", nsName, errs[0])
	}
	return p, nil
}

func (p *nsPool) Close() {
	close(p.reqs)
	p.wg.Wait()
}

// Dial makes one attempt (blocking until a worker is free).
func (p *nsPool) Dial(addr string, timeout time.Duration) attempt {
	done := make(chan attempt, 1)
	p.reqs <- dialReq{addr: addr, timeout: timeout, done: done}
	return <-done
}

func dialOnce(addr string, timeout time.Duration) attempt {
	a := attempt{Start: time.Now()}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		a.Err = err.Error()
		return a
	}
	defer func() {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST: no TIME_WAIT for thousands of probes
		}
		conn.Close()
	}()
	_ = conn.SetReadDeadline(a.Start.Add(timeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		a.Err = "read: " + err.Error()
		return a
	}
	a.OK = true
	a.Pod, _, _ = strings.Cut(strings.TrimSpace(line), " ")
	return a
}

// waitAnswer starts an attempt every interval (each with attemptTimeout, several in
// flight) until one is answered by a pod for which want returns true, and returns the
// start time of the earliest such attempt. It gives up at bound.
func (p *nsPool) waitAnswer(ctx context.Context, addr string, want func(pod string) bool, interval, attemptTimeout, bound time.Duration) (time.Time, error) {
	return p.waitAnswerBurst(ctx, addr, want, interval, 1, attemptTimeout, bound)
}

// waitAnswerBurst is waitAnswer with burst attempts started every interval (when the
// wanted answer comes from one of several endpoints chosen at random per connection).
func (p *nsPool) waitAnswerBurst(ctx context.Context, addr string, want func(pod string) bool, interval time.Duration, burst int, attemptTimeout, bound time.Duration) (time.Time, error) {
	burst = max(1, burst)
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	results := make(chan attempt, 1024)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var best time.Time
	var last attempt
	inflight := 0
	launch := func() {
		inflight++
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- p.Dial(addr, attemptTimeout)
		}()
	}
	launch()
	for {
		select {
		case <-ctx.Done():
			for ; inflight > 0; inflight-- {
				<-results
			}
			return time.Time{}, fmt.Errorf("no wanted answer from %s within %v (last attempt: ok=%v pod=%q err=%q)", addr, bound, last.OK, last.Pod, last.Err)
		case <-tick.C:
			for k := 0; k < burst && best.IsZero() && inflight < 64; k++ {
				launch()
			}
		case a := <-results:
			inflight--
			last = a
			if a.OK && want(a.Pod) && (best.IsZero() || a.Start.Before(best)) {
				best = a.Start
			}
			if !best.IsZero() && inflight == 0 {
				return best, nil
			}
		}
	}
}

// --- Prometheus text format -------------------------------------------------------------

// sample is one series of a scrape.
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// parseMetrics parses the Prometheus text exposition format (comments skipped).
func parseMetrics(text string) ([]sample, error) {
	var out []sample
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{Labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			s.Name = line[:i]
			j := strings.LastIndex(line, "}")
			if j < i {
				return nil, fmt.Errorf("bad metric line %q", line)
			}
			for _, kv := range splitLabels(line[i+1 : j]) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					continue
				}
				uq, err := strconv.Unquote(strings.TrimSpace(v))
				if err != nil {
					return nil, fmt.Errorf("bad label in %q: %v", line, err)
				}
				s.Labels[strings.TrimSpace(k)] = uq
			}
			rest = strings.TrimSpace(line[j+1:])
		} else {
			name, r, _ := strings.Cut(line, " ")
			s.Name, rest = name, strings.TrimSpace(r)
		}
		valStr, _, _ := strings.Cut(rest, " ") // an optional timestamp follows
		v, err := strconv.ParseFloat(valStr, 64)
		if err != nil {
			return nil, fmt.Errorf("bad value in %q: %v", line, err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, nil
}

// splitLabels splits `a="x",b="y,z"` at the commas outside quotes.
func splitLabels(s string) []string {
	var parts []string
	inQuote, esc, start := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case esc:
			esc = false
		case c == '\\':
			esc = true
		case c == '"':
			inQuote = !inQuote
		case c == ',' && !inQuote:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		parts = append(parts, s[start:])
	}
	return parts
}

// metricSet is one scrape.
type metricSet []sample

// value returns the sum of the series called name whose labels include match (the
// IPv4 series only where an ip_family label exists: the bench's services are IPv4).
func (m metricSet) value(name string) (float64, bool) {
	var sum float64
	found := false
	for _, s := range m.family(name) {
		sum += s.Value
		found = true
	}
	return sum, found
}

// family returns the series called name, restricted to ip_family="IPv4" when that label
// is present.
func (m metricSet) family(name string) []sample {
	var out []sample
	hasFamily := false
	for _, s := range m {
		if s.Name == name {
			if _, ok := s.Labels["ip_family"]; ok {
				hasFamily = true
			}
		}
	}
	for _, s := range m {
		if s.Name != name {
			continue
		}
		if hasFamily && s.Labels["ip_family"] != "IPv4" {
			continue
		}
		out = append(out, s)
	}
	return out
}

// histogram is a cumulative Prometheus histogram.
type histogram struct {
	Bounds []float64 // upper bounds, ascending, +Inf last
	Counts []float64 // cumulative
	Sum    float64
	Count  float64
}

func (m metricSet) histogram(name string) histogram {
	var h histogram
	byLE := map[float64]float64{}
	for _, s := range m.family(name + "_bucket") {
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err != nil {
			continue
		}
		byLE[le] += s.Value
	}
	for le := range byLE {
		h.Bounds = append(h.Bounds, le)
	}
	sort.Float64s(h.Bounds)
	for _, le := range h.Bounds {
		h.Counts = append(h.Counts, byLE[le])
	}
	h.Sum, _ = m.value(name + "_sum")
	h.Count, _ = m.value(name + "_count")
	return h
}

// sub returns h - before (observations made between the two scrapes).
func (h histogram) sub(before histogram) histogram {
	out := histogram{Bounds: h.Bounds, Sum: h.Sum - before.Sum, Count: h.Count - before.Count}
	prev := map[float64]float64{}
	for i, le := range before.Bounds {
		prev[le] = before.Counts[i]
	}
	for i, le := range h.Bounds {
		out.Counts = append(out.Counts, h.Counts[i]-prev[le])
	}
	return out
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile does (linear
// interpolation inside the bucket); NaN without observations.
func (h histogram) quantile(q float64) float64 {
	if len(h.Counts) == 0 {
		return math.NaN()
	}
	total := h.Counts[len(h.Counts)-1]
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	for i, c := range h.Counts {
		if c >= rank {
			if math.IsInf(h.Bounds[i], 1) {
				if i == 0 {
					return math.NaN()
				}
				return h.Bounds[i-1] // as Prometheus: the highest finite bound
			}
			lo, below := 0.0, 0.0
			if i > 0 {
				lo, below = h.Bounds[i-1], h.Counts[i-1]
			}
			inBucket := c - below
			if inBucket <= 0 {
				return h.Bounds[i]
			}
			return lo + (h.Bounds[i]-lo)*(rank-below)/inBucket
		}
	}
	return h.Bounds[len(h.Bounds)-1]
}

// --- process accounting ------------------------------------------------------------------

// Settling: the API server keeps working for seconds after the suite's last write
// returns (at 10k services after populating, both cores for over a second), and a proxy
// started then competes with it for the CPU. Before each cold start the suite waits
// until the control plane has used less than settleCPU of a core over settleWindow, at
// most settleMax. Before, nftproxy (measured first at each size) started right after
// the suite's writes, kube-proxy minutes later.
const (
	settleWindow = 500 * time.Millisecond
	settleCPU    = 0.1
	settleMax    = time.Minute
)

// controlPlaneIdle waits for the control plane to be idle (see settleWindow) and
// returns how long it waited.
func (s *suite) controlPlaneIdle(ctx context.Context) time.Duration {
	start := time.Now()
	used := func() float64 {
		total := 0.0
		for _, pid := range s.c.ControlPlanePIDs() {
			if v, err := cpuSeconds(pid); err == nil {
				total += v
			}
		}
		return total
	}
	before := used()
	for time.Since(start) < settleMax && ctx.Err() == nil {
		time.Sleep(settleWindow)
		now := used()
		if now-before < settleCPU*settleWindow.Seconds() {
			break
		}
		before = now
	}
	waited := time.Since(start)
	s.logf("bench: control plane idle after %v", waited.Round(10*time.Millisecond))
	return waited
}

// cpuSeconds returns utime+stime of pid from /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

func parseStatCPU(stat string) (float64, error) {
	// The command name (field 2) may contain spaces; fields resume after its ')'.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad stat times %q %q", f[11], f[12])
	}
	return (ut + st) / clockTicks, nil
}

// memKB returns VmHWM (peak RSS) and VmRSS of pid in KiB.
func memKB(pid int) (hwm, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStatusMem(string(b))
}

func parseStatusMem(status string) (hwm, rss int64, err error) {
	for line := range strings.SplitSeq(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, perr := strconv.ParseInt(f[0], 10, 64)
		if perr != nil {
			continue
		}
		switch k {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	if hwm == 0 {
		return 0, 0, fmt.Errorf("no VmHWM in status")
	}
	return hwm, rss, nil
}

// --- kernel footprint ---------------------------------------------------------------------

// Footprint counts the objects of a ruleset (`nft -j list ruleset`).
type Footprint struct {
	Tables      int     `json:"tables"`
	Chains      int     `json:"chains"`
	Rules       int     `json:"rules"`
	Sets        int     `json:"sets"` // sets and maps
	Elements    int     `json:"elements"`
	ListSeconds float64 `json:"list_seconds"`        // wall time of `nft list ruleset`
	ListBytes   int     `json:"list_bytes"`          // size of its output
	PerService  float64 `json:"objects_per_service"` // (chains+rules+elements) / N
}

func countRuleset(jsonText []byte) (Footprint, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(jsonText, &doc); err != nil {
		return Footprint{}, fmt.Errorf("nft -j: %w", err)
	}
	var f Footprint
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			switch kind {
			case "table":
				f.Tables++
			case "chain":
				f.Chains++
			case "rule":
				f.Rules++
			case "set", "map":
				f.Sets++
				var s struct {
					Elem []json.RawMessage `json:"elem"`
				}
				if err := json.Unmarshal(raw, &s); err != nil {
					return f, err
				}
				f.Elements += len(s.Elem)
			}
		}
	}
	return f, nil
}
