package compile

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestSourceRangeDropCost measures what an off-range packet to a load-balancer IP costs
// the node: a UDP socket in a throwaway namespace sends from an address outside the
// Service's ranges to its load-balancer IP (held locally, so that the packet takes the
// output path through the source-range check and is dropped there: sendto fails with
// EPERM). The time per send is compared for one range and for 20,000, with the
// interval set and with the former encoding, one rule per range (built from the same
// compiled table). A benchmark, not a test: it asserts nothing about time.
//
//	NFTPROXY_BENCH=1 go test ./internal/compile -run TestSourceRangeDropCost -v
func TestSourceRangeDropCost(t *testing.T) {
	if os.Getenv("NFTPROXY_BENCH") != "1" {
		t.Skip("a benchmark: set NFTPROXY_BENCH=1")
	}
	const sends = 20000
	for _, n := range benchRangeCounts() {
		for _, perRule := range benchEncodings() {
			encoding := "interval set"
			if perRule {
				encoding = "one rule per range"
			}
			ns := testnetns.New(t)
			ns.MustRun(t, "", "ip", "link", "set", "lo", "up")
			ns.MustRun(t, "", "ip", "addr", "add", "203.0.113.1/32", "dev", "lo")
			ns.MustRun(t, "", "ip", "addr", "add", "198.51.100.77/32", "dev", "lo")
			sps := rangesService(1, n)
			sps[0].Name.Protocol = udp
			rs, _ := Compile(snapshot(sps...), testConfig(), NewSlots())
			if perRule {
				rs = rulePerRange(t, rs)
			}
			if _, err := kernel.New(kernel.WithNetNS(ns.FD)).Apply(rs); err != nil {
				t.Fatal(err)
			}
			var rounds []time.Duration
			for range 5 {
				d, err := timeSends(ns.FD, sends)
				if err != nil {
					t.Fatal(err)
				}
				rounds = append(rounds, d/sends)
			}
			slices.Sort(rounds)
			t.Logf("%5d ranges, %-18s: %v per dropped packet (median of 5 rounds of %d; fastest %v)", n, encoding, rounds[2], sends, rounds[0])
		}
	}
}

// rulePerRange rewrites rs's source-range chains as they were compiled before the
// interval set: one "ip saddr <range> return" rule per range, then the drop.
func rulePerRange(t *testing.T, rs *nft.Ruleset) *nft.Ruleset {
	t.Helper()
	rs = rs.Flatten()
	out := *rs
	out.Sets = nil
	sets := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		if s.Interval {
			sets[s.Name] = s
			continue
		}
		out.Sets = append(out.Sets, s)
	}
	out.Chains = nil
	for _, c := range rs.Chains {
		s := sets[c.Name]
		if s == nil {
			out.Chains = append(out.Chains, c)
			continue
		}
		cc := &nft.Chain{Name: c.Name}
		for _, e := range s.Elements {
			p, ok := nft.RangePrefix(e.Key[0].Addr(), e.Data[0].Addr())
			if !ok {
				t.Fatalf("range %s is not a prefix", nft.RenderElementKey(s, e))
			}
			cc.Rules = append(cc.Rules, nft.Rule{Stmts: []nft.Stmt{nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpEq, Prefix: p}, nft.Verdict{Kind: nft.Return}}})
		}
		cc.Rules = append(cc.Rules, c.Rules[len(c.Rules)-1]) // the drop
		out.Chains = append(out.Chains, cc)
	}
	return &out
}

// timeSends sends n UDP datagrams from 203.0.113.1 to 198.51.100.77:8000 in the
// namespace of fd, each of which must be dropped, and returns the time they took.
func timeSends(fd, n int) (time.Duration, error) {
	type result struct {
		d   time.Duration
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unix.Close(s)
		if err := unix.Bind(s, &unix.SockaddrInet4{Addr: [4]byte{203, 0, 113, 1}}); err != nil {
			done <- result{err: err}
			return
		}
		to := &unix.SockaddrInet4{Addr: [4]byte{198, 51, 100, 77}, Port: 8000}
		msg := []byte("x")
		start := time.Now()
		for range n {
			if err := unix.Sendto(s, msg, 0, to); !errors.Is(err, unix.EPERM) {
				done <- result{err: errors.New("a datagram was not dropped by the source-range check: " + errString(err))}
				return
			}
		}
		done <- result{d: time.Since(start)}
	}()
	r := <-done
	return r.d, r.err
}

func errString(err error) string {
	if err == nil {
		return "sent"
	}
	return err.Error()
}

// benchRangeCounts are the source-range counts TestSourceRangeDropCost measures:
// NFTPROXY_BENCH_RANGES (comma-separated), by default 1 and 20,000.
func benchRangeCounts() []int {
	var out []int
	for _, f := range strings.Split(os.Getenv("NFTPROXY_BENCH_RANGES"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		out = []int{1, 20000}
	}
	return out
}

// benchEncodings: both, or only the interval set with NFTPROXY_BENCH_RANGES_SET_ONLY=1.
func benchEncodings() []bool {
	if os.Getenv("NFTPROXY_BENCH_RANGES_SET_ONLY") == "1" {
		return []bool{false}
	}
	return []bool{true, false}
}
