package testnetns

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Do runs f on an OS thread inside ns: the sockets f creates belong to ns.
func (ns *NS) Do(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Setns(ns.FD, unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}

// DialTCP connects inside ns from source address src to dst:port (IPv4), within 5 s.
func (ns *NS) DialTCP(src, dst string, port int) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		c, err = d.DialContext(context.Background(), "tcp4", net.JoinHostPort(dst, strconv.Itoa(port)))
		return err
	})
	return c, err
}
