package conntrack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/cpuset"

	"github.com/nftproxy/nftproxy/internal/config"
)

// MaxLimit caps nf_conntrack_max computed from the per-core setting, as kube-proxy
// does, so that a machine with many cores does not reserve excessive memory.
const MaxLimit = 1 << 20

// SysctlEnv is where SetSysctls reads and writes; the zero value is the real system.
// Tests point it into a network namespace and a temporary hashsize file.
type SysctlEnv struct {
	ProcSys  string     // default /proc/sys
	Hashsize string     // default /sys/module/nf_conntrack/parameters/hashsize
	NumCPU   func() int // default: the node's online CPUs
	// WriteFile writes a sysctl or module parameter; default os.WriteFile.
	WriteFile func(path string, data []byte) error
}

func (e SysctlEnv) withDefaults() SysctlEnv {
	if e.ProcSys == "" {
		e.ProcSys = "/proc/sys"
	}
	if e.Hashsize == "" {
		e.Hashsize = "/sys/module/nf_conntrack/parameters/hashsize"
	}
	if e.NumCPU == nil {
		e.NumCPU = NumCPU
	}
	if e.WriteFile == nil {
		e.WriteFile = func(path string, data []byte) error { return os.WriteFile(path, data, 0o640) }
	}
	return e
}

// NumCPU counts the node's online CPUs (not the process's cpuset: nf_conntrack_max
// is for the whole node), falling back to the Go runtime's count.
func NumCPU() int {
	if n, err := cpuset.NumCPU(); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// ConntrackMax is the nf_conntrack_max kube-proxy sets for ct on a node with cpus
// CPUs: MaxPerCore × cpus, at least Min, at most MaxLimit; 0 (leave it alone) when
// MaxPerCore is 0.
func ConntrackMax(ct config.Conntrack, cpus int) int {
	if ct.MaxPerCore <= 0 {
		return 0
	}
	scaled := int(ct.MaxPerCore) * cpus
	if scaled > MaxLimit {
		return MaxLimit
	}
	return max(scaled, int(ct.Min))
}

// SetSysctls sets the conntrack sysctls as kube-proxy does at startup: nf_conntrack_max
// (and the conntrack hash table size when it is below a quarter of that), the TCP
// established and close-wait timeouts, nf_conntrack_tcp_be_liberal when TCPBeLiberal,
// and the UDP timeouts; a setting of 0 (false) leaves the kernel's value alone. A value
// already in place is not written. The first failure stops it, as kube-proxy's does:
// an operator who asked for a setting must not run without it unknowingly. Two
// exceptions, each logged at -v=0 with what is left alone: a network namespace other
// than the node's, where the kernel makes the node-wide nf_conntrack_max read-only (see
// nodeWideReadOnly), and a /proc/sys (or /sys) mounted read-only, as in every
// unprivileged container — manifests/ runs nftproxy so, and the node's values then stay
// as the node has them (kube-proxy's DaemonSet is privileged instead).
func SetSysctls(log logr.Logger, ct config.Conntrack, env SysctlEnv) error {
	env = env.withDefaults()
	var readOnly []string
	// set writes one setting; a read-only file system is noted, not an error
	set := func(err error, name string) error {
		if errors.Is(err, syscall.EROFS) {
			readOnly = append(readOnly, name)
			return nil
		}
		return err
	}
	if m := ConntrackMax(ct, env.NumCPU()); m > 0 && !nodeWideReadOnly(log, env, m) {
		log.Info("Setting nf_conntrack_max", "nfConntrackMax", m)
		err := setSysctl(log, env, "nf_conntrack_max", m)
		if err == nil {
			err = set(growHashsize(log, env, m/4), "hashsize")
		}
		if err := set(err, "nf_conntrack_max"); err != nil {
			return fmt.Errorf("%w (--conntrack-max-per-core=0 leaves it alone)", err)
		}
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{"nf_conntrack_tcp_timeout_established", ct.TCPEstablishedTimeout},
		{"nf_conntrack_tcp_timeout_close_wait", ct.TCPCloseWaitTimeout},
		{"nf_conntrack_udp_timeout", ct.UDPTimeout},
		{"nf_conntrack_udp_timeout_stream", ct.UDPStreamTimeout},
	} {
		if s.d <= 0 {
			continue
		}
		if err := set(setSysctl(log, env, s.name, int(s.d/time.Second)), s.name); err != nil {
			return err
		}
	}
	if ct.TCPBeLiberal {
		if err := set(setSysctl(log, env, "nf_conntrack_tcp_be_liberal", 1), "nf_conntrack_tcp_be_liberal"); err != nil {
			return err
		}
	}
	if len(readOnly) > 0 {
		log.Info("Conntrack settings left as the node has them: /proc/sys is read-only here (an unprivileged container); set them on the node, or run nftproxy privileged, or set conntrack.* to 0 to silence this",
			"notSet", readOnly)
	}
	return nil
}

// nodeWideReadOnly reports whether the kernel shows nf_conntrack_max read-only (mode
// 0444): it does so in every network namespace but the initial one, where the limit and
// the hash size, which are node-wide, cannot be changed. kube-proxy fails there; nftproxy
// leaves both alone with a log line, so that it also runs outside the node's namespace
// (its own tests do). A /proc/sys mounted read-only is not this case: that is an error.
func nodeWideReadOnly(log logr.Logger, env SysctlEnv, want int) bool {
	path := filepath.Join(env.ProcSys, "net", "netfilter", "nf_conntrack_max")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o222 != 0 {
		return false
	}
	cur, _ := readInt(path)
	if cur != want {
		log.Info("Not the node's network namespace: nf_conntrack_max is read-only here and left alone", "nfConntrackMax", cur, "wanted", want)
	}
	return true
}

// setSysctl writes net/netfilter/name unless it already holds value.
func setSysctl(log logr.Logger, env SysctlEnv, name string, value int) error {
	path := filepath.Join(env.ProcSys, "net", "netfilter", name)
	if cur, err := readInt(path); err == nil && cur == value {
		return nil
	}
	log.Info("Setting sysctl", "entry", "net/netfilter/"+name, "value", value)
	if err := env.WriteFile(path, []byte(strconv.Itoa(value))); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("cannot set sysctl net/netfilter/%s to %d: %w (read-only: outside the host's network namespace, or /proc/sys mounted read-only)", name, value, err)
		}
		return fmt.Errorf("cannot set sysctl net/netfilter/%s to %d: %w", name, value, err)
	}
	return nil
}

// growHashsize raises the conntrack hash table size to want if it is smaller.
func growHashsize(log logr.Logger, env SysctlEnv, want int) error {
	path := env.Hashsize
	cur, err := readInt(path)
	if err != nil {
		return fmt.Errorf("reading the conntrack hash size: %w", err)
	}
	if cur >= want {
		return nil
	}
	log.Info("Setting conntrack hashsize", "conntrackHashsize", want)
	if err := env.WriteFile(path, []byte(strconv.Itoa(want))); err != nil {
		return fmt.Errorf("cannot set the conntrack hash size to %d: %w", want, err)
	}
	return nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
