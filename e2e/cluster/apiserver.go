package cluster

import (
	"context"
	"fmt"
)

// apiserverProcess returns the most recently started kube-apiserver process (the one
// startControlPlane or StartAPIServer started; its log is WorkDir/kube-apiserver.log).
func (c *Cluster) apiserverProcess() *Process {
	procs := c.h.Processes()
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i].Name == "kube-apiserver" {
			return procs[i]
		}
	}
	return nil
}

// etcdProcess returns the etcd process.
func (c *Cluster) etcdProcess() *Process {
	for _, p := range c.h.Processes() {
		if p.Name == "etcd" {
			return p
		}
	}
	return nil
}

// APIServerRunning reports whether kube-apiserver's process is running.
func (c *Cluster) APIServerRunning() bool {
	p := c.apiserverProcess()
	return p != nil && p.Running()
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 3 s: with watches
// open it may not exit on SIGTERM alone) and waits for it to exit. etcd keeps running,
// so StartAPIServer brings the same cluster state back. Clients (c.Client, nftproxy)
// see connection refused until then.
func (c *Cluster) StopAPIServer(ctx context.Context) error {
	p := c.apiserverProcess()
	if p == nil || !p.Running() {
		return fmt.Errorf("cluster %s: kube-apiserver is not running", c.Prefix)
	}
	done := make(chan struct{})
	go func() {
		p.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.logf("cluster %s: kube-apiserver (pid %d) stopped", c.Prefix, p.PID())
	return nil
}

// StartAPIServer starts kube-apiserver again, in the node namespace with the command
// line of the previous one (same flags, certificates, token file, service-account key
// and etcd, hence the same objects), and waits for /readyz. Its output is appended to
// the same log.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	prev := c.apiserverProcess()
	if prev == nil {
		return fmt.Errorf("cluster %s: no kube-apiserver was ever started", c.Prefix)
	}
	if prev.Running() {
		return fmt.Errorf("cluster %s: kube-apiserver is already running (pid %d)", c.Prefix, prev.PID())
	}
	etcd := c.etcdProcess()
	if etcd == nil || !etcd.Running() {
		return fmt.Errorf("cluster %s: etcd is not running", c.Prefix)
	}
	// prev.Cmd.Args is "ip netns exec <ns> <kube-apiserver> <flags...>".
	args := prev.Cmd.Args
	if len(args) < 5 || args[1] != "netns" || args[2] != "exec" {
		return fmt.Errorf("cluster %s: unexpected kube-apiserver command line %q", c.Prefix, args)
	}
	p, err := c.StartProcess(args[3], "kube-apiserver", args[4:]...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	return c.h.WaitFor(ctx, "kube-apiserver /readyz after restart", []*Process{etcd, p}, func(ctx context.Context) error {
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// ControlPlanePIDs returns the process IDs of the running kube-apiserver and etcd (for
// measuring their CPU).
func (c *Cluster) ControlPlanePIDs() []int {
	var pids []int
	for _, p := range []*Process{c.apiserverProcess(), c.etcdProcess()} {
		if p != nil && p.Running() {
			pids = append(pids, p.PID())
		}
	}
	return pids
}
