package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// churn writes ChurnRate endpoint changes per second for ChurnFor. Each write removes
// one endpoint of a service or adds it back (trigger-time annotation set at write
// time); once a second the write moves a probe service to another pod instead, and its
// answers are watched for that pod.
func (s *suite) churn(ctx context.Context, p Proxy, proc *cluster.Process, n int) (*Churn, error) {
	// Probe services, changed in turn once a second each: a probe's next change comes
	// len(probes) seconds later, so a slow proxy's late answer is still seen.
	probes := []int{extraBase + 1000, extraBase + 1001, extraBase + 1002, extraBase + 1003}
	alt := s.alt
	for _, pi := range probes {
		if err := s.a.createSlice(ctx, pi, []netip.Addr{alt[0].IP}); err != nil {
			return nil, err
		}
		if err := s.a.createService(ctx, pi); err != nil {
			return nil, err
		}
		defer func() { _ = s.a.deleteService(context.WithoutCancel(ctx), pi) }()
	}
	for _, pi := range probes {
		if _, err := s.pool.waitAnswer(ctx, s.a.addr(pi), func(pod string) bool { return pod == alt[0].Name }, 20*time.Millisecond, 200*time.Millisecond, 2*time.Minute); err != nil {
			return nil, fmt.Errorf("probe service: %w", err)
		}
	}
	probeState := make([]int, len(probes))
	s.settle(ctx, time.Now())
	before, err := s.scrape(ctx)
	if err != nil {
		return nil, err
	}
	cpu0, err := cpuSeconds(proc.PID())
	if err != nil {
		return nil, err
	}
	ch := &Churn{Rate: s.o.ChurnRate}
	t0 := time.Now()
	total := int(s.o.ChurnFor.Seconds() * float64(s.o.ChurnRate))
	writes := make(chan func(), 256)
	var wmu sync.Mutex
	var wwg sync.WaitGroup
	for range 16 {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for w := range writes {
				w()
			}
		}()
	}
	var pwg sync.WaitGroup
	var packet []float64
	stride := 7919 // a prime: consecutive writes hit services far apart
	rotation := map[int]int{}
	tick := time.NewTicker(time.Second / time.Duration(s.o.ChurnRate))
	for k := 0; k < total; k++ {
		<-tick.C
		if ctx.Err() != nil {
			break
		}
		if k%s.o.ChurnRate == 0 {
			j := (k / s.o.ChurnRate) % len(probes)
			probe := probes[j]
			probeState[j] ^= 1
			want := alt[probeState[j]]
			writes <- func() {
				w0 := time.Now()
				err := s.a.setEndpoints(ctx, probe, []netip.Addr{want.IP})
				wmu.Lock()
				if err != nil {
					ch.WriteErrors++
					wmu.Unlock()
					return
				}
				ch.Written++
				wmu.Unlock()
				pwg.Add(1)
				go func() {
					defer pwg.Done()
					seen, err := s.pool.waitAnswer(ctx, s.a.addr(probe), func(pod string) bool { return pod == want.Name }, 5*time.Millisecond, 100*time.Millisecond, time.Duration(len(probes))*time.Second)
					wmu.Lock()
					defer wmu.Unlock()
					if err != nil {
						ch.PacketFailed++
						return
					}
					packet = append(packet, ms(seen.Sub(w0)))
				}()
			}
			continue
		}
		i := (k * stride) % n
		rotation[i]++
		eps := s.a.endpoints(i, s.eps)
		if rotation[i]%2 == 1 {
			eps = eps[:len(eps)-1] // one endpoint removed; the next change of i adds it back
		}
		writes <- func() {
			err := s.a.setEndpoints(ctx, i, eps)
			wmu.Lock()
			if err != nil {
				ch.WriteErrors++
			} else {
				ch.Written++
			}
			wmu.Unlock()
		}
	}
	tick.Stop()
	close(writes)
	wwg.Wait()
	ch.Seconds = time.Since(t0).Seconds()
	pwg.Wait()
	s.settle(ctx, time.Now())
	cpu1, err := cpuSeconds(proc.PID())
	if err != nil {
		return nil, err
	}
	window := time.Since(t0).Seconds()
	ch.CPUSeconds = cpu1 - cpu0
	ch.CPUPercent = 100 * ch.CPUSeconds / window
	hwm, rss, err := memKB(proc.PID())
	if err != nil {
		return nil, err
	}
	ch.PeakRSSMiB, ch.RSSMiB = float64(hwm)/1024, float64(rss)/1024
	after, err := s.scrape(ctx)
	if err != nil {
		return nil, err
	}
	h := after.histogram("kubeproxy_network_programming_duration_seconds").sub(before.histogram("kubeproxy_network_programming_duration_seconds"))
	ch.ProgCount = h.Count
	ch.ProgP50, ch.ProgP99 = nanToZero(h.quantile(0.5)), nanToZero(h.quantile(0.99))
	hs := after.histogram("kubeproxy_sync_proxy_rules_duration_seconds").sub(before.histogram("kubeproxy_sync_proxy_rules_duration_seconds"))
	ch.SyncsInWindow = hs.Count
	ch.SyncP50Seconds = nanToZero(hs.quantile(0.5))
	ch.PacketSamples = len(packet)
	if len(packet) > 0 {
		ch.PacketP50, ch.PacketP99 = pct(packet, 0.5), pct(packet, 0.99)
	}
	// restore every churned service's endpoints, so the next proxy starts from the same state
	var idx []int
	for i, r := range rotation {
		if r != 0 {
			idx = append(idx, i)
		}
	}
	if err := parallel(ctx, 0, len(idx), 16, func(ctx context.Context, j int) error {
		return retry(ctx, func() error { return s.a.setEndpoints(ctx, idx[j], s.a.endpoints(idx[j], s.eps)) })
	}); err != nil {
		return ch, fmt.Errorf("restore after churn: %w", err)
	}
	s.settle(ctx, time.Now())
	s.logf("bench: %s N=%d churn: %d writes in %.1fs, programming p50 %.2fs p99 %.2fs (%v obs), packets p50 %.0f ms p99 %.0f ms (%d, %d failed), cpu %.1fs (%.0f%%), peak rss %.0f MiB",
		p.Name, n, ch.Written, ch.Seconds, ch.ProgP50, ch.ProgP99, ch.ProgCount, ch.PacketP50, ch.PacketP99, ch.PacketSamples, ch.PacketFailed, ch.CPUSeconds, ch.CPUPercent, ch.PeakRSSMiB)
	return ch, nil
}

