package kernel

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// Applier writes rulesets to the kernel. It remembers what it last wrote successfully, so
// that a sync sends only the difference; after an error, or when asked to resync, the
// next Apply reads the table's object names from the kernel and rewrites everything (still
// in one transaction). An Applier must be used by one goroutine at a time.
type Applier struct {
	netns int // fd of the target network namespace, or 0 for the current one
	prev  map[tableKey]*state
}

type tableKey struct {
	fam  nft.Family
	name string
}

// state is the last ruleset known to be in the kernel, indexed for diffing.
type state struct {
	rs     *nft.Ruleset
	sets   map[string]*nft.Set
	elems  map[string]map[string]encodedElem // set → key bytes → element
	chains map[string]*nft.Chain
}

type encodedElem struct {
	elem nft.Element
	full string // key, value and comment bytes: equal when nothing changed
}

// Option configures an Applier.
type Option func(*Applier)

// WithNetNS makes the Applier program the network namespace open at fd.
func WithNetNS(fd int) Option { return func(a *Applier) { a.netns = fd } }

// New returns an Applier.
func New(opts ...Option) *Applier {
	a := &Applier{prev: map[tableKey]*state{}}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Stats describes one Apply.
type Stats struct {
	Full     bool          // the whole table was rewritten
	Messages int           // netlink messages in the transaction
	Bytes    int           // their size
	Elements int           // set elements added or deleted
	Chains   int           // chains created, refilled or deleted
	Kernel   time.Duration // time from send to the kernel's last answer
}

// Resync makes the next Apply rewrite the whole table from scratch, correcting any drift
// between the kernel and what the Applier believes is there.
func (a *Applier) Resync() { a.prev = map[tableKey]*state{} }

// Apply makes the kernel's tables equal to the given rulesets in one transaction.
func (a *Applier) Apply(rulesets ...*nft.Ruleset) (Stats, error) {
	var st Stats
	conn, err := a.dial()
	if err != nil {
		return st, err
	}
	defer conn.Close()
	var batches []*batch
	next := map[tableKey]*state{}
	for _, rs := range rulesets {
		k := tableKey{rs.Family, rs.Table}
		cur := index(rs)
		prev := a.prev[k]
		if prev == nil {
			st.Full = true
			prev, err = a.kernelState(rs.Family, rs.Table)
			if err != nil {
				return st, err
			}
		}
		b := newBatch(rs.Family, rs.Table)
		if n := len(batches); n > 0 {
			b.setID = batches[n-1].setID // set IDs must be unique within the transaction
		}
		if err := diff(b, prev, cur, &st); err != nil {
			return st, err
		}
		batches = append(batches, b)
		next[k] = cur
	}
	all := mergeBatches(batches)
	st.Messages, st.Bytes = len(all.msgs), all.bytes
	start := time.Now()
	err = all.send(conn)
	st.Kernel = time.Since(start)
	if err != nil {
		a.Resync() // the kernel kept the old ruleset; start from what it has next time
		return st, err
	}
	for k, s := range next {
		a.prev[k] = s
	}
	return st, nil
}

// Delete removes the given tables if they exist, in one transaction.
func (a *Applier) Delete(fam nft.Family, tables ...string) error {
	a.Resync()
	existing, err := a.tableNames(fam)
	if err != nil {
		return err
	}
	b := newBatch(fam, "")
	for _, t := range tables {
		if slices.Contains(existing, t) {
			b.table = t
			if err := b.delTable(); err != nil {
				return err
			}
		}
	}
	conn, err := a.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	return b.send(conn)
}

func (a *Applier) dial() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: a.netns, Strict: true})
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink socket: %w", err)
	}
	return c, nil
}

func (a *Applier) reader() (*nftables.Conn, error) {
	if a.netns != 0 {
		return nftables.New(nftables.WithNetNSFd(a.netns))
	}
	return nftables.New()
}

func (a *Applier) tableNames(fam nft.Family) ([]string, error) {
	c, err := a.reader()
	if err != nil {
		return nil, err
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamily(fam))
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", fam, err)
	}
	var names []string
	for _, t := range ts {
		names = append(names, t.Name)
	}
	return names, nil
}

// kernelState reads the names of the chains and sets the table has now. Their content is
// unknown, so diff rewrites every one of them.
func (a *Applier) kernelState(fam nft.Family, table string) (*state, error) {
	st := &state{sets: map[string]*nft.Set{}, chains: map[string]*nft.Chain{}, elems: map[string]map[string]encodedElem{}}
	names, err := a.tableNames(fam)
	if err != nil || !slices.Contains(names, table) {
		return st, err
	}
	c, err := a.reader()
	if err != nil {
		return nil, err
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamily(fam)}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamily(fam))
	if err != nil {
		return nil, fmt.Errorf("listing chains of %s %s: %w", fam, table, err)
	}
	for _, ch := range chains {
		if ch.Table.Name == table {
			st.chains[ch.Name] = nil // present, content unknown
		}
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("listing sets of %s %s: %w", fam, table, err)
	}
	for _, s := range sets {
		if !s.Anonymous {
			st.sets[s.Name] = nil // present, definition unknown
		}
	}
	return st, nil
}

