// Package kernel programs nf_tables: an Applier remembers the rulesets it last wrote,
// diffs each new one against them (parts by the ruleset's change set, nft.PartChanges,
// or by identity; set elements by key) and sends the difference as ONE transaction,
// which the kernel commits atomically or not at all;
// after a refusal it undoes its bookkeeping, so the next attempt is still a delta. It
// also answers queries about the kernel: the tables present (Tables), counters
// (CountersByOwner, SetCounts, RuleCounts), the running release and the nf_tables
// features nftproxy needs (features.go). Messages are encoded by nft/wire. What was
// last applied is published as an immutable snapshot (Applied); WithPeer puts an
// in-process nf_tables (nft/fake) in place of the kernel.
package kernel

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// Applier writes rulesets to the kernel. It remembers what it last wrote successfully, so
// that a sync sends only the difference; after an error, or when asked to resync, the
// next Apply reads the table's object names from the kernel and rewrites everything (still
// in one transaction). An Applier must be used by one goroutine at a time (monitors
// given it with monitor.IgnoreWritesOf may run beside it).
//
// It writes on one netlink socket that stays open between transactions (see own.go:
// that is how nft/monitor tells its transactions from everyone else's); Close closes it.
type Applier struct {
	netns int       // fd of the target network namespace, or 0 for the current one
	peer  wire.Peer // in place of the kernel (WithPeer); nil: the kernel
	prev  map[tableKey]*state
	conn  *netlink.Conn // the write socket; nil until the first transaction or after a failure
	port  uint32        // its port id
	own   sockets       // every write socket's port and generations, for Monitors

	published atomic.Pointer[Applied] // the rulesets last written (Applied, CountersByOwner)
	indexMu   sync.Mutex
	index     map[tableKey]*ownerIndex // CountersByOwner's attribution, by table
}

type tableKey struct {
	fam  nft.Family
	name string
}

// state is the last ruleset known to be in the kernel, indexed for diffing. The
// ruleset's own chains and sets are indexed by name; its parts (nft.Part) by owner, and
// every element of every set, from the ruleset or a part, by set and encoded key, with
// the number of contributions (two parts may add the same key).
type state struct {
	rs     *nft.Ruleset
	sets   map[string]*nft.Set   // the ruleset's and its parts' sets
	chains map[string]*nft.Chain // the ruleset's own chains (parts keep theirs)
	parts  map[string]*nft.Part
	elems  map[string]setIndex // set → key → element (index.go)
	// caps: the capacity each set was created with (capacity.go); absent: unsized.
	// unsized: sets a sync would have overfilled, left unsized by full writes until
	// a full write from the kernel's names (a resync).
	caps    map[string]uint32
	unsized map[string]bool
	// flowtables: the names of the flowtables of a state read from the kernel (a known
	// state's are its ruleset's)
	flowtables map[string]bool
	// known is false for a state read from the kernel: only names, content unknown
	known bool
	// distrust is set when a refused transaction's undo restored the state: the next
	// diff compares every part rather than trust a ruleset's change set
	distrust bool
}

// undo restores a state that diffParts updated in place, after the kernel refused the
// transaction (and so kept the table as it was).
type undo struct {
	st     *state
	rs     *nft.Ruleset
	sets   map[string]*nft.Set
	chains map[string]*nft.Chain
	parts  map[string]*nft.Part // owner → part before (nil: none)
	caps   map[string]uint32
	d      *elemDelta
}

func (u *undo) part(owner string) {
	if _, seen := u.parts[owner]; !seen {
		u.parts[owner] = u.st.parts[owner]
	}
}

func (u *undo) apply() {
	st := u.st
	st.rs, st.sets, st.chains, st.caps = u.rs, u.sets, u.chains, u.caps
	st.distrust = true
	for owner, p := range u.parts {
		if p == nil {
			delete(st.parts, owner)
		} else {
			st.parts[owner] = p
		}
	}
	for set, keys := range u.d.before {
		m := st.elems[set]
		for kb, was := range keys {
			k := keyOf(kb)
			switch {
			case was != nil && m == nil: // emit dropped the set's index
				m = newIndex(k.n, len(keys))
				st.elems[set] = m
				fallthrough
			case was != nil:
				m.put(&k, *was)
			case m != nil:
				m.del(&k)
			}
		}
		if m != nil && m.len() == 0 {
			delete(st.elems, set)
		}
	}
}

