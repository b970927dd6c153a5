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

// Process is a background process started by StartProcess.
type Process struct {
	Cmd *exec.Cmd
	Log string // file receiving stdout and stderr

	done chan struct{} // closed once Cmd.Wait returned
}

// Exec runs `ip netns exec ns args...` and returns its combined output.
func (c *Cluster) Exec(ctx context.Context, ns string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.WaitDelay = time.Second
	return cmd.CombinedOutput()
}

// ExecInput is Exec with stdin (e.g. `nft -f -` with a ruleset for a harness namespace).
func (c *Cluster) ExecInput(ctx context.Context, ns, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.WaitDelay = time.Second
	return cmd.CombinedOutput()
}

// StartProcess starts args in namespace ns in the background, appending its stdout and
// stderr to WorkDir/<name>.log. Stop kills it if it is still running.
func (c *Cluster) StartProcess(ns, name string, args ...string) (*Process, error) {
	return c.startProcess(ns, name, nil, args...)
}

func (c *Cluster) startProcess(ns, name string, env []string, args ...string) (*Process, error) {
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
	fmt.Fprintf(f, "=== %s: ip netns exec %s %s\n", time.Now().Format(time.RFC3339Nano), ns, strings.Join(args, " "))
	// `ip netns exec` execs the command, so Cmd.Process is the command itself.
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Do not outlive the test binary if it dies without running Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	c.logf("cluster %s: started %s (pid %d) in %s, log %s", c.Prefix, name, p.PID(), ns, logPath)
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
