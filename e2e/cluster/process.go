package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Process is a background process started by StartProcess (or Harness.Start).
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // file receiving stdout and stderr

	done chan struct{} // closed once Cmd.Wait returned
}

// Exec runs `ip netns exec ns args...` and returns its combined output.
func (c *Cluster) Exec(ctx context.Context, ns string, args ...string) ([]byte, error) {
	return c.ExecInput(ctx, ns, "", args...)
}

// ExecInput is Exec with stdin (e.g. `nft -f -` with a ruleset for a harness namespace).
func (c *Cluster) ExecInput(ctx context.Context, ns, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", InNetns(ns, args...)[1:]...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	cmd.WaitDelay = time.Second
	return cmd.CombinedOutput()
}

// InNetns is argv run with `ip netns exec ns`.
func InNetns(ns string, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}

// StartProcess starts args in namespace ns in the background, appending its stdout and
// stderr to WorkDir/<name>.log. Stop kills it if it is still running.
func (c *Cluster) StartProcess(ns, name string, args ...string) (*Process, error) {
	return c.h.Start(name, nil, InNetns(ns, args...)...)
}

// Start runs argv in the background with env added to the test's environment, appending
// its stdout and stderr to WorkDir/<name>.log. The child is killed if the test binary
// dies; Stop stops it.
func (h *Harness) Start(name string, env []string, argv ...string) (*Process, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, fmt.Errorf("%s %s is stopped", h.Kind, h.Prefix)
	}
	logPath := filepath.Join(h.WorkDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	// `ip netns exec` and nsenter exec the command, so Cmd.Process is the command itself.
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Do not outlive the test binary if it dies without running Stop.
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
	h.procs = append(h.procs, p)
	h.Logf("started %s (pid %d), log %s", name, p.PID(), logPath)
	return p, nil
}

// PID returns the process id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM, then SIGKILL if the process is still running after 3 s, and waits.
func (p *Process) Stop() {
	if !p.Running() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		p.Kill()
	}
}

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	if p.Running() {
		_ = p.Cmd.Process.Kill()
	}
	<-p.done
}

// Tail returns the last n lines of the process log.
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
