package conntrack

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/vishvananda/netns"

	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/testnetns"
)

// inNetns runs f on an OS thread that has entered ns, after checking that it did: /proc/sys/net
// is the namespace of the thread that opens it. The thread is never returned to the
// Go runtime (it ends with the goroutine), so no other code runs in ns by accident.
func inNetns(t *testing.T, ns *testnetns.NS, f func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		target := netns.NsHandle(ns.FD)
		if err := netns.Set(target); err != nil {
			errc <- err
			return
		}
		cur, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer cur.Close()
		if !cur.Equal(target) {
			t.Error("the thread is not in the test namespace; nothing written")
			errc <- nil
			return
		}
		errc <- f()
	}()
	return <-errc
}

// readInNetns reads a conntrack sysctl in ns with cat(1) in another process: a check
// independent of the thread trick above.
func readInNetns(t *testing.T, ns *testnetns.NS, name string) int {
	t.Helper()
	out := strings.TrimSpace(ns.MustRun(t, "", "cat", "/proc/sys/net/netfilter/"+name))
	v, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("%s: %q", name, out)
	}
	return v
}

// readRoot reads a conntrack sysctl of the machine's own namespace in a child process
// (read only; tests never write there).
func readRoot(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("cat", "/proc/sys/net/netfilter/"+name).Output()
	if err != nil {
		t.Fatalf("reading the root namespace's %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// The per-namespace conntrack sysctls are set in the namespace nftproxy runs in;
// settings of 0 leave them alone; nf_conntrack_max, read-only outside the initial
// namespace, is accepted when it already holds the value and is an error otherwise.
func TestSetSysctlsInNetns(t *testing.T) {
	ns := testnetns.New(t)
	// Conntrack's per-namespace sysctls exist once the module is loaded (it is, where
	// nftproxy's kernel tests run: they use conntrack(8)).
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max"); err != nil {
		if testnetns.Required() {
			t.Fatalf("nf_conntrack is not loaded: %v", err)
		}
		t.Skipf("nf_conntrack is not loaded: %v", err)
	}
	timeouts := []string{"nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait",
		"nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream", "nf_conntrack_tcp_be_liberal"}
	rootBefore := map[string]string{}
	for _, n := range append(timeouts, "nf_conntrack_max") {
		rootBefore[n] = readRoot(t, n)
	}
	before := map[string]int{}
	for _, n := range timeouts {
		before[n] = readInNetns(t, ns, n)
	}
	// The hash size is global (sysfs): the test points it at a file of its own.
	hash := filepath.Join(t.TempDir(), "hashsize")
	if err := os.WriteFile(hash, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := SysctlEnv{Hashsize: hash, NumCPU: func() int { return 2 }}

	// All zeros: nothing changes.
	if err := inNetns(t, ns, func() error { return SetSysctls(logr.Discard(), config.Conntrack{}, env) }); err != nil {
		t.Fatal(err)
	}
	for _, n := range timeouts {
		if got := readInNetns(t, ns, n); got != before[n] {
			t.Errorf("zero settings changed %s: %d → %d", n, before[n], got)
		}
	}

	// Values different from the kernel's defaults, so that a write is visible.
	ct := config.Conntrack{TCPEstablishedTimeout: 12345 * time.Second, TCPCloseWaitTimeout: 1234 * time.Second,
		TCPBeLiberal: true, UDPTimeout: 42 * time.Second, UDPStreamTimeout: 142 * time.Second}
	if err := inNetns(t, ns, func() error { return SetSysctls(logr.Discard(), ct, env) }); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"nf_conntrack_tcp_timeout_established": 12345, "nf_conntrack_tcp_timeout_close_wait": 1234,
		"nf_conntrack_udp_timeout": 42, "nf_conntrack_udp_timeout_stream": 142, "nf_conntrack_tcp_be_liberal": 1}
	for n, v := range want {
		if got := readInNetns(t, ns, n); got != v {
			t.Errorf("%s = %d in the namespace, want %d", n, got, v)
		}
	}

	// Only the established timeout set: the others keep what they have.
	if err := inNetns(t, ns, func() error {
		return SetSysctls(logr.Discard(), config.Conntrack{TCPEstablishedTimeout: 999 * time.Second}, env)
	}); err != nil {
		t.Fatal(err)
	}
	if got := readInNetns(t, ns, "nf_conntrack_tcp_timeout_established"); got != 999 {
		t.Errorf("established timeout %d, want 999", got)
	}
	if got := readInNetns(t, ns, "nf_conntrack_udp_timeout"); got != 42 {
		t.Errorf("udp timeout %d changed by a setting of 0", got)
	}

	// nf_conntrack_max: outside the initial namespace the kernel shows the node-wide
	// value read-only (mode 0444). Whatever is asked, it and the hash size are left
	// alone there, without an error (kube-proxy would fail; see nodeWideReadOnly).
	mode := strings.TrimSpace(ns.MustRun(t, "", "stat", "-c", "%a", "/proc/sys/net/netfilter/nf_conntrack_max"))
	if mode != "444" {
		// On a kernel where a child could write it, the limit may be global: never tried.
		t.Fatalf("nf_conntrack_max is mode %s in a child namespace on this kernel; this test assumes 444", mode)
	}
	cur := readInNetns(t, ns, "nf_conntrack_max")
	var logged strings.Builder
	log := funcr.New(func(prefix, args string) { logged.WriteString(args + "\n") }, funcr.Options{})
	other := config.Conntrack{MaxPerCore: int32(cur/2 + 1000), TCPCloseWaitTimeout: 77 * time.Second}
	if err := inNetns(t, ns, func() error { return SetSysctls(log, other, env) }); err != nil {
		t.Errorf("read-only nf_conntrack_max: %v", err)
	}
	if got := readInNetns(t, ns, "nf_conntrack_max"); got != cur {
		t.Errorf("nf_conntrack_max %d → %d", cur, got)
	}
	if b, _ := os.ReadFile(hash); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("hashsize written (%q) although nf_conntrack_max is not this namespace's", b)
	}
	if !strings.Contains(logged.String(), "read-only here and left alone") {
		t.Errorf("no log line about nf_conntrack_max:\n%s", logged.String())
	}
	if got := readInNetns(t, ns, "nf_conntrack_tcp_timeout_close_wait"); got != 77 {
		t.Errorf("close-wait timeout %d after the nf_conntrack_max skip, want 77", got)
	}

	// The machine's own namespace is untouched.
	for n, v := range rootBefore {
		if got := readRoot(t, n); got != v {
			t.Errorf("root namespace %s changed: %s → %s", n, v, got)
		}
	}
}
