// Command abwrap interleaves nftproxy binaries in one run of the side-by-side suite, so
// that binaries are compared in the same minutes on a machine whose speed drifts
// (e2e/bench/README.md). Point BENCH_NFTPROXY_BIN at it and list the variants:
//
//	AB_VARIANTS=base,new:GOGC=50 AB_DIR=/tmp/ab BENCH_NFTPROXY_BIN=/path/to/abwrap …
//
// A variant is a binary AB_DIR/np-<name>, optionally with environment variables after a
// colon (NAME=V;NAME2=V2). Each proxy start (a command line without --version,
// --cleanup or --help) runs the next variant in turn, counted in AB_DIR/ab.count under
// a lock; those other calls go to the first variant. The binary runs as a child: the
// wrapper forwards SIGTERM and SIGINT to it, and when it exits writes its peak RSS
// (ru_maxrss) to stderr, the proxy's log, after the line naming the variant, as the
// suite's own peak RSS would be the wrapper's.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	os.Exit(run())
}

func run() int {
	dir := os.Getenv("AB_DIR")
	variants := strings.Split(os.Getenv("AB_VARIANTS"), ",")
	if dir == "" || variants[0] == "" {
		fmt.Fprintln(os.Stderr, "abwrap: set AB_DIR and AB_VARIANTS")
		return 2
	}
	counted := true
	for _, a := range os.Args[1:] {
		if a == "--version" || a == "--cleanup" || a == "--help" {
			counted = false
		}
	}
	pick := variants[0]
	if counted {
		n, err := next(filepath.Join(dir, "ab.count"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "abwrap:", err)
			return 2
		}
		pick = variants[n%len(variants)]
		fmt.Fprintf(os.Stderr, "AB variant=%s run=%d\n", pick, n)
	}
	name, env, _ := strings.Cut(pick, ":")
	cmd := exec.Command(filepath.Join(dir, "np-"+name), os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	if env != "" {
		cmd.Env = append(cmd.Env, strings.Split(env, ";")...)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "abwrap:", err)
		return 2
	}
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sig {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	if cmd.ProcessState == nil {
		return 2
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && counted {
		fmt.Fprintf(os.Stderr, "VmHWM: %d kB\n", ru.Maxrss)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "abwrap:", err)
		return 2
	}
	return 0
}

// next returns the count in file and stores it plus one, under an exclusive lock.
func next(file string) (int, error) {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return 0, err
	}
	b := make([]byte, 32)
	k, _ := f.ReadAt(b, 0)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b[:k])))
	if err := f.Truncate(0); err != nil {
		return 0, err
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(n+1)), 0); err != nil {
		return 0, err
	}
	return n, nil
}
