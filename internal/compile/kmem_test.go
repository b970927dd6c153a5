package compile

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// kmemPerElement is the most kernel memory one element of ElementCost may take, in
// bytes, for the worst objects the default limits admit: --max-table-elements times it
// bounds what all Services together can make every node's kernel allocate
// (docs/security.md).
const kmemPerElement = 256

// kmemNoise is what the node's kernel memory may move by while an object is written
// for reasons of its own: go test runs other packages' kernel tests at the same time,
// and other processes allocate. A preallocating encoding is far above it (200
// affinity endpoints with sets sized for 65535 clients took 128 MiB).
const kmemNoise = 8 << 20

// kernelMemory is the node's unreclaimable slab (where nf_tables allocates its objects)
// plus vmalloc (where large hash tables go), in bytes (/proc/meminfo's SUnreclaim and
// VmallocUsed): the median of three reads, as other processes allocate too.
func kernelMemory(t *testing.T) int64 {
	t.Helper()
	var reads []int64
	for range 3 {
		f, err := os.Open("/proc/meminfo")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 2 && (fields[0] == "SUnreclaim:" || fields[0] == "VmallocUsed:") {
				kb, _ := strconv.ParseInt(fields[1], 10, 64)
				n += kb << 10
			}
		}
		f.Close()
		reads = append(reads, n)
		time.Sleep(50 * time.Millisecond)
	}
	slices.Sort(reads)
	return reads[1]
}

// kernelCost programs sps (IPv4) in a throwaway namespace and returns how much the
// node's kernel memory grew, and their ElementCost.
func kernelCost(t *testing.T, sps []model.ServicePort) (grew int64, cost int) {
	t.Helper()
	ns := testnetns.New(t)
	for i := range sps {
		cost += ElementCost(&sps[i])
	}
	cfg := testConfig()
	cfg.Limits = admit.DefaultLimits()
	rs, problems := Compile(snapshot(sps...), cfg, NewSlots())
	if len(problems) > 0 {
		t.Fatalf("the default limits refuse the object: %v", problems)
	}
	a := kernel.New(kernel.WithNetNS(ns.FD))
	before := kernelMemory(t)
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	grew = kernelMemory(t) - before
	if err := a.Delete(rs.Family, rs.Table); err != nil {
		t.Fatal(err)
	}
	return grew, cost
}

// affinityService is one port with ClientIP affinity and n endpoints.
func affinityService(n int) []model.ServicePort {
	return []model.ServicePort{{
		Name: spn("sticky", "p", tcp), ClusterIPs: ips("10.96.7.7"), Port: 80,
		AffinityTimeout: 10800, Endpoints: manyEndpoints(n),
	}}
}

// rangesService is a load balancer with ports ports, each admitting the same n source
// ranges: single addresses two apart, so that none merges with another.
func rangesService(ports, n int) []model.ServicePort {
	ranges := make([]netip.Prefix, n)
	for i := range ranges {
		ranges[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64 + byte(i>>15), byte(i >> 7), byte(i << 1)}), 32)
	}
	var out []model.ServicePort
	for p := range ports {
		out = append(out, model.ServicePort{
			Name: spn("fenced", fmt.Sprintf("p%02d", p), tcp), ClusterIPs: ips("10.96.7.8"), Port: uint16(8000 + p),
			LoadBalancerIPs: ips("198.51.100.77"), SourceRanges: ranges, Endpoints: eps(8080, "10.244.7.8"),
		})
	}
	return out
}

// TestKernelMemory programs, with real kernel objects in throwaway namespaces, the worst
// objects the default limits admit for ClientIP affinity (one port with the most
// endpoints) and for loadBalancerSourceRanges (the most ranges, on ten ports), and
// checks that the node's kernel memory grows by at most kmemPerElement bytes per element
// of their ElementCost: what the table budget charges is what the kernel spends. Each
// is first probed at a fiftieth of its size, so that an encoding that preallocates
// (a hash table sized for 65535 clients per endpoint took 1-2 MiB each) fails before
// it could take gigabytes from the machine.
//
//	NFTPROXY_KERNEL_TESTS=1 go test ./internal/compile -run TestKernelMemory -v
func TestKernelMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("programs hundreds of thousands of kernel objects")
	}
	for _, tc := range []struct {
		name  string
		build func(scale int) []model.ServicePort
	}{
		{"ClientIP affinity, one port with the most endpoints", func(scale int) []model.ServicePort {
			return affinityService(admit.DefaultMaxEndpointsPerServicePort / scale)
		}},
		{"for reference: one port with the most endpoints, without affinity", func(scale int) []model.ServicePort {
			sps := affinityService(admit.DefaultMaxEndpointsPerServicePort / scale)
			sps[0].AffinityTimeout = 0
			return sps
		}},
		{"Maglev, 100 ports of 10 endpoints", func(scale int) []model.ServicePort {
			var out []model.ServicePort
			for p := range 100 / scale {
				out = append(out, model.ServicePort{
					Name: spn("hashed", fmt.Sprintf("p%02d", p), tcp), ClusterIPs: ips("10.96.7.9"), Port: uint16(8000 + p),
					Balancing: model.BalancingMaglev, Endpoints: manyEndpoints(10),
				})
			}
			return out
		}},
		{"source ranges, the most ranges on ten ports", func(scale int) []model.ServicePort {
			return rangesService(10, admit.DefaultMaxSourceRangesPerService/scale)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, scale := range []int{50, 1} {
				// the least growth of three writes: other processes on the node
				// allocate too, never less
				grew, cost := kernelCost(t, tc.build(scale))
				for range 2 {
					if g, _ := kernelCost(t, tc.build(scale)); g < grew {
						grew = g
					}
				}
				per := float64(grew) / float64(cost)
				t.Logf("1/%d of the object: ElementCost %d, kernel memory +%.1f MiB, %.0f bytes per element", scale, cost, float64(grew)/(1<<20), per)
				if limit := int64(cost) * kmemPerElement; grew > limit+kmemNoise {
					t.Fatalf("1/%d of the object took %.1f MiB of kernel memory, more than %d bytes per element of its cost (%.1f MiB) and %d MiB of noise",
						scale, float64(grew)/(1<<20), kmemPerElement, float64(limit)/(1<<20), kmemNoise>>20)
				}
			}
		})
	}
}
