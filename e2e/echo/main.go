// Command echo is the e2e test workload and client.
//
//	echo serve [--ports 8080,9090] [--name NAME]
//	    TCP and UDP servers on each port. Every answer is one line
//	    "<name> <client ip:port as seen by the server>\n"; TCP answers on accept and
//	    closes, UDP answers each datagram. NAME defaults to $POD_NAME.
//	echo probe --proto tcp|udp --addr IP:PORT [--count N] [--timeout D] [--interval D] [--sport P [--sport-each]]
//	    N sequential attempts, each on a new socket, one JSON line per attempt:
//	    {"ok":bool,"pod":"…","client":"…","err":"…","refused":bool,"ms":float,"at":time}.
//	    IP may be IPv6 ([fd00::1]:80). --sport binds every socket to local port P
//	    (SO_REUSEADDR), so all attempts share one 5-tuple; with --sport-each attempt i
//	    binds P+i (one known flow per attempt). Exits 0 even when attempts fail.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if len(os.Args) < 2 {
		log.Fatal("usage: echo serve|probe [flags]")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "probe":
		err = probe(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q (want serve or probe)", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	ports := fs.String("ports", "8080,9090", "comma-separated TCP and UDP ports")
	name := fs.String("name", os.Getenv("POD_NAME"), "name to answer with")
	_ = fs.Parse(args)
	if *name == "" {
		return errors.New("no name: set POD_NAME or --name")
	}
	errc := make(chan error)
	for _, port := range strings.Split(*ports, ",") {
		addr := ":" + strings.TrimSpace(port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		go func() { errc <- serveTCP(ln, *name) }()
		go func() { errc <- serveUDP(pc, *name) }()
	}
	log.Printf("%s serving tcp+udp on %s: ready pid=%d", *name, *ports, os.Getpid())
	return <-errc
}

func serveTCP(ln net.Listener, name string) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(conn, "%s %s\n", name, conn.RemoteAddr())
		}()
	}
}

func serveUDP(pc net.PacketConn, name string) error {
	buf := make([]byte, 64<<10)
	for {
		_, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		if _, err := pc.WriteTo(fmt.Appendf(nil, "%s %s\n", name, addr), addr); err != nil {
			log.Printf("udp reply to %s: %v", addr, err)
		}
	}
}

type result struct {
	OK      bool      `json:"ok"`
	Pod     string    `json:"pod"`
	Client  string    `json:"client"`
	Err     string    `json:"err"`
	Refused bool      `json:"refused"`
	Millis  float64   `json:"ms"`
	At      time.Time `json:"at"`
}

func probe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	proto := fs.String("proto", "tcp", "tcp or udp")
	addr := fs.String("addr", "", "ip:port to probe")
	count := fs.Int("count", 1, "number of attempts")
	timeout := fs.Duration("timeout", time.Second, "timeout per attempt")
	interval := fs.Duration("interval", 0, "pause between attempts")
	sport := fs.Int("sport", 0, "local port of every attempt (0: any)")
	sportEach := fs.Bool("sport-each", false, "attempt i uses local port sport+i (one flow each)")
	_ = fs.Parse(args)
	if *addr == "" || (*proto != "tcp" && *proto != "udp") {
		return errors.New("probe needs --proto tcp|udp and --addr ip:port")
	}
	enc := json.NewEncoder(os.Stdout)
	for i := 0; i < *count; i++ {
		if i > 0 {
			time.Sleep(*interval)
		}
		start := time.Now()
		port := *sport
		if *sportEach && port != 0 {
			port += i
		}
		line, err := attempt(*proto, *addr, *timeout, port)
		r := result{Millis: float64(time.Since(start).Microseconds()) / 1000, At: start}
		if err == nil {
			if pod, client, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
				r.OK, r.Pod, r.Client = true, pod, client
			} else {
				err = fmt.Errorf("malformed answer %q", line)
			}
		}
		if err != nil {
			r.Err = err.Error()
			r.Refused = errors.Is(err, syscall.ECONNREFUSED)
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// attempt opens a new socket to addr (from local port sport if not 0) and returns the
// server's answer line.
func attempt(proto, addr string, timeout time.Duration, sport int) (string, error) {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Timeout: timeout}
	if sport != 0 {
		if proto == "udp" {
			d.LocalAddr = &net.UDPAddr{Port: sport}
		} else {
			d.LocalAddr = &net.TCPAddr{Port: sport}
		}
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	conn, err := d.Dial(proto, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return "", err
	}
	if proto == "udp" {
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			return "", err
		}
	}
	return bufio.NewReader(conn).ReadString('\n')
}