func index(rs *nft.Ruleset) *state {
	st := &state{rs: rs, sets: map[string]*nft.Set{}, chains: map[string]*nft.Chain{}, elems: map[string]map[string]encodedElem{}}
	for _, s := range rs.Sets {
		st.sets[s.Name] = s
		m := make(map[string]encodedElem, len(s.Elements))
		for _, e := range s.Elements {
			k, _ := encodeValues(s.Key, e.Key)
			m[string(k)] = encodedElem{elem: e, full: fingerprint(s, e, k)}
		}
		st.elems[s.Name] = m
	}
	for _, c := range rs.Chains {
		st.chains[c.Name] = c
	}
	return st
}

// fingerprint identifies an element's key, value and comment: equal fingerprints need no
// kernel update.
func fingerprint(s *nft.Set, e nft.Element, key []byte) string {
	b := append([]byte(nil), key...)
	b = append(b, 0)
	if e.Verdict != nil {
		b = append(b, byte(e.Verdict.Kind))
		b = append(b, e.Verdict.Chain...)
	} else if len(e.Data) > 0 {
		data, _ := encodeValues(s.Data, e.Data)
		b = append(b, data...)
	}
	b = append(b, 0)
	return string(append(b, e.Comment...))
}

// diff appends to b the messages that turn prev into cur, in an order the kernel accepts
// within one transaction: objects are created before anything refers to them, and
// references are removed before what they refer to is deleted.
func diff(b *batch, prev, cur *state, st *Stats) error {
	var errs []error
	try := func(err error) { errs = append(errs, err) }
	try(b.addTable())

	// Sets whose definition changed or is unknown are deleted and created anew.
	var newSets, goneSets []*nft.Set
	for _, s := range cur.rs.Sets {
		old, had := prev.sets[s.Name]
		if !had || !sameSetDef(old, s) {
			newSets = append(newSets, s)
		}
		if had && !sameSetDef(old, s) {
			goneSets = append(goneSets, &nft.Set{Name: s.Name})
		}
	}
	for name := range prev.sets {
		if _, keep := cur.sets[name]; !keep {
			goneSets = append(goneSets, &nft.Set{Name: name})
		}
	}
	recreated := map[string]bool{}
	for _, s := range newSets {
		recreated[s.Name] = true
	}

	// 1. element deletions in kept sets (they may refer to chains about to go); learned
	// entries of dynamic sets are dropped when the set's epoch changes
	for _, s := range cur.rs.Sets {
		if recreated[s.Name] {
			continue
		}
		if s.Dynamic {
			if prev.sets[s.Name].Epoch != s.Epoch {
				try(b.flushSet(s.Name))
			}
			continue
		}
		var del []nft.Element
		for k, old := range prev.elems[s.Name] {
			if now, ok := cur.elems[s.Name][k]; !ok || now.full != old.full {
				del = append(del, old.elem)
			}
		}
		st.Elements += len(del)
		try(b.elems(s, del, true))
	}
	// 2. flush rules of chains that change or go, and of chains with unknown content; a
	// replaced set may be referenced from any chain, so then every chain is rewritten
	var newChains, refill []*nft.Chain
	for _, c := range cur.rs.Chains {
		old, had := prev.chains[c.Name]
		switch {
		case !had:
			newChains = append(newChains, c)
			refill = append(refill, c)
		case old == nil || len(goneSets) > 0 || !reflect.DeepEqual(old.Rules, c.Rules) || !reflect.DeepEqual(old.Hook, c.Hook):
			try(b.flushChain(c.Name))
			refill = append(refill, c)
		}
	}
	var goneChains []string
	for name := range prev.chains {
		if _, keep := cur.chains[name]; !keep {
			try(b.flushChain(name))
			goneChains = append(goneChains, name)
		}
	}
	slices.Sort(goneChains)
	// 3. sets that are replaced go now that no rule refers to them
	for _, s := range goneSets {
		try(b.delSet(s.Name))
	}
	// 4. new sets, new chains
	for _, s := range newSets {
		try(b.addSet(s))
	}
	for _, c := range newChains {
		try(b.addChain(c))
	}
	// 5. elements (they may refer to the new chains), then rules (they refer to sets and
	// chains)
	for _, s := range cur.rs.Sets {
		var add []nft.Element
		if recreated[s.Name] {
			add = s.Elements
		} else {
			for k, now := range cur.elems[s.Name] { // keys were encoded once, by index
				if old, ok := prev.elems[s.Name][k]; !ok || old.full != now.full {
					add = append(add, now.elem)
				}
			}
		}
		st.Elements += len(add)
		try(b.elems(s, add, false))
	}
	for _, c := range refill {
		for _, r := range c.Rules {
			try(b.addRule(c.Name, r))
		}
	}
	// 6. chains that are gone
	for _, name := range goneChains {
		try(b.delChain(name))
	}
	st.Chains += len(refill) + len(goneChains)
	return errors.Join(errs...)
}

// sameSetDef reports whether two sets have the same type, flags and comment.
func sameSetDef(a, b *nft.Set) bool {
	return a != nil && b != nil && a.Comment == b.Comment &&
		a.Dynamic == b.Dynamic && a.Timeout == b.Timeout && a.Size == b.Size && a.Counter == b.Counter &&
		slices.Equal(a.Key, b.Key) && slices.Equal(a.Data, b.Data)
}

func mergeBatches(bs []*batch) *batch {
	if len(bs) == 1 {
		return bs[0]
	}
	out := &batch{}
	for _, b := range bs {
		out.msgs = append(out.msgs, b.msgs...)
		out.what = append(out.what, b.what...)
		out.bytes += b.bytes
	}
	return out
}