// RejectedError is the kernel's refusal of a transaction: it applied none of it, so the
// table is exactly as before.
type RejectedError = wire.RejectedError

// Option configures an Applier.
type Option func(*Applier)

// WithNetNS makes the Applier program the network namespace open at fd.
func WithNetNS(fd int) Option { return func(a *Applier) { a.netns = fd } }

// WithPeer makes the Applier talk to p instead of the kernel: every connection it
// opens is wire.DialPeer(p), which carries the same messages (nft/fake is such a peer).
func WithPeer(p wire.Peer) Option { return func(a *Applier) { a.peer = p } }

// dial opens a connection to nf_tables: a socket in the Applier's namespace, or to its
// peer.
func (a *Applier) dial() (*netlink.Conn, error) {
	if a.peer != nil {
		return wire.DialPeer(a.peer), nil
	}
	return wire.Dial(a.netns)
}

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
	Encode   time.Duration // diffing against the previous state and encoding, before the send
	Kernel   time.Duration // time from send to the kernel's last answer
	// KernelCPU is the sending thread's CPU time over the same span: nf_tables processes
	// a batch, commit included, in the sender's sendmsg, so this is the kernel's work on
	// the transaction (plus reading the answers) without the waits for a core — a
	// process descheduled, or held back by its own garbage collector, shows those waits
	// in Kernel only.
	KernelCPU time.Duration
	// Overfilled names the sets this sync would have taken past their capacity: the
	// table was written anew with them resizable (capacity.go).
	Overfilled []string
}

// Resync makes the next Apply rewrite the whole table from scratch, correcting any drift
// between the kernel and what the Applier believes is there.
func (a *Applier) Resync() { a.prev = map[tableKey]*state{} }

// Apply makes the kernel's tables equal to the given rulesets in one transaction.
func (a *Applier) Apply(rulesets ...*nft.Ruleset) (Stats, error) {
	var st Stats
	encodeStart := time.Now()
	conn, err := a.writer()
	if err != nil {
		return st, err
	}
	var batches []*wire.Batch
	next := map[tableKey]*state{}
	var undos []func()
	for _, rs := range rulesets {
		k := tableKey{rs.Family, rs.Table}
		prev := a.prev[k]
		delete(a.prev, k) // diff updates prev into the new state; an error leaves nothing behind
		if prev == nil {
			st.Full = true
			prev, err = a.kernelState(rs.Family, rs.Table)
			if err != nil {
				return st, err
			}
		}
		b := wire.NewBatch(rs.Family, rs.Table)
		if n := len(batches); n > 0 {
			b.ContinueIDs(batches[n-1])
		}
		cur, full, u, err := diff(b, prev, rs, &st)
		if err != nil {
			a.Resync()
			return st, err
		}
		if u != nil {
			undos = append(undos, func() { u.apply(); a.prev[k] = u.st })
		}
		st.Full = st.Full || full
		batches = append(batches, b)
		next[k] = cur
	}
	all := wire.Merge(batches...)
	st.Messages, st.Bytes = all.Msgs(), all.Bytes()
	st.Encode = time.Since(encodeStart)
	runtime.LockOSThread() // the thread's CPU clock must be the one that sends
	start, cpu := time.Now(), threadCPU()
	err = all.Send(conn)
	st.Kernel, st.KernelCPU = time.Since(start), threadCPU()-cpu
	runtime.UnlockOSThread()
	if err != nil {
		_ = a.retire() // its receive queue may hold stale answers
		var rejected *RejectedError
		a.Resync()
		if errors.As(err, &rejected) && len(undos) == len(rulesets) {
			// the kernel applied nothing: the previous states are still true
			for _, u := range undos {
				u()
			}
		}
		return st, err
	}
	for k, s := range next {
		a.prev[k] = s
	}
	a.publish()
	return st, nil
}

// publish makes the rulesets in a.prev visible to Applied and CountersByOwner.
func (a *Applier) publish() {
	rss := make([]*nft.Ruleset, 0, len(a.prev))
	for _, s := range a.prev {
		if s.rs != nil {
			rss = append(rss, s.rs)
		}
	}
	a.published.Store(AppliedOf(rss...))
}

