package shapes

import (
	"fmt"
	"time"

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

// Apply sends ops as one transaction and returns the time from the send to the kernel's
// last acknowledgement (the commit, with any validation it does, included). Encoding
// happens before the clock starts.
func (c *Conn) Apply(ops []Op) (time.Duration, error) {
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
			return 0, fmt.Errorf("%s: %w", op.Set, err)
		}
	}
	start := time.Now()
	err := c.c.Flush()
	return time.Since(start), err
}
