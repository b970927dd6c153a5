package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary act as pause when re-executed with PAUSE_TEST_RUN=1.
func TestMain(m *testing.M) {
	if os.Getenv("PAUSE_TEST_RUN") == "1" {
		if p := os.Getenv("PAUSE_TEST_ORPHAN"); p != "" {
			startOrphan(p)
		}
		main()
		os.Exit(3) // main only returns for -v
	}
	os.Exit(m.Run())
}

func startPause(t *testing.T) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PAUSE_TEST_RUN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, done
}

func TestSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd, done := startPause(t)
		// Still running a moment later: it waits instead of exiting.
		select {
		case err := <-done:
			t.Fatalf("pause exited by itself: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("after %v: %v, want exit status 0", sig, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("pause did not exit within 10 s of %v", sig)
		}
	}
}

// TestReaps checks that pause reaps what a PID 1 inherits: pause runs as a child
// subreaper (as PID 1 of a pod receives orphans) with a direct child that exits and an
// orphaned grandchild; both must leave no zombie behind.
func TestReaps(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("needs sh")
	}
	pidFile := filepath.Join(t.TempDir(), "pids")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PAUSE_TEST_RUN=1", "PAUSE_TEST_ORPHAN="+pidFile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var pids []string
	deadline := time.Now().Add(10 * time.Second)
	for len(pids) < 2 {
		b, _ := os.ReadFile(pidFile)
		pids = strings.Fields(string(b))
		if time.Now().After(deadline) {
			t.Fatalf("the child never wrote its pids (%q)", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range pids { // sh, then its orphaned sleep
		for {
			if _, err := os.Stat("/proc/" + pid); os.IsNotExist(err) {
				break // reaped
			}
			if time.Now().After(deadline) {
				st, _ := os.ReadFile("/proc/" + pid + "/stat")
				t.Fatalf("process %s not reaped within 10 s: %s", pid, st)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Errorf("pause after SIGTERM: %v", err)
	}
}

// startOrphan, in the re-executed pause, makes it a child subreaper and starts a shell
// that leaves a background sleep behind; it does not wait for either.
func startOrphan(pidFile string) {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		panic(errno)
	}
	_, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "sleep 0.5 & echo $$ $! > " + pidFile}, &os.ProcAttr{})
	if err != nil {
		panic(err)
	}
}