// Delete removes the given tables if they exist, in one transaction.
func (a *Applier) Delete(fam nft.Family, tables ...string) error {
	a.Resync()
	existing, err := a.tableNames(fam)
	if err != nil {
		return err
	}
	b := wire.NewBatch(fam, "")
	for _, t := range tables {
		if slices.Contains(existing, t) {
			b.SetTable(t)
			b.DelTable()
		}
	}
	conn, err := a.writer()
	if err != nil {
		return err
	}
	if err := b.Send(conn); err != nil {
		_ = a.retire()
		return err
	}
	return nil
}

func (a *Applier) tableNames(fam nft.Family) ([]string, error) {
	c, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return wire.TableNames(c, fam)
}

// kernelState reads the names of the chains and sets the table has now. Their content is
// unknown, so diff rewrites every one of them.
func (a *Applier) kernelState(fam nft.Family, table string) (*state, error) {
	st := newState(nil)
	c, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	names, err := wire.TableNames(c, fam)
	if err != nil || !slices.Contains(names, table) {
		return st, err
	}
	chains, err := wire.ChainNames(c, fam)
	if err != nil {
		return nil, err
	}
	for _, name := range chains[table] {
		st.chains[name] = nil // present, content unknown
	}
	sets, err := wire.SetNames(c, fam, table)
	if err != nil {
		return nil, err
	}
	for _, name := range sets {
		st.sets[name] = nil // present, definition unknown
	}
	fts, err := wire.FlowtableNames(c, fam, table)
	if err != nil {
		return nil, err
	}
	for _, name := range fts {
		st.flowtables[name] = true
	}
	return st, nil
}

func newState(rs *nft.Ruleset) *state {
	return &state{rs: rs, sets: map[string]*nft.Set{}, chains: map[string]*nft.Chain{}, parts: map[string]*nft.Part{},
		elems: map[string]setIndex{}, caps: map[string]uint32{}, flowtables: map[string]bool{}}
}

// flowtableNames are the flowtables st knows are in the kernel.
func (st *state) flowtableNames() map[string]bool {
	out := maps.Clone(st.flowtables)
	if st.rs != nil {
		for _, ft := range st.rs.Flowtables {
			out[ft.Name] = true
		}
	}
	return out
}

// names returns a state with st's set and chain names and unknown content: diffing
// against it rewrites everything.
func (st *state) names() *state {
	out := newState(nil)
	out.flowtables = st.flowtableNames()
	for name := range st.sets {
		out.sets[name] = nil
	}
	for name := range st.chains {
		out.chains[name] = nil
	}
	for _, p := range st.parts {
		for _, c := range p.Chains {
			out.chains[c.Name] = nil
		}
	}
	return out
}

// elemDelta tracks how a sync changes the elements of the sets it touches: the state of
// each touched key before, so that only real changes reach the kernel.
type elemDelta struct {
	st     *state
	before map[string]map[string]*refElem // set → key bytes → a copy of the entry before (nil: absent)
	// scratch for add and remove: declared in them, both escaped to the heap (through
	// the interfaces they are passed to) on every call, 20 MB in a 10k cold sync
	k   elemKey
	buf nft.ElementBuf
}

// maps returns the element index of set s and the map of its keys' states before this
// sync.
func (d *elemDelta) maps(s *nft.Set) (m setIndex, bm map[string]*refElem) {
	m = d.st.elems[s.Name]
	if m == nil {
		m = newIndex(wire.KeyLen(s.Key), 0)
		d.st.elems[s.Name] = m
	}
	bm = d.before[s.Name]
	if bm == nil {
		bm = map[string]*refElem{}
		d.before[s.Name] = bm
	}
	return m, bm
}

// key encodes the key of e, an element of set s, into k, and checks that it has the
// length of the set's index m.
func key(k *elemKey, m setIndex, s *nft.Set, e *nft.Element) error {
	if err := k.encode(s, e.Key); err != nil {
		return fmt.Errorf("set %s: %w", s.Name, err)
	}
	if k.n != m.keyLen() {
		return fmt.Errorf("set %s: key of %d bytes in an index of %d-byte keys", s.Name, k.n, m.keyLen())
	}
	return nil
}

