// Command loadclient opens and closes TCP connections to one address for a fixed time
// and prints one JSON object: how many connections succeeded and failed, the rate, and
// connect-latency quantiles. The bench suite runs it inside a pod's network namespace.
//
//	loadclient --addr 10.96.0.10:80 --duration 5s --concurrency 4
//
// Each connection is connect, read the server's first line (so the endpoint really
// answered), close with SO_LINGER 0 (an RST: no TIME_WAIT, so a few thousand
// connections per second do not exhaust the client's ephemeral ports).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"
)

// Result is what loadclient prints.
type Result struct {
	Addr        string  `json:"addr"`
	Seconds     float64 `json:"seconds"`
	Concurrency int     `json:"concurrency"`
	OK          int     `json:"ok"`
	Failed      int     `json:"failed"`
	PerSecond   float64 `json:"per_second"` // successful connections per second
	P50Millis   float64 `json:"p50_ms"`     // connect latency (SYN to established)
	P99Millis   float64 `json:"p99_ms"`
	MaxMillis   float64 `json:"max_ms"`
	FirstError  string  `json:"first_error,omitempty"`
}

func main() {
	addr := flag.String("addr", "", "ip:port to connect to")
	duration := flag.Duration("duration", 5*time.Second, "how long to open connections")
	concurrency := flag.Int("concurrency", 4, "parallel connection loops")
	timeout := flag.Duration("timeout", time.Second, "per-connection timeout (connect and first line)")
	flag.Parse()
	if *addr == "" || *concurrency < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "usage: loadclient --addr ip:port [--duration 5s] [--concurrency 4] [--timeout 1s]")
		os.Exit(2)
	}
	r := run(*addr, *duration, *concurrency, *timeout)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		os.Exit(1)
	}
}

func run(addr string, duration time.Duration, concurrency int, timeout time.Duration) Result {
	start := time.Now()
	end := start.Add(duration)
	var (
		mu       sync.Mutex
		lat      []time.Duration
		failed   int
		firstErr string
		wg       sync.WaitGroup
	)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			var nfail int
			var ferr string
			for time.Now().Before(end) {
				d, err := once(addr, timeout)
				if err != nil {
					nfail++
					if ferr == "" {
						ferr = err.Error()
					}
					continue
				}
				local = append(local, d)
			}
			mu.Lock()
			lat = append(lat, local...)
			failed += nfail
			if firstErr == "" {
				firstErr = ferr
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	r := Result{
		Addr: addr, Seconds: elapsed.Seconds(), Concurrency: concurrency,
		OK: len(lat), Failed: failed, FirstError: firstErr,
		PerSecond: float64(len(lat)) / elapsed.Seconds(),
	}
	if len(lat) > 0 {
		r.P50Millis = ms(quantile(lat, 0.50))
		r.P99Millis = ms(quantile(lat, 0.99))
		r.MaxMillis = ms(lat[len(lat)-1])
	}
	return r
}

// once connects, reads the server's first line and resets the connection. It returns
// the connect latency.
func once(addr string, timeout time.Duration) (time.Duration, error) {
	t0 := time.Now()
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0, err
	}
	d := time.Since(t0)
	defer func() {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		conn.Close()
	}()
	_ = conn.SetReadDeadline(t0.Add(timeout))
	if _, err := bufio.NewReaderSize(conn, 128).ReadSlice('\n'); err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	return d, nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
