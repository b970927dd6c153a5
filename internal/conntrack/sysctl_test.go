package conntrack

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/nftproxy/nftproxy/internal/config"
)

func TestConntrackMax(t *testing.T) {
	for _, tc := range []struct {
		perCore, min int32
		cpus, want   int
	}{
		{32768, 131072, 2, 131072},   // below the minimum: the minimum
		{32768, 131072, 8, 262144},   // scaled
		{32768, 131072, 64, 1 << 20}, // capped
		{0, 131072, 8, 0},            // 0: leave alone, min ignored
		{100, 0, 4, 400},
	} {
		if got := ConntrackMax(config.Conntrack{MaxPerCore: tc.perCore, Min: tc.min}, tc.cpus); got != tc.want {
			t.Errorf("perCore %d min %d cpus %d: %d, want %d", tc.perCore, tc.min, tc.cpus, got, tc.want)
		}
	}
}

// fakeSys is a /proc/sys tree in a temporary directory; its files start at 7.
func fakeSys(t *testing.T) (SysctlEnv, func(name string) int) {
	t.Helper()
	dir := t.TempDir()
	nf := filepath.Join(dir, "net", "netfilter")
	if err := os.MkdirAll(nf, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range sysctlNames {
		if err := os.WriteFile(filepath.Join(nf, n), []byte("7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hash := filepath.Join(dir, "hashsize")
	if err := os.WriteFile(hash, []byte("1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	read := func(name string) int {
		p := filepath.Join(nf, name)
		if name == "hashsize" {
			p = hash
		}
		v, err := readInt(p)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return SysctlEnv{ProcSys: dir, Hashsize: hash, NumCPU: func() int { return 4 }}, read
}

var sysctlNames = []string{"nf_conntrack_max", "nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait",
	"nf_conntrack_tcp_be_liberal", "nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"}

func TestSetSysctlsFiles(t *testing.T) {
	env, read := fakeSys(t)
	ct := config.Conntrack{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}
	if err := SetSysctls(logr.Discard(), ct, env); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"nf_conntrack_max": 131072, "nf_conntrack_tcp_timeout_established": 86400,
		"nf_conntrack_tcp_timeout_close_wait": 3600, "nf_conntrack_tcp_be_liberal": 1,
		"nf_conntrack_udp_timeout": 30, "nf_conntrack_udp_timeout_stream": 120, "hashsize": 131072 / 4}
	for n, v := range want {
		if got := read(n); got != v {
			t.Errorf("%s = %d, want %d", n, got, v)
		}
	}

	// kube-proxy's defaults (UDP timeouts 0, be-liberal false) and all zeros: the
	// kernel's values are left alone.
	env, read = fakeSys(t)
	if err := SetSysctls(logr.Discard(), config.Conntrack{}, env); err != nil {
		t.Fatal(err)
	}
	for _, n := range append(sysctlNames, "hashsize") {
		if got := read(n); got != 7 && !(n == "hashsize" && got == 1000) {
			t.Errorf("zero settings changed %s to %d", n, got)
		}
	}
	// A hash table already large enough is not shrunk.
	env, read = fakeSys(t)
	if err := os.WriteFile(env.Hashsize, []byte("1000000"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := SetSysctls(logr.Discard(), config.Conntrack{MaxPerCore: 1000}, env); err != nil {
		t.Fatal(err)
	}
	if read("nf_conntrack_max") != 4000 || read("hashsize") != 1000000 {
		t.Errorf("max %d hashsize %d", read("nf_conntrack_max"), read("hashsize"))
	}
	// nf_conntrack_max read-only (mode 0444, as the kernel shows it outside the initial
	// namespace): it and the hash size are left alone, the rest is set.
	env, read = fakeSys(t)
	if err := os.Chmod(filepath.Join(env.ProcSys, "net", "netfilter", "nf_conntrack_max"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := SetSysctls(logr.Discard(), config.Conntrack{MaxPerCore: 1000, UDPTimeout: 9 * time.Second}, env); err != nil {
		t.Fatal(err)
	}
	if read("nf_conntrack_max") != 7 || read("hashsize") != 1000 || read("nf_conntrack_udp_timeout") != 9 {
		t.Errorf("read-only max: max %d hashsize %d udp %d", read("nf_conntrack_max"), read("hashsize"), read("nf_conntrack_udp_timeout"))
	}
	// A sysctl that cannot be written is an error naming it. (A directory in its
	// place: writing fails even as root.)
	env, read = fakeSys(t)
	p := filepath.Join(env.ProcSys, "net", "netfilter", "nf_conntrack_udp_timeout")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	err := SetSysctls(logr.Discard(), config.Conntrack{TCPCloseWaitTimeout: time.Minute, UDPTimeout: time.Second}, env)
	if err == nil || !strings.Contains(err.Error(), "cannot set sysctl net/netfilter/nf_conntrack_udp_timeout to 1") {
		t.Errorf("unwritable sysctl: %v", err)
	}
	if read("nf_conntrack_tcp_timeout_close_wait") != 60 {
		t.Error("the settings before the failing one were not applied")
	}
}

// In an unprivileged container /proc/sys and /sys are mounted read-only (EROFS), as for
// manifests/' DaemonSet: nothing is written, nftproxy starts, and one line at -v=0 names
// every setting left as the node has it.
func TestSetSysctlsReadOnlyProcSys(t *testing.T) {
	env, read := fakeSys(t)
	var tried []string
	env.WriteFile = func(path string, _ []byte) error {
		tried = append(tried, filepath.Base(path))
		return &os.PathError{Op: "open", Path: path, Err: syscall.EROFS}
	}
	var logged strings.Builder
	log := funcr.New(func(prefix, args string) { logged.WriteString(args + "\n") }, funcr.Options{})
	ct := config.Conntrack{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}
	if err := SetSysctls(log, ct, env); err != nil {
		t.Fatalf("a read-only /proc/sys stopped nftproxy: %v", err)
	}
	if len(tried) != 3 {
		t.Errorf("tried to write %v, want nf_conntrack_max and the two TCP timeouts", tried)
	}
	for _, n := range sysctlNames {
		if read(n) != 7 {
			t.Errorf("%s changed to %d", n, read(n))
		}
	}
	for _, n := range []string{"nf_conntrack_max", "nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait"} {
		if !strings.Contains(logged.String(), n) || !strings.Contains(logged.String(), "read-only") {
			t.Errorf("the log does not say %s was left alone:\n%s", n, logged.String())
		}
	}
	// Any other failure still stops it.
	env.WriteFile = func(path string, _ []byte) error { return &os.PathError{Op: "open", Path: path, Err: syscall.EIO} }
	if err := SetSysctls(logr.Discard(), ct, env); err == nil {
		t.Error("an I/O error was ignored")
	}
}