// note records key's state before its first change in this sync.
func note(m setIndex, bm map[string]*refElem, key *elemKey) {
	if bm == nil {
		return
	}
	if _, seen := bm[string(key.bytes())]; seen {
		return
	}
	if e, ok := m.get(key); ok {
		bm[string(key.bytes())] = &e
	} else {
		bm[string(key.bytes())] = nil
	}
}

// ownElements are the elements of a ruleset's own set s, as the index refers to them.
func ownElements(s *nft.Set) *nft.SetElements {
	return &nft.SetElements{Set: s.Name, Elements: s.Elements}
}

// add counts one contribution of se's elements to set s. se must be the ruleset's or
// part's own (not a copy): rulesets are never modified once built, and the index
// refers to elements by their position in it.
func (d *elemDelta) add(s *nft.Set, se *nft.SetElements) error {
	n := se.Len()
	if n == 0 {
		return nil // an untouched set stays out of the sync's work (emit walks touched sets)
	}
	m, bm := d.maps(s)
	k, buf := &d.k, &d.buf
	for i := range n {
		if err := key(k, m, s, se.At(i, buf)); err != nil {
			return err
		}
		note(m, bm, k)
		cur, _ := m.get(k) // zero when absent
		// parts share a key only with identical elements; should two differ, the last
		// one counted wins rather than a stale one
		cur.se, cur.i = se, int32(i)
		cur.refs++
		m.put(k, cur)
	}
	return nil
}

// remove takes back one contribution of se's elements to set s.
func (d *elemDelta) remove(s *nft.Set, se *nft.SetElements) error {
	n := se.Len()
	if n == 0 {
		return nil
	}
	m, bm := d.maps(s)
	k, buf := &d.k, &d.buf
	for i := range n {
		if err := key(k, m, s, se.At(i, buf)); err != nil {
			return err
		}
		note(m, bm, k)
		if cur, ok := m.get(k); ok {
			if cur.refs--; cur.refs <= 0 {
				m.del(k)
			} else {
				m.put(k, cur)
			}
		}
	}
	return nil
}

// plan is a diff's work, emitted in an order the kernel accepts within one transaction.
type plan struct {
	flushSets   []string
	flushChains []string
	goneSets    []string
	newSets     []*nft.Set
	newChains   []*nft.Chain
	refill      []*nft.Chain
	goneChains  []string
	// flowtables: every flowtable of the ruleset is sent (created, or given the devices
	// it lacks); gone ones are deleted once no rule refers to them
	flowtables     []*nft.Flowtable
	goneFlowtables []string
	recreated      map[string]bool // sets deleted and created anew: their elements are all added
	// a full write's element messages, made by fillFresh, and how many elements they add
	fresh         []*wire.Batch
	freshElements int
}

// diff appends to b the messages that turn prev into rs and returns the new state (prev,
// updated in place). When prev's content is known and no shared set's definition
// changed, only the parts that are not identical to prev's are looked at; otherwise the
// whole table is rewritten (full).
// The undo it returns, when not nil, restores prev after the kernel refused the
// transaction.
func diff(b *wire.Batch, prev *state, rs *nft.Ruleset, st *Stats) (cur *state, full bool, u *undo, err error) {
	var unsized map[string]bool
	if prev.known && sameSetDefs(prev, rs) {
		u = &undo{st: prev, rs: prev.rs, sets: maps.Clone(prev.sets), chains: prev.chains, parts: map[string]*nft.Part{},
			caps: maps.Clone(prev.caps)}
		err = diffParts(b, prev, rs, st, u)
		var over *overCapacity
		if err == nil {
			return prev, false, u, nil
		}
		u.apply()
		if !errors.As(err, &over) {
			return prev, false, nil, err
		}
		// written anew, with that set resizable (capacity.go)
		unsized = maps.Clone(prev.unsized)
		if unsized == nil {
			unsized = map[string]bool{}
		}
		unsized[over.set] = true
		st.Overfilled = append(st.Overfilled, over.set)
	}
	if prev.known { // a known state whose shared sets changed (or one overfilled): rewrite it all
		if unsized == nil {
			unsized = prev.unsized
		}
		prev = prev.names()
	}
	cur = newState(rs)
	cur.known = true
	cur.unsized = unsized
	return cur, true, nil, diffFull(b, prev, cur, st)
}

