// Package fake is an in-memory nf_tables for tests that run without root: the peer
// at the other end of a real nft/kernel Applier's connection (kernel.WithPeer). The
// Applier diffs and encodes as it does for the kernel; its batches reach the fake as
// netlink messages, which nft/wire parses, and the fake keeps the tables they build. A
// transaction (one batch) is checked as the kernel checks it and committed as a whole
// or not at all; what the fake holds can be read back (Ruleset, Render) and changed
// behind the Applier's back as another process would (Foreign).
//
// Since the Applier remembers what it last wrote and sends only the difference, an
// element or chain it believes is there and is not (another process removed it) makes
// the next delta fail, as it does in the kernel, until Resync makes the next Apply
// rewrite the table.
//
// Refused, with the errno the kernel gives (a *kernel.RejectedError from Apply): a jump
// or goto to a chain that does not exist (ENOENT), a lookup, verdict map, dnat map or
// set update of a set that does not exist (ENOENT), elements for a set that does not
// exist (ENOENT), an element whose key or value does not have the set's lengths
// (EINVAL), a verdict map lookup of a set without verdicts (EINVAL), an update of a set
// that is not dynamic (EOPNOTSUPP), deleting a chain, set, element or table that does
// not exist (ENOENT), deleting a chain or set something still refers to, such as
// another process's rule (EBUSY), adding an element that exists with another value or
// a set that exists with another definition (EEXIST), a jump loop reachable from a base
// chain (EMLINK: the kernel gives up at its jump depth limit), and names longer than
// the kernel's limit (ERANGE: the attribute fails policy validation). What the
// Applier's encoder refuses (an element value that does not fit its set's types) never
// reaches the fake, as it never reaches the kernel.
package fake

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// maxName is the longest chain, set or table name the kernel takes (NFT_NAME_MAXLEN
// 256, with the terminating NUL).
const maxName = 255

// Applier is a kernel.Applier whose connections go to an in-memory nf_tables. It is
// safe to use as a kernel.Applier is (one goroutine applies); Ruleset, Render, Foreign
// and Counts may be called from any goroutine.
type Applier struct {
	*kernel.Applier
	nf *Netfilter

	mu                         sync.Mutex
	applies, refusals, resyncs int
}

// New returns an Applier on an empty fake.
func New() *Applier {
	nf := NewNetfilter()
	return &Applier{Applier: kernel.New(kernel.WithPeer(nf)), nf: nf}
}

// Netfilter is the fake nf_tables itself (the wire.Peer); Applier.Netfilter returns it.
func (f *Applier) Netfilter() *Netfilter { return f.nf }

// Apply is kernel.Applier.Apply, counted.
func (f *Applier) Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error) {
	st, err := f.Applier.Apply(rulesets...)
	var rejected *kernel.RejectedError
	f.mu.Lock()
	f.applies++
	if errors.As(err, &rejected) {
		f.refusals++
	}
	f.mu.Unlock()
	return st, err
}

// Resync is kernel.Applier.Resync, counted.
func (f *Applier) Resync() {
	f.mu.Lock()
	f.resyncs++
	f.mu.Unlock()
	f.Applier.Resync()
}

// Counts reports how many transactions Apply was given, how many the fake refused,
// and how many times Resync was called.
func (f *Applier) Counts() (applies, refusals, resyncs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies, f.refusals, f.resyncs
}

// Ruleset returns what the fake holds in a table (Netfilter.Ruleset).
func (f *Applier) Ruleset(fam nft.Family, name string) *nft.Ruleset { return f.nf.Ruleset(fam, name) }

// Render is the table in nft syntax (Netfilter.Render).
func (f *Applier) Render(fam nft.Family, name string) string { return f.nf.Render(fam, name) }

// Foreign commits another process's transaction (Netfilter.Foreign).
func (f *Applier) Foreign(fam nft.Family, name string, edit func(rs *nft.Ruleset)) error {
	return f.nf.Foreign(fam, name, edit)
}

// Netfilter is an in-memory nf_tables: a wire.Peer with the kernel's commit semantics.
type Netfilter struct {
	mu     sync.Mutex
	tables map[tableKey]*wire.TableState // committed: never changed in place
	gen    uint32
}

type tableKey struct {
	fam  nft.Family
	name string
}

