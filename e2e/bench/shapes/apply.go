package shapes

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Conn sends element transactions to the shapes table in one network namespace.
type Conn struct {
	c     *nftables.Conn
	table *nftables.Table
}

// Dial opens a lasting netlink connection in the namespace of fd.
func Dial(fd int) (*Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting())
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, table: &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}}, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.CloseLasting() }

// Cost is what one transaction took: Wall from the send to the kernel's last
// acknowledgement, and CPU the sending thread's CPU time over the same span. The kernel
// processes a netlink batch, its commit and validation included, in the sender's
// sendmsg: CPU is the kernel's work, which other processes on a shared machine do not
// inflate the way they inflate Wall.
type Cost struct{ Wall, CPU time.Duration }

// ThreadCPU returns the calling thread's CPU time (lock the goroutine to its thread).
func ThreadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// Apply sends ops as one transaction and returns its cost. Encoding happens before the
// clocks start.
func (c *Conn) Apply(ops []Op) (Cost, error) {
	for _, op := range ops {
		s := &nftables.Set{Table: c.table, Name: op.Set}
		var elems []nftables.SetElement
		for _, e := range op.Elements {
			el := nftables.SetElement{Key: e.Key, Val: e.Val}
			if e.Chain != "" {
				el.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.Chain}
				s.IsMap = true
			}
			if e.Val != nil {
				s.IsMap = true
			}
			elems = append(elems, el)
		}
		var err error
		if op.Delete {
			err = c.c.SetDeleteElements(s, elems)
		} else {
			err = c.c.SetAddElements(s, elems)
		}
		if err != nil {
			return Cost{}, fmt.Errorf("%s: %w", op.Set, err)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu, start := ThreadCPU(), time.Now()
	err := c.c.Flush()
	return Cost{Wall: time.Since(start), CPU: ThreadCPU() - cpu}, err
}

// StaleAffinity returns the transaction that forgets the clients of s pinned to any of
// gone (endpoints s no longer has), as kube-proxy drops an endpoint's affinity set: their
// next connection draws again. nftables cannot delete elements by value, so the
// affinity map is read (its size is bounded by its "size") and the matches deleted.
func (c *Conn) StaleAffinity(s Service, gone []Endpoint) ([]Op, error) {
	elems, err := c.c.GetSetElements(&nftables.Set{Table: c.table, Name: "affinity", IsMap: true})
	if err != nil {
		return nil, err
	}
	key := svcKey(s)
	var del []Elem
	for _, e := range elems {
		if len(e.Key) != 4+len(key) || string(e.Key[4:]) != string(key) || len(e.Val) < 8 {
			continue
		}
		for _, g := range gone {
			if string(e.Val[:4]) == string(g.Addr.AsSlice()) && binary.BigEndian.Uint16(e.Val[4:]) == g.Port {
				del = append(del, Elem{Key: e.Key, Val: e.Val})
			}
		}
	}
	if len(del) == 0 {
		return nil, nil
	}
	return []Op{{Delete: true, Set: "affinity", Elements: del}}, nil
}