// sameSetDefs reports whether every set of rs that prev has is defined as in prev.
func sameSetDefs(prev *state, rs *nft.Ruleset) bool {
	for _, s := range rs.Sets {
		if old, had := prev.sets[s.Name]; had && !sameSetDef(old, s) {
			return false
		}
	}
	return true
}

// diffFull rewrites every object of cur that prev does not know the content of: prev
// holds only names (from the kernel, or from a state that had to be given up).
func diffFull(b *wire.Batch, prev, cur *state, st *Stats) error {
	d := &elemDelta{st: cur} // for emit: a full write's elements are in pl.fresh
	pl := &plan{recreated: map[string]bool{}}
	setsOf := func(rs *nft.Ruleset) []*nft.Set {
		out := append([]*nft.Set(nil), rs.Sets...)
		for _, p := range rs.Parts {
			out = append(out, p.Sets...)
		}
		return out
	}
	byName := map[string]*nft.Set{}
	for _, s := range setsOf(cur.rs) {
		byName[s.Name] = s
		cur.sets[s.Name] = s
		if _, had := prev.sets[s.Name]; had {
			pl.goneSets = append(pl.goneSets, s.Name)
		}
		pl.newSets = append(pl.newSets, s)
		pl.recreated[s.Name] = true
	}
	for name := range prev.sets {
		if byName[name] == nil {
			pl.goneSets = append(pl.goneSets, name)
		}
	}
	var err error
	if pl.fresh, pl.freshElements, err = fillFresh(cur, byName); err != nil {
		return err
	}
	for _, s := range cur.rs.Sets {
		if m := cur.elems[s.Name]; m != nil && m.len() >= presizeMin && !s.Dynamic && !s.Interval && s.Size == 0 && !cur.unsized[s.Name] {
			cur.caps[s.Name] = capacityFor(m.len())
		}
	}
	all := append([]*nft.Chain(nil), cur.rs.Chains...)
	for _, c := range cur.rs.Chains {
		cur.chains[c.Name] = c
	}
	for _, p := range cur.rs.Parts {
		cur.parts[p.Owner] = p
		all = append(all, p.Chains...)
	}
	seen := map[string]bool{}
	for _, c := range all {
		seen[c.Name] = true
		if _, had := prev.chains[c.Name]; had {
			pl.flushChains = append(pl.flushChains, c.Name)
		} else {
			pl.newChains = append(pl.newChains, c)
		}
		pl.refill = append(pl.refill, c)
	}
	for name := range prev.chains {
		if !seen[name] {
			pl.flushChains = append(pl.flushChains, name)
			pl.goneChains = append(pl.goneChains, name)
		}
	}
	pl.planFlowtables(prev.flowtableNames(), cur.rs)
	return pl.emit(b, d, byName, st)
}

// planFlowtables sends every flowtable of rs and deletes those of had that rs lacks.
func (pl *plan) planFlowtables(had map[string]bool, rs *nft.Ruleset) {
	pl.flowtables = rs.Flowtables
	for _, ft := range rs.Flowtables {
		delete(had, ft.Name)
	}
	pl.goneFlowtables = slices.Sorted(maps.Keys(had))
}