// NewNetfilter returns an empty fake nf_tables.
func NewNetfilter() *Netfilter { return &Netfilter{tables: map[tableKey]*wire.TableState{}, gen: 1} }

// Generation is the ruleset generation: one more per committed transaction.
func (nf *Netfilter) Generation() uint32 {
	nf.mu.Lock()
	defer nf.mu.Unlock()
	return nf.gen
}

// Tables returns the family's tables, by name.
func (nf *Netfilter) Tables(fam nft.Family) []*wire.TableState {
	nf.mu.Lock()
	defer nf.mu.Unlock()
	var out []*wire.TableState
	for k, t := range nf.tables {
		if k.fam == fam {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *wire.TableState) int { return cmpString(a.Name, b.Name) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Ruleset returns what the fake holds in a table as a flat ruleset (no parts), decoded
// by nft/wire: sets and chains sorted by name (base chains last), elements by key. Nil
// if the table does not exist.
func (nf *Netfilter) Ruleset(fam nft.Family, name string) *nft.Ruleset {
	nf.mu.Lock()
	t := nf.tables[tableKey{fam, name}]
	nf.mu.Unlock()
	if t == nil {
		return nil
	}
	rs, _ := wire.Decode(t)
	return rs
}

// Render is the table in nft syntax (nft.Render of Ruleset); "" if it does not exist.
func (nf *Netfilter) Render(fam nft.Family, name string) string {
	rs := nf.Ruleset(fam, name)
	if rs == nil {
		return ""
	}
	return nft.Render(rs)
}

// Foreign commits a transaction of another process: edit gets the table as Ruleset
// returns it (an empty one if it does not exist) and changes it; the result is checked
// as any transaction and replaces the table. No Applier learns of it.
func (nf *Netfilter) Foreign(fam nft.Family, name string, edit func(rs *nft.Ruleset)) error {
	rs := nf.Ruleset(fam, name)
	if rs == nil {
		rs = &nft.Ruleset{Family: fam, Table: name}
	}
	edit(rs)
	st, err := wire.EncodeState(rs)
	if err != nil {
		return &kernel.RejectedError{Messages: 1, Err: fmt.Errorf("%w: %w", err, syscall.EINVAL)}
	}
	tx := &txn{nf: nf, staged: map[tableKey]*staged{}}
	nf.mu.Lock()
	defer nf.mu.Unlock()
	k := tableKey{fam, name}
	tx.staged[k] = &staged{t: st, sets: map[string]bool{}, chains: map[string]bool{}}
	if errs := tx.check(); len(errs) > 0 {
		return &kernel.RejectedError{Messages: 1, Err: errors.Join(errs...)}
	}
	nf.tables[k] = st
	nf.gen++
	return nil
}

// Transaction applies one batch's messages to a copy of the tables they touch and
// commits the copies if the kernel would (wire.Peer).
func (nf *Netfilter) Transaction(msgs []wire.Msg) []wire.MsgError {
	nf.mu.Lock()
	defer nf.mu.Unlock()
	tx := &txn{nf: nf, staged: map[tableKey]*staged{}, deleted: map[tableKey]bool{}}
	var errs []wire.MsgError
	for i, m := range msgs {
		if err := tx.apply(m); err != nil {
			errs = append(errs, wire.MsgError{Index: i, Err: err})
		}
	}
	if len(errs) == 0 {
		for _, err := range tx.check() {
			errs = append(errs, wire.MsgError{Index: len(msgs) - 1, Err: err})
		}
	}
	if len(errs) > 0 {
		return errs
	}
	for k := range tx.deleted {
		delete(nf.tables, k)
	}
	for k, s := range tx.staged {
		nf.tables[k] = s.t
	}
	nf.gen++
	return nil
}

// txn is a transaction being checked: copies of the tables it changes.
type txn struct {
	nf      *Netfilter
	staged  map[tableKey]*staged
	deleted map[tableKey]bool
}

// staged is a copy of one table: its maps are copies, and so are the chains and sets
// the transaction changed (cloned on their first change).
type staged struct {
	t              *wire.TableState
	chains, sets   map[string]bool // copied already
	gone, goneSets map[string]bool // chains and sets this transaction deleted
	goneFlowtables map[string]bool // flowtables this transaction deleted
}

// table returns the staged copy of a table; nil if it does not exist.
func (tx *txn) table(fam nft.Family, name string) *staged {
	k := tableKey{fam, name}
	if s := tx.staged[k]; s != nil {
		return s
	}
	t := tx.nf.tables[k]
	if t == nil || tx.deleted[k] {
		return nil
	}
	c := *t
	c.Chains, c.Sets, c.Flowtables = maps.Clone(t.Chains), maps.Clone(t.Sets), maps.Clone(t.Flowtables)
	s := &staged{t: &c, chains: map[string]bool{}, sets: map[string]bool{}}
	tx.staged[k] = s
	return s
}

// chain returns the table's chain, copied for changing; nil if absent.
func (s *staged) chain(name string) *wire.ChainState {
	c := s.t.Chains[name]
	if c == nil || s.chains[name] {
		return c
	}
	cc := *c
	cc.Rules = slices.Clone(c.Rules)
	s.t.Chains[name] = &cc
	s.chains[name] = true
	return &cc
}

// set returns the table's set, copied for changing; nil if absent.
func (s *staged) set(name string) *wire.SetState {
	st := s.t.Sets[name]
	if st == nil || s.sets[name] {
		return st
	}
	c := *st
	c.Elements = maps.Clone(st.Elements)
	s.t.Sets[name] = &c
	s.sets[name] = true
	return &c
}

func (s *staged) deleted(chain, set string) {
	if s.gone == nil {
		s.gone, s.goneSets = map[string]bool{}, map[string]bool{}
	}
	if chain != "" {
		s.gone[chain] = true
	}
	if set != "" {
		s.goneSets[set] = true
	}
}

// missing is the error of a reference to a set or chain that is not there: in use
// (EBUSY) if this transaction deletes it, no such object (ENOENT) otherwise.
func (s *staged) missing(set, chain string) error {
	if set != "" && s.goneSets[set] || chain != "" && s.gone[chain] {
		return syscall.EBUSY
	}
	return syscall.ENOENT
}

// apply applies one message to the staged tables, as the kernel does while it
// prepares a transaction.
func (tx *txn) apply(m wire.Msg) error {
	where := fmt.Sprintf("%s %s", m.Family, m.Table)
	if len(m.Table) > maxName || len(m.Name) > maxName {
		return fmt.Errorf("%s: name of %d bytes: %w", where, max(len(m.Table), len(m.Name)), syscall.ERANGE)
	}
	if m.Type == unix.NFT_MSG_NEWTABLE {
		if tx.table(m.Family, m.Table) == nil {
			k := tableKey{m.Family, m.Table}
			delete(tx.deleted, k)
			t := &wire.TableState{Family: m.Family, Name: m.Table, Exists: true,
				Chains: map[string]*wire.ChainState{}, Sets: map[string]*wire.SetState{}}
			tx.staged[k] = &staged{t: t, chains: map[string]bool{}, sets: map[string]bool{}}
		}
		return nil
	}
	s := tx.table(m.Family, m.Table)
	if s == nil {
		return fmt.Errorf("%s: no such table: %w", where, syscall.ENOENT)
	}
	switch m.Type {
	case unix.NFT_MSG_DELTABLE:
		k := tableKey{m.Family, m.Table}
		delete(tx.staged, k)
		tx.deleted[k] = true
	case unix.NFT_MSG_NEWCHAIN:
		c := *m.Chain
		if old := s.t.Chains[c.Name]; old != nil { // another process's chain of that name
			c.Rules = old.Rules
		}
		s.t.Chains[c.Name] = &c
		s.chains[c.Name] = false // the copy's rules are still shared
	case unix.NFT_MSG_NEWRULE:
		c := s.chain(m.Name)
		if c == nil {
			return fmt.Errorf("%s: rule for chain %s: %w", where, m.Name, syscall.ENOENT)
		}
		c.Rules = append(c.Rules, *m.Rule)
	case unix.NFT_MSG_DELRULE:
		c := s.chain(m.Name)
		if c == nil {
			return fmt.Errorf("%s: flushing chain %s: %w", where, m.Name, syscall.ENOENT)
		}
		c.Rules = nil
	case unix.NFT_MSG_DELCHAIN:
		if s.t.Chains[m.Name] == nil {
			return fmt.Errorf("%s: deleting chain %s: %w", where, m.Name, syscall.ENOENT)
		}
		delete(s.t.Chains, m.Name)
		s.deleted(m.Name, "")
	case unix.NFT_MSG_NEWSET:
		if old := s.t.Sets[m.Name]; old != nil {
			if !wire.SameSetDef(old, m.Set) {
				return fmt.Errorf("%s: adding set %s: it exists with another definition: %w", where, m.Name, syscall.EEXIST)
			}
			return nil
		}
		s.t.Sets[m.Name] = m.Set
		s.sets[m.Name] = true // parsed for this message: the transaction's own
	case unix.NFT_MSG_DELSET:
		if s.t.Sets[m.Name] == nil {
			return fmt.Errorf("%s: deleting set %s: %w", where, m.Name, syscall.ENOENT)
		}
		delete(s.t.Sets, m.Name)
		s.deleted("", m.Name)
	case unix.NFT_MSG_NEWSETELEM:
		set := s.set(m.Name)
		if set == nil {
			return fmt.Errorf("%s: elements for set %s: %w", where, m.Name, syscall.ENOENT)
		}
		var errs []error
		for _, e := range m.Elems {
			if err := fits(set, e); err != nil {
				errs = append(errs, fmt.Errorf("%s: set %s: element %s: %w", where, m.Name, wire.DataString(e.Key), err))
				continue
			}
			if old, ok := set.Elements[string(e.Key)]; ok && !sameValue(old, e) {
				errs = append(errs, fmt.Errorf("%s: set %s: adding element %s: it exists with another value: %w", where, m.Name, wire.DataString(e.Key), syscall.EEXIST))
				continue
			}
			set.Elements[string(e.Key)] = e
		}
		return errors.Join(errs...)
	case unix.NFT_MSG_DELSETELEM:
		set := s.set(m.Name)
		if set == nil {
			return fmt.Errorf("%s: deleting elements of set %s: %w", where, m.Name, syscall.ENOENT)
		}
		if len(m.Elems) == 0 { // a flush
			set.Elements = map[string]wire.ElemState{}
			return nil
		}
		var errs []error
		for _, e := range m.Elems {
			if _, ok := set.Elements[string(e.Key)]; !ok {
				errs = append(errs, fmt.Errorf("%s: set %s: deleting element %s: %w", where, m.Name, wire.DataString(e.Key), syscall.ENOENT))
				continue
			}
			delete(set.Elements, string(e.Key))
		}
		return errors.Join(errs...)
	case unix.NFT_MSG_NEWFLOWTABLE:
		ft := *m.Flowtable
		if old := s.t.Flowtables[ft.Name]; old != nil { // an update adds the devices it lacks
			if old.Hooknum != ft.Hooknum || old.Priority != ft.Priority {
				return fmt.Errorf("%s: flowtable %s: another hook: %w", where, ft.Name, syscall.EOPNOTSUPP)
			}
			ft.Devices = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(old.Devices), ft.Devices...))))
		}
		if s.t.Flowtables == nil {
			s.t.Flowtables = map[string]*wire.FlowtableState{}
		}
		s.t.Flowtables[ft.Name] = &ft
	case unix.NFT_MSG_DELFLOWTABLE:
		if s.t.Flowtables[m.Name] == nil {
			return fmt.Errorf("%s: deleting flowtable %s: %w", where, m.Name, syscall.ENOENT)
		}
		delete(s.t.Flowtables, m.Name)
		if s.goneFlowtables == nil {
			s.goneFlowtables = map[string]bool{}
		}
		s.goneFlowtables[m.Name] = true
	default:
		return fmt.Errorf("%s: message type %d: %w", where, m.Type, syscall.EOPNOTSUPP)
	}
	return nil
}

