package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Harness is what every throw-away cluster owns, this package's and e2e/realcluster's: a
// work directory, the background processes it started (each logging to
// WorkDir/<name>.log) and the network namespaces it created. Stop ends them in reverse
// order of creation.
type Harness struct {
	Kind    string // "cluster", "realcluster": the first word of the harness's log lines
	Prefix  string // random prefix of the cluster's namespace names
	WorkDir string
	// AttemptTimeout bounds each check of WaitFor (default 3 s).
	AttemptTimeout time.Duration

	logf       func(format string, args ...any)
	ownWorkDir bool

	mu      sync.Mutex
	procs   []*Process
	netns   []string // created namespaces, in creation order
	stopped bool
}

// NewHarness returns a harness working in workDir (created if missing), or, if workDir is
// empty, in a new temporary directory named tempPattern (os.MkdirTemp) that Stop removes.
// logf receives the harness's log lines; nil discards them.
func NewHarness(kind, prefix, workDir, tempPattern string, logf func(format string, args ...any)) (*Harness, error) {
	h := &Harness{Kind: kind, Prefix: prefix, WorkDir: workDir, AttemptTimeout: 3 * time.Second, logf: logf}
	if h.logf == nil {
		h.logf = func(string, ...any) {}
	}
	if h.WorkDir == "" {
		dir, err := os.MkdirTemp("", tempPattern)
		if err != nil {
			return nil, err
		}
		h.WorkDir, h.ownWorkDir = dir, true
	} else if err := os.MkdirAll(h.WorkDir, 0o755); err != nil {
		return nil, err
	}
	return h, nil
}

// Logf logs a line starting with the harness's kind and prefix.
func (h *Harness) Logf(format string, args ...any) {
	h.logf("%s %s: "+format, append([]any{h.Kind, h.Prefix}, args...)...)
}

// Processes returns the processes started so far, in start order.
func (h *Harness) Processes() []*Process {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Process(nil), h.procs...)
}

// AddNetns creates network namespace ns with lo up; Stop deletes it.
func (h *Harness) AddNetns(ctx context.Context, ns string) error {
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", ns, err, out)
	}
	h.mu.Lock()
	h.netns = append(h.netns, ns)
	h.mu.Unlock()
	return h.IP(ctx, ns, "link set lo up")
}

// DelNetns deletes network namespace ns.
func (h *Harness) DelNetns(ns string) error {
	if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns delete %s: %w: %s", ns, err, out)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, n := range h.netns {
		if n == ns {
			h.netns = append(h.netns[:i], h.netns[i+1:]...)
			break
		}
	}
	return nil
}

// IP runs `ip -n ns -batch -` with the given commands, stopping at the first failure.
func (h *Harness) IP(ctx context.Context, ns string, cmds ...string) error {
	cmd := exec.CommandContext(ctx, "ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s: %w: %s\ncommands:\n%s", ns, err, out, strings.Join(cmds, "\n"))
	}
	return nil
}

// WaitFor polls check every 500 ms (each attempt bounded by AttemptTimeout) until it
// succeeds, ctx ends or one of procs exits.
func (h *Harness) WaitFor(ctx context.Context, what string, procs []*Process, check func(context.Context) error) error {
	start := time.Now()
	for {
		attempt, cancel := context.WithTimeout(ctx, h.AttemptTimeout)
		err := check(attempt)
		cancel()
		if err == nil {
			h.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
			return nil
		}
		for _, p := range procs {
			if !p.Running() {
				return fmt.Errorf("waiting for %s: %s exited; log %s:\n%s", what, p.Name, p.Log, p.Tail(20))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Tails returns the last n lines of every process log (for a failed test).
func (h *Harness) Tails(n int) string {
	var b strings.Builder
	for _, p := range h.Processes() {
		fmt.Fprintf(&b, "--- tail of %s:\n%s\n", p.Log, p.Tail(n))
	}
	return b.String()
}

// Stop runs first (if not nil; e.g. a node's own teardown), stops every process in
// reverse start order, deletes the namespaces in reverse creation order and removes the
// work directory if NewHarness created it (unless KEEP_E2E_WORKDIR=1). Only the first
// call does anything.
func (h *Harness) Stop(first func() error) {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.stopped = true
	procs := append([]*Process(nil), h.procs...)
	h.mu.Unlock()

	var errs []error
	if first != nil {
		errs = append(errs, first())
	}
	// Reverse start order: workloads first, etcd last.
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
	h.mu.Lock()
	nss := append([]string(nil), h.netns...)
	h.mu.Unlock()
	for i := len(nss) - 1; i >= 0; i-- {
		errs = append(errs, h.DelNetns(nss[i]))
	}
	if err := errors.Join(errs...); err != nil {
		h.Logf("stop: %v", err)
	}
	switch {
	case os.Getenv("KEEP_E2E_WORKDIR") == "1":
		h.Logf("keeping workdir %s", h.WorkDir)
	case h.ownWorkDir:
		if err := os.RemoveAll(h.WorkDir); err != nil {
			h.Logf("remove workdir: %v", err)
		}
	}
}