// diffParts diffs prev, whose content is known, against rs: the ruleset's own chains and
// sets by name and content, its parts by its change set (trustedChanges) or by identity.
func diffParts(b *wire.Batch, prev *state, rs *nft.Ruleset, st *Stats, u *undo) error {
	d := &elemDelta{st: prev, before: map[string]map[string]*refElem{}}
	u.d = d
	pl := &plan{recreated: map[string]bool{}}
	oldRS := prev.rs
	byName := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		byName[s.Name] = s
	}
	oldByName := map[string]*nft.Set{}
	for _, s := range oldRS.Sets {
		oldByName[s.Name] = s
	}

	// the ruleset's own sets: new ones, gone ones (same definitions: checked by diff)
	for _, s := range rs.Sets {
		if _, had := oldByName[s.Name]; !had {
			pl.newSets = append(pl.newSets, s)
			pl.recreated[s.Name] = true
		}
		prev.sets[s.Name] = s
	}
	for _, s := range oldRS.Sets {
		if byName[s.Name] == nil {
			pl.goneSets = append(pl.goneSets, s.Name)
			delete(prev.sets, s.Name)
		}
	}
	// their own elements: taken back and counted again (few, in a ruleset with parts)
	for _, s := range oldRS.Sets {
		if err := d.remove(s, ownElements(s)); err != nil {
			return err
		}
	}
	for _, s := range rs.Sets {
		if err := d.add(s, ownElements(s)); err != nil {
			return err
		}
	}
	// the ruleset's own chains
	for _, c := range rs.Chains {
		old, had := prev.chains[c.Name]
		switch {
		case !had:
			pl.newChains = append(pl.newChains, c)
			pl.refill = append(pl.refill, c)
		case !reflect.DeepEqual(old.Rules, c.Rules) || !reflect.DeepEqual(old.Hook, c.Hook):
			pl.flushChains = append(pl.flushChains, c.Name)
			pl.refill = append(pl.refill, c)
		}
	}
	curChains := make(map[string]*nft.Chain, len(rs.Chains))
	for _, c := range rs.Chains {
		curChains[c.Name] = c
	}
	for name := range prev.chains {
		if curChains[name] == nil {
			pl.flushChains = append(pl.flushChains, name)
			pl.goneChains = append(pl.goneChains, name)
		}
	}
	prev.chains = curChains

	// parts: identical ones are skipped; changed, new and gone ones are diffed. The
	// ruleset's change set names them when it was derived from the one in prev;
	// otherwise every part is compared by identity.
	changed, trusted := trustedChanges(prev, rs)
	if !trusted {
		changed = changedParts(prev, rs)
	}
	// all old elements are taken back before new ones are counted: a key that moves
	// from one part to another (a node port changing hands) must end with the new element
	for _, ch := range changed {
		if ch[0] != nil {
			if err := d.removeElements(oldByName, byName, ch[0]); err != nil {
				return err
			}
		}
	}
	for _, ch := range changed {
		if ch[0] != nil {
			u.part(ch[0].Owner)
		}
		if ch[1] != nil {
			u.part(ch[1].Owner)
		}
		if err := pl.part(d, prev, byName, ch[0], ch[1]); err != nil {
			return err
		}
	}
	for _, s := range pl.newSets { // created by this sync: unsized (a part's replaced set too)
		delete(prev.caps, s.Name)
	}
	for _, name := range pl.goneSets {
		if !pl.recreated[name] {
			delete(prev.caps, name)
		}
	}
	if over := checkCapacity(prev, d.before); over != nil {
		return over
	}
	pl.planFlowtables(prev.flowtableNames(), rs)
	prev.rs = rs
	prev.distrust = false
	return pl.emit(b, d, byName, st)
}

// changedParts compares every part of rs with prev's by identity and returns those
// that differ (old: nil when new; new: nil when gone).
func changedParts(prev *state, rs *nft.Ruleset) [][2]*nft.Part {
	same := 0
	var changed [][2]*nft.Part
	for _, p := range rs.Parts {
		old := prev.parts[p.Owner]
		if old == p {
			same++
			continue
		}
		if old != nil {
			same++ // counted as present in both
		}
		changed = append(changed, [2]*nft.Part{old, p})
	}
	if same < len(prev.parts) {
		cur := make(map[string]bool, len(rs.Parts))
		for _, p := range rs.Parts {
			cur[p.Owner] = true
		}
		for owner, old := range prev.parts {
			if !cur[owner] {
				changed = append(changed, [2]*nft.Part{old, nil})
			}
		}
	}
	return changed
}