func nanToZero(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return f
}

// dataPath runs the load client against a one-endpoint service's ClusterIP and against
// the endpoint's pod IP.
func (s *suite) dataPath(ctx context.Context) (*DataPath, error) {
	idx := extraBase + 2000
	ep := s.pods[0]
	if err := s.a.createSlice(ctx, idx, []netip.Addr{ep.IP}); err != nil {
		return nil, err
	}
	if err := s.a.createService(ctx, idx); err != nil {
		return nil, err
	}
	defer func() {
		_ = s.a.deleteService(context.WithoutCancel(ctx), idx)
		s.settle(ctx, time.Now())
	}()
	if _, err := s.pool.waitAnswer(ctx, s.a.addr(idx), func(string) bool { return true }, 20*time.Millisecond, 200*time.Millisecond, 2*time.Minute); err != nil {
		return nil, err
	}
	s.settle(ctx, time.Now())
	dp := &DataPath{}
	var err error
	if dp.ClusterIP, err = s.load(ctx, s.a.addr(idx)); err != nil {
		return nil, err
	}
	if dp.PodIP, err = s.load(ctx, netip.AddrPortFrom(ep.IP, targetPort).String()); err != nil {
		return nil, err
	}
	s.logf("bench: data path: ClusterIP %.0f conn/s (p50 %.3f ms, p99 %.3f ms), pod IP %.0f conn/s (p50 %.3f ms, p99 %.3f ms)",
		dp.ClusterIP.PerSecond, dp.ClusterIP.P50Millis, dp.ClusterIP.P99Millis, dp.PodIP.PerSecond, dp.PodIP.P50Millis, dp.PodIP.P99Millis)
	return dp, nil
}

func (s *suite) load(ctx context.Context, addr string) (Load, error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.DataPathFor+30*time.Second)
	defer cancel()
	out, err := s.c.Exec(ctx, s.client.NS, s.loadBin, "--addr", addr, "--duration", s.o.DataPathFor.String(),
		"--concurrency", strconv.Itoa(s.o.DataPathConc), "--timeout", "1s")
	if err != nil {
		return Load{}, fmt.Errorf("loadclient %s: %v: %s", addr, err, truncate(string(out), 500))
	}
	var l Load
	if err := jsonUnmarshalLast(out, &l); err != nil {
		return Load{}, fmt.Errorf("loadclient output %q: %w", truncate(string(out), 300), err)
	}
	return l, nil
}