// fits checks an element against its set's key and value lengths and kind.
func fits(s *wire.SetState, e wire.ElemState) error {
	switch {
	case uint32(len(e.Key)) != s.KeyLen:
		return fmt.Errorf("a key of %d bytes in a set of %d-byte keys: %w", len(e.Key), s.KeyLen, syscall.EINVAL)
	case e.Verdict && !s.Verdicts():
		return fmt.Errorf("a verdict in a set without verdicts: %w", syscall.EINVAL)
	case s.Verdicts() && !e.Verdict:
		return fmt.Errorf("no verdict for a verdict map: %w", syscall.EINVAL)
	case s.IsMap() && !s.Verdicts() && uint32(len(e.Data)) != s.DataLen:
		return fmt.Errorf("a value of %d bytes in a map of %d-byte values: %w", len(e.Data), s.DataLen, syscall.EINVAL)
	}
	return nil
}

// sameValue: the kernel keeps an existing element when the value is the same (a
// comment or counter is not compared).
func sameValue(a, b wire.ElemState) bool {
	return string(a.Data) == string(b.Data) && a.Verdict == b.Verdict && a.VerdictCode == b.VerdictCode && a.VerdictChain == b.VerdictChain
}

// check validates the staged tables as the kernel does at commit: every reference from
// rules and verdict map elements to chains and sets, and no jump loop from a base chain.
func (tx *txn) check() []error {
	var errs []error
	for _, k := range slices.SortedFunc(maps.Keys(tx.staged), func(a, b tableKey) int {
		if a.fam != b.fam {
			return int(a.fam) - int(b.fam)
		}
		return cmpString(a.name, b.name)
	}) {
		errs = append(errs, tx.staged[k].check(k)...)
	}
	return errs
}