// trustedChanges returns the parts that differ between prev and rs (old: nil when new;
// new: nil when gone), in owner order, from rs's change set (nft.PartChanges) when it
// describes the changes since prev's ruleset, and reports whether it did. It does not
// trust a change set after a refused transaction (prev.distrust), nor one whose counts
// do not add up to rs's parts.
func trustedChanges(prev *state, rs *nft.Ruleset) ([][2]*nft.Part, bool) {
	cs := rs.Changes
	if prev.distrust || !rs.DerivedFrom(prev.rs) {
		return nil, false
	}
	owners := slices.Sorted(maps.Keys(cs.Parts))
	changed := make([][2]*nft.Part, 0, len(owners))
	n := len(prev.parts)
	for _, owner := range owners {
		old, p := prev.parts[owner], cs.Parts[owner]
		if p != nil && p.Owner != owner {
			return nil, false
		}
		if old == p {
			continue
		}
		switch {
		case old == nil:
			n++
		case p == nil:
			n--
		}
		changed = append(changed, [2]*nft.Part{old, p})
	}
	if n != len(rs.Parts) {
		return nil, false // not the change set of these parts: compare them all
	}
	return changed, true
}

// removeElements takes back the elements a part contributed.
func (d *elemDelta) removeElements(oldSets, sets map[string]*nft.Set, old *nft.Part) error {
	for i := range old.Elements {
		se := &old.Elements[i]
		s := oldSets[se.Set]
		if s == nil {
			s = sets[se.Set] // same definition (checked), set kept or gone
		}
		if s == nil { // the part's own set (a source-range set)
			if i := slices.IndexFunc(old.Sets, func(o *nft.Set) bool { return o.Name == se.Set }); i >= 0 {
				s = old.Sets[i]
			}
		}
		if s == nil {
			return fmt.Errorf("part %s: elements for set %s, which the ruleset does not define", old.Owner, se.Set)
		}
		if err := d.remove(s, se); err != nil {
			return err
		}
	}
	return nil
}

// part plans the change of one part from old to p (either may be nil); old's elements
// have been taken back already.
func (pl *plan) part(d *elemDelta, st *state, sets map[string]*nft.Set, old, p *nft.Part) error {
	oldChains := map[string]*nft.Chain{}
	oldPartSets := map[string]*nft.Set{}
	if old != nil {
		for _, s := range old.Sets {
			oldPartSets[s.Name] = s
		}
		for _, c := range old.Chains {
			oldChains[c.Name] = c
		}
		delete(st.parts, old.Owner)
	}
	refillAll := false // a replaced set is referenced by this part's rules only
	if p != nil {
		for _, s := range p.Sets {
			o := oldPartSets[s.Name]
			delete(oldPartSets, s.Name)
			switch {
			case o == nil:
				pl.newSets = append(pl.newSets, s)
				pl.recreated[s.Name] = true
			case !sameSetDef(o, s):
				pl.goneSets = append(pl.goneSets, s.Name)
				pl.newSets = append(pl.newSets, s)
				pl.recreated[s.Name] = true
				refillAll = true
			case s.Dynamic && o.Epoch != s.Epoch:
				pl.flushSets = append(pl.flushSets, s.Name)
			}
			st.sets[s.Name] = s
			sets[s.Name] = s
		}
		for i := range p.Elements {
			se := &p.Elements[i]
			s := sets[se.Set]
			if s == nil {
				return fmt.Errorf("part %s: elements for set %s, which the ruleset does not define", p.Owner, se.Set)
			}
			if err := d.add(s, se); err != nil {
				return err
			}
		}
		for _, c := range p.Chains {
			o, had := oldChains[c.Name]
			delete(oldChains, c.Name)
			switch {
			case !had:
				pl.newChains = append(pl.newChains, c)
				pl.refill = append(pl.refill, c)
			case refillAll || !reflect.DeepEqual(o.Rules, c.Rules) || !reflect.DeepEqual(o.Hook, c.Hook):
				pl.flushChains = append(pl.flushChains, c.Name)
				pl.refill = append(pl.refill, c)
			}
		}
		st.parts[p.Owner] = p
	}
	for name := range oldChains {
		pl.flushChains = append(pl.flushChains, name)
		pl.goneChains = append(pl.goneChains, name)
	}
	for name := range oldPartSets {
		pl.goneSets = append(pl.goneSets, name)
		delete(st.sets, name)
	}
	return nil
}

