package realcluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

// Process is a daemon the harness started. Its stdout and stderr go to Log.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
}

// start runs argv (already wrapped in `ip netns exec` or `nsenter`) in the background,
// appending its output to WorkDir/<name>.log. The child is killed if the test binary dies.
func (c *Cluster) start(name string, argv []string) (*Process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, fmt.Errorf("cluster %s is stopped", c.Prefix)
	}
	logPath := filepath.Join(c.WorkDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	c.logf("realcluster %s: started %s (pid %d), log %s", c.Prefix, name, cmd.Process.Pid, logPath)
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM, SIGKILL after grace, and waits.
func (p *Process) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Tail is the last n lines of the log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// run runs a short command and returns its combined output; the error carries it.
func run(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// inNetns is argv run with `ip netns exec ns` (for control-plane processes and tools,
// which do not care that it remounts /sys).
func inNetns(ns string, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}

// processTree returns pid and all its descendants (by /proc/*/stat's ppid).
func processTree(pids ...int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := ppid(pid); pp > 0 {
			children[pp] = append(children[pp], pid)
		}
	}
	var out []int
	seen := map[int]bool{}
	queue := append([]int(nil), pids...)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
		queue = append(queue, children[p]...)
	}
	return out
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...; comm may contain spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// pidsInMountNS lists the processes whose mount namespace is the one of pid holder.
func pidsInMountNS(holder int) []int {
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder))
	if err != nil {
		return nil
	}
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && got == want {
			out = append(out, pid)
		}
	}
	return out
}

// nsDial dials from inside the named network namespace (a socket created on a locked OS
// thread switched into it), so the test process reaches the API without any route in
// the root namespace.
func nsDial(nsName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			conn net.Conn
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			orig, err := netns.Get()
			if err != nil {
				ch <- result{nil, err}
				return
			}
			target, err := netns.GetFromName(nsName)
			if err != nil {
				orig.Close()
				runtime.UnlockOSThread()
				ch <- result{nil, err}
				return
			}
			defer target.Close()
			if err := netns.Set(target); err != nil {
				ch <- result{nil, err} // thread stays locked and is discarded
				return
			}
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if rerr := netns.Set(orig); rerr == nil {
				runtime.UnlockOSThread()
			} else if conn != nil {
				conn.Close()
				conn, err = nil, rerr
			}
			orig.Close()
			ch <- result{conn, err}
		}()
		r := <-ch
		return r.conn, r.err
	}
}