func (s *staged) check(k tableKey) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s: "+format, append([]any{k.fam, k.name}, args...)...))
	}
	t := s.t
	jumps := map[string][]string{} // chain → chains it may jump or go to
	for _, name := range slices.Sorted(maps.Keys(t.Sets)) {
		set := t.Sets[name]
		if !set.Verdicts() {
			continue
		}
		var dangling []string // sorted only when there are some
		for kb, e := range set.Elements {
			if c := e.VerdictChain; c != "" && t.Chains[c] == nil {
				dangling = append(dangling, kb)
			}
		}
		slices.Sort(dangling)
		for _, kb := range dangling {
			c := set.Elements[kb].VerdictChain
			fail("set %s: element %s: to chain %s: %w", name, wire.DataString([]byte(kb)), c, s.missing("", c))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.Chains)) {
		for i, r := range t.Chains[name].Rules {
			chains, sets, fts := wire.RuleRefsAll(r)
			for _, ft := range fts {
				if t.Flowtables[ft] == nil {
					err := error(syscall.ENOENT)
					if s.goneFlowtables[ft] {
						err = syscall.EBUSY
					}
					fail("chain %s rule %d: flowtable @%s: %w", name, i, ft, err)
				}
			}
			for _, target := range chains {
				if t.Chains[target] == nil {
					fail("chain %s rule %d: jump to chain %s: %w", name, i, target, s.missing("", target))
				}
				jumps[name] = append(jumps[name], target)
			}
			for _, ref := range sets {
				set := t.Sets[ref.Set]
				switch {
				case set == nil:
					fail("chain %s rule %d: set @%s: %w", name, i, ref.Set, s.missing(ref.Set, ""))
				case ref.Verdicts && !set.Verdicts(), ref.Values && (!set.IsMap() || set.Verdicts()):
					fail("chain %s rule %d: @%s: not a map of that kind: %w", name, i, ref.Set, syscall.EINVAL)
				case ref.Update && !set.Dynamic():
					fail("chain %s rule %d: update @%s: not a dynamic set: %w", name, i, ref.Set, syscall.EOPNOTSUPP)
				case ref.Verdicts:
					for _, e := range set.Elements {
						if e.VerdictChain != "" {
							jumps[name] = append(jumps[name], e.VerdictChain)
						}
					}
				}
			}
		}
	}
	var bases []string
	for name, c := range t.Chains {
		if c.Hook != nil {
			bases = append(bases, name)
		}
	}
	if loop := findLoop(jumps, bases); loop != "" {
		fail("jump loop through chain %s: %w", loop, syscall.EMLINK)
	}
	return errs
}

// findLoop returns a chain on a cycle of jumps reachable from the base chains, "" if
// there is none. (The kernel checks for loops from the base chains: a cycle among
// chains no base chain reaches is accepted.)
func findLoop(jumps map[string][]string, bases []string) string {
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var visit func(c string) string
	visit = func(c string) string {
		switch state[c] {
		case onPath:
			return c
		case done:
			return ""
		}
		state[c] = onPath
		for _, next := range jumps[c] {
			if l := visit(next); l != "" {
				return l
			}
		}
		state[c] = done
		return ""
	}
	slices.Sort(bases)
	for _, c := range bases {
		if l := visit(c); l != "" {
			return l
		}
	}
	return ""
}