// emit appends the plan's messages to b: objects are created before anything refers to
// them, and references are removed before what they refer to is deleted.
func (pl *plan) emit(b *wire.Batch, d *elemDelta, sets map[string]*nft.Set, st *Stats) error {
	var errs []error
	try := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	b.AddTable()
	gone := map[string]bool{}
	for _, name := range pl.goneSets {
		gone[name] = true
	}
	// element changes of the touched keys, by set in a stable order
	setNames := make([]string, 0, len(d.before))
	for name := range d.before {
		setNames = append(setNames, name)
	}
	del := map[string][]elemRef{}
	add := map[string][]elemRef{}
	var bufA, bufB nft.ElementBuf
	slices.Sort(setNames)
	for _, name := range setNames { // (none in a full write: its elements are in pl.fresh)
		now, s := d.st.elems[name], sets[name]
		for kb, was := range d.before[name] {
			k := keyOf(kb)
			is, ok := now.get(&k)
			// a key that stays: changed when its element differs from the one before
			// (the same element, unless this sync added it again)
			changed := func() bool {
				return is.ref() != was.ref() && !sameValue(s, is.ref().elem(&bufA), was.ref().elem(&bufB))
			}
			if was != nil && !pl.recreated[name] && !gone[name] && (!ok || changed()) {
				del[name] = append(del[name], was.ref())
			}
			if ok && (was == nil || pl.recreated[name] || changed()) {
				add[name] = append(add[name], is.ref())
			}
		}
		if now.len() == 0 || gone[name] && !pl.recreated[name] {
			delete(d.st.elems, name)
		}
	}
	// 1. element deletions in kept sets (they may refer to chains about to go); learned
	// entries of dynamic sets are dropped when the set's epoch changes
	for _, name := range setNames {
		if es := del[name]; len(es) > 0 {
			st.Elements += len(es)
			try(b.ElemsOf(sets[name], len(es), func(i int) *nft.Element { return es[i].elem(&bufA) }, true))
		}
	}
	for _, name := range pl.flushSets {
		b.FlushSet(name)
	}
	// 2. flush rules of chains that change or go
	for _, name := range pl.flushChains {
		b.FlushChain(name)
	}
	// 3. sets and flowtables that go or are replaced, now that no rule refers to them
	for _, name := range pl.goneSets {
		b.DelSet(name)
	}
	for _, name := range pl.goneFlowtables {
		b.DelFlowtable(name)
	}
	// 4. new sets, flowtables (created, or told the devices they lack: a device that
	// appeared since the last sync), new chains
	for _, s := range pl.newSets {
		b.AddSet(withCapacity(s, d.st.caps[s.Name]))
	}
	for _, ft := range pl.flowtables {
		b.AddFlowtable(ft)
	}
	for _, c := range pl.newChains {
		b.AddChain(c)
	}
	// 5. rules (they refer to sets and chains, all created by now), then elements (they
	// may refer to the new chains). Rules go first: a rule that looks up a map binds it,
	// and the kernel walks all of a map's elements when it is bound (nf_tables_bind_set,
	// once per chain), so binding a map filled with hundreds of thousands of endpoint
	// entries from each of the lb tree's 128 leaf chains took seconds; an element added
	// to a bound map is checked against each binding, which is cheap.
	for _, c := range pl.refill {
		for _, r := range c.Rules {
			try(b.AddRule(c.Name, r))
		}
	}
	for _, name := range setNames {
		if es := add[name]; len(es) > 0 {
			st.Elements += len(es)
			try(b.ElemsOf(sets[name], len(es), func(i int) *nft.Element { return es[i].elem(&bufA) }, false))
		}
	}
	for _, fb := range pl.fresh {
		b.Append(fb)
	}
	st.Elements += pl.freshElements
	// 6. chains that are gone
	slices.Sort(pl.goneChains)
	for _, name := range pl.goneChains {
		b.DelChain(name)
	}
	st.Chains += len(pl.refill) + len(pl.goneChains)
	return errors.Join(errs...)
}

// sameSetDef reports whether two sets have the same type, flags and comment.
func sameSetDef(a, b *nft.Set) bool {
	return a != nil && b != nil && a.Comment == b.Comment &&
		a.Dynamic == b.Dynamic && a.Timeout == b.Timeout && a.Size == b.Size && a.Counter == b.Counter &&
		a.Interval == b.Interval && slices.Equal(a.Key, b.Key) && slices.Equal(a.Data, b.Data)
}

// threadCPU is the calling thread's CPU time (0 if the clock cannot be read).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
