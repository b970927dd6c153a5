// Package fake is an in-memory nf_tables for tests that run without root: Applier
// stands in for nft/kernel's Applier with the kernel's commit semantics. A transaction
// (one Apply) is checked as the kernel checks it and committed as a whole or not at
// all; what the fake holds can be read back (Ruleset, Render) and changed behind the
// applier's back as another process would (Foreign).
//
// Like the real Applier, it remembers what it last wrote and sends only the
// difference: an element or chain it believes is there and is not (another process
// removed it) makes the next delta fail, as it does in the kernel, until Resync makes
// the next Apply rewrite the table.
//
// Refused, with kernel.RejectedError and the errno the kernel gives: a jump or goto to a
// chain that does not exist (ENOENT), a lookup, verdict map, dnat map or set update of a
// set that does not exist (ENOENT), an element for a set the ruleset does not define
// (ENOENT), an element whose key or value does not fit the set's types (EINVAL), a
// verdict map lookup of a set without verdicts (EINVAL), an update of a set that is not
// dynamic (EOPNOTSUPP), deleting a chain, set or element that does not exist (ENOENT),
// deleting a chain or set something still refers to, such as another process's rule
// (EBUSY), adding an element that exists with another value or a set that exists with
// another definition (EEXIST), a jump loop reachable from a base chain (EMLINK: the
// kernel gives up at its jump depth limit), and names longer than the kernel's limit
// (ERANGE: the attribute fails policy validation).
package fake

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"syscall"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// maxName is the longest chain, set or table name the kernel takes (NFT_NAME_MAXLEN
// 256, with the terminating NUL).
const maxName = 255

// maxErrors is how many errors a refusal reports, as nft/wire collects from the kernel.
const maxErrors = 5

// Applier is an in-memory nf_tables with an applier's memory. It is safe for concurrent
// use.
type Applier struct {
	mu       sync.Mutex
	tables   map[tableKey]*table // what "the kernel" holds
	believed map[tableKey]*table // what Apply last wrote, per table; absent: rewrite
	applies  int
	refusals int
	resyncs  int
}

type tableKey struct {
	fam  nft.Family
	name string
}

// table is one table's content: sets with their elements by encoded key, chains.
type table struct {
	sets   map[string]*set
	chains map[string]*nft.Chain
	// deleted by the transaction being checked: a reference left to one of them is
	// EBUSY (in use), not ENOENT
	goneSets, goneChains map[string]bool
}

type set struct {
	def   *nft.Set                // definition; Elements unused
	elems map[string]*nft.Element // encoded key → element
}

// New returns an empty fake.
func New() *Applier {
	return &Applier{tables: map[tableKey]*table{}, believed: map[tableKey]*table{}}
}

// Resync makes the next Apply rewrite the whole table, whatever the fake believes.
func (f *Applier) Resync() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resyncs++
	f.believed = map[tableKey]*table{}
}

// Apply makes the tables equal to the rulesets in one transaction, or refuses it as a
// whole with a *kernel.RejectedError and changes nothing.
func (f *Applier) Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applies++
	var st kernel.Stats
	var errs []error
	staged := map[tableKey]*table{}
	wants := map[tableKey]*table{}
	for _, rs := range rulesets {
		k := tableKey{rs.Family, rs.Table}
		want, err := build(rs)
		if err != nil {
			errs = append(errs, err...)
			continue
		}
		wants[k] = want
		prev, known := f.believed[k]
		if !known {
			st.Full = true
			st.Messages++
			st.Chains += len(want.chains)
			for _, s := range want.sets {
				st.Elements += len(s.elems)
			}
			staged[k] = want.clone()
			continue
		}
		cur := f.tables[k]
		if cur == nil {
			cur = &table{sets: map[string]*set{}, chains: map[string]*nft.Chain{}}
		} else {
			cur = cur.clone()
		}
		errs = append(errs, delta(prev, want, cur, &st)...)
		staged[k] = cur
	}
	for k, t := range staged {
		errs = append(errs, t.check(k)...)
	}
	st.Messages++ // the table message every transaction starts with
	if len(errs) > 0 {
		f.refusals++
		if st.Full { // like the Applier: after a refused rewrite, every table is rewritten
			f.believed = map[tableKey]*table{}
		}
		return st, &kernel.RejectedError{Messages: st.Messages, Err: errors.Join(errs[:min(len(errs), maxErrors)]...)}
	}
	for k, t := range staged {
		f.tables[k] = t
		f.believed[k] = wants[k]
	}
	return st, nil
}

// Delete removes the given tables if they exist, in one transaction.
func (f *Applier) Delete(fam nft.Family, tables ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.believed = map[tableKey]*table{}
	for _, t := range tables {
		delete(f.tables, tableKey{fam, t})
	}
	return nil
}

// Tables lists the tables of family fam and the names of each one's chains, sorted.
func (f *Applier) Tables(fam nft.Family) (map[string][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]string{}
	for k, t := range f.tables {
		if k.fam == fam {
			out[k.name] = slices.Sorted(maps.Keys(t.chains))
		}
	}
	return out, nil
}

// Ruleset returns what the fake holds in a table as a flat ruleset (no parts): sets
// and chains sorted by name (base chains last), elements sorted by key. Nil if the
// table does not exist.
func (f *Applier) Ruleset(fam nft.Family, name string) *nft.Ruleset {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[tableKey{fam, name}]
	if t == nil {
		return nil
	}
	return t.ruleset(fam, name)
}

// Render is the table in nft syntax (nft.Render of Ruleset); "" if it does not exist.
func (f *Applier) Render(fam nft.Family, name string) string {
	rs := f.Ruleset(fam, name)
	if rs == nil {
		return ""
	}
	return nft.Render(rs)
}

// Foreign commits a transaction of another process: edit gets the table as Ruleset
// returns it (an empty one if it does not exist) and changes it; the result is checked
// as any transaction and replaces the table. The Applier does not learn of it.
func (f *Applier) Foreign(fam nft.Family, name string, edit func(rs *nft.Ruleset)) error {
	rs := f.Ruleset(fam, name)
	if rs == nil {
		rs = &nft.Ruleset{Family: fam, Table: name}
	}
	edit(rs)
	f.mu.Lock()
	defer f.mu.Unlock()
	t, errs := build(rs)
	if len(errs) == 0 {
		errs = t.check(tableKey{fam, name})
	}
	if len(errs) > 0 {
		return &kernel.RejectedError{Messages: 1, Err: errors.Join(errs...)}
	}
	f.tables[tableKey{fam, name}] = t
	return nil
}

// Counts reports how many transactions Apply was given, how many it refused, and how
// many times Resync was called.
func (f *Applier) Counts() (applies, refusals, resyncs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies, f.refusals, f.resyncs
}

// build indexes a ruleset (with its parts) as a table: what the kernel would hold after
// a full rewrite.
func build(rs *nft.Ruleset) (*table, []error) {
	t := &table{sets: map[string]*set{}, chains: map[string]*nft.Chain{}}
	var errs []error
	addSet := func(s *nft.Set) {
		def := *s
		def.Elements = nil
		t.sets[s.Name] = &set{def: &def, elems: map[string]*nft.Element{}}
	}
	for _, s := range rs.Sets {
		addSet(s)
	}
	for _, p := range rs.Parts {
		for _, s := range p.Sets {
			addSet(s)
		}
	}
	addElems := func(name string, es []nft.Element) {
		s := t.sets[name]
		if s == nil {
			errs = append(errs, fmt.Errorf("%s %s: elements for set %s: %w", rs.Family, rs.Table, name, syscall.ENOENT))
			return
		}
		for i := range es {
			k, err := s.key(&es[i])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: set %s: element %s: %w", rs.Family, rs.Table, name, nft.RenderElementKey(s.def, es[i]), err))
				continue
			}
			s.elems[k] = &es[i]
		}
	}
	for _, s := range rs.Sets {
		addElems(s.Name, s.Elements)
	}
	for _, p := range rs.Parts {
		for _, s := range p.Sets {
			addElems(s.Name, s.Elements)
		}
		for _, se := range p.Elements {
			addElems(se.Set, se.All())
		}
	}
	for _, c := range rs.Chains {
		t.chains[c.Name] = c
	}
	for _, p := range rs.Parts {
		for _, c := range p.Chains {
			t.chains[c.Name] = c
		}
	}
	return t, errs
}

// key encodes an element's key as the kernel stores it, and checks its value fits.
func (s *set) key(e *nft.Element) (string, error) {
	k, err := wire.AppendValues(nil, s.def.Key, e.Key)
	if err != nil {
		return "", fmt.Errorf("%w: %w", err, syscall.EINVAL)
	}
	switch {
	case e.Verdict != nil && !isVerdictMap(s.def):
		return "", fmt.Errorf("a verdict in a set without verdicts: %w", syscall.EINVAL)
	case s.def.IsMap() && !isVerdictMap(s.def):
		if _, err := wire.AppendValues(nil, s.def.Data, e.Data); err != nil {
			return "", fmt.Errorf("value: %w: %w", err, syscall.EINVAL)
		}
	case isVerdictMap(s.def) && e.Verdict == nil:
		return "", fmt.Errorf("no verdict for a verdict map: %w", syscall.EINVAL)
	}
	return string(k), nil
}

func isVerdictMap(s *nft.Set) bool { return len(s.Data) == 1 && s.Data[0] == nft.TypeVerdict }

func (t *table) clone() *table {
	out := &table{sets: make(map[string]*set, len(t.sets)), chains: maps.Clone(t.chains)}
	for name, s := range t.sets {
		out.sets[name] = &set{def: s.def, elems: maps.Clone(s.elems)}
	}
	return out
}

// delta applies to cur what the real Applier sends to turn prev (what it believes the
// kernel holds) into want, failing as the kernel fails where cur is not what the
// Applier believes.
func delta(prev, want, cur *table, st *kernel.Stats) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	// sets: gone, new, replaced; elements of kept sets by key
	for name := range prev.sets {
		if want.sets[name] == nil {
			st.Messages++
			if cur.sets[name] == nil {
				fail("deleting set %s: %w", name, syscall.ENOENT)
			}
			delete(cur.sets, name)
			cur.gone(name, "")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.sets)) {
		w, p := want.sets[name], prev.sets[name]
		replaced := p != nil && !sameDef(p.def, w.def)
		if replaced {
			st.Messages++
			if cur.sets[name] == nil {
				fail("deleting set %s: %w", name, syscall.ENOENT)
			}
			delete(cur.sets, name)
			p = nil
		}
		c := cur.sets[name]
		switch {
		case p == nil && c != nil && !sameDef(c.def, w.def):
			fail("adding set %s: it exists with another definition: %w", name, syscall.EEXIST)
			continue
		case p == nil && c == nil:
			st.Messages++
			c = &set{def: w.def, elems: map[string]*nft.Element{}}
			cur.sets[name] = c
		case p == nil:
		case w.def.Dynamic && p.def.Epoch != w.def.Epoch:
			st.Messages++
			c.elems = map[string]*nft.Element{} // flushed
		}
		c.def = w.def
		if w.def.Dynamic {
			continue // learned by the rules
		}
		var old map[string]*nft.Element
		if p != nil {
			old = p.elems
		}
		for k, e := range old {
			if n, kept := w.elems[k]; kept && reflect.DeepEqual(n, e) {
				continue
			}
			st.Elements++
			if _, ok := c.elems[k]; !ok {
				fail("set %s: deleting element %s: %w", name, nft.RenderElementKey(w.def, *e), syscall.ENOENT)
			}
			delete(c.elems, k)
		}
		for k, e := range w.elems {
			if o, had := old[k]; had && reflect.DeepEqual(o, e) {
				continue
			}
			st.Elements++
			if x, ok := c.elems[k]; ok && !sameElem(x, e) {
				fail("set %s: adding element %s: it exists with another value: %w", name, nft.RenderElementKey(w.def, *e), syscall.EEXIST)
			}
			c.elems[k] = e
		}
	}
	// chains: gone, new (appended to if another process created it), changed (flushed)
	for name := range prev.chains {
		if want.chains[name] == nil {
			st.Chains++
			if cur.chains[name] == nil {
				fail("deleting chain %s: %w", name, syscall.ENOENT)
			}
			delete(cur.chains, name)
			cur.gone("", name)
		}
	}
	for name, w := range want.chains {
		p, had := prev.chains[name]
		c := cur.chains[name]
		switch {
		case !had && c != nil:
			st.Chains++
			cur.chains[name] = &nft.Chain{Name: name, Hook: c.Hook, Rules: slices.Concat(c.Rules, w.Rules)}
		case !had:
			st.Chains++
			cur.chains[name] = w
		case !reflect.DeepEqual(p.Rules, w.Rules) || !reflect.DeepEqual(p.Hook, w.Hook):
			st.Chains++
			if c == nil {
				fail("flushing chain %s: %w", name, syscall.ENOENT)
			}
			cur.chains[name] = w
		}
	}
	return errs
}

// gone notes a set or chain the transaction deletes.
func (t *table) gone(set, chain string) {
	if t.goneSets == nil {
		t.goneSets, t.goneChains = map[string]bool{}, map[string]bool{}
	}
	if set != "" {
		t.goneSets[set] = true
	}
	if chain != "" {
		t.goneChains[chain] = true
	}
}

// missing is the error of a reference to a set or chain that is not there: in use
// (EBUSY) if this transaction deletes it, no such object (ENOENT) otherwise.
func (t *table) missing(set, chain string) error {
	if t.goneSets[set] && set != "" || t.goneChains[chain] && chain != "" {
		return syscall.EBUSY
	}
	return syscall.ENOENT
}

func sameDef(a, b *nft.Set) bool {
	return a.Comment == b.Comment && a.Dynamic == b.Dynamic && a.Timeout == b.Timeout && a.Size == b.Size &&
		a.Counter == b.Counter && a.Interval == b.Interval && slices.Equal(a.Key, b.Key) && slices.Equal(a.Data, b.Data)
}

// sameElem: the kernel keeps an existing element when the value is the same (a
// comment or counter is not compared).
func sameElem(a, b *nft.Element) bool {
	return reflect.DeepEqual(a.Data, b.Data) && reflect.DeepEqual(a.Verdict, b.Verdict)
}

// check validates a table as the kernel does at commit: names, and every reference
// from rules and verdict map elements to chains and sets, and no jump loop from a base chain.
func (t *table) check(k tableKey) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s: "+format, append([]any{k.fam, k.name}, args...)...))
	}
	if len(k.name) > maxName {
		fail("table name of %d bytes: %w", len(k.name), syscall.ERANGE)
	}
	jumps := map[string][]string{} // chain → chains it may jump or go to
	for _, name := range slices.Sorted(maps.Keys(t.sets)) {
		s := t.sets[name]
		if len(name) > maxName {
			fail("set name of %d bytes: %w", len(name), syscall.ERANGE)
		}
		for _, kb := range slices.Sorted(maps.Keys(s.elems)) {
			if v := s.elems[kb].Verdict; v != nil && (v.Kind == nft.Jump || v.Kind == nft.Goto) && t.chains[v.Chain] == nil {
				fail("set %s: element %s: %s to chain %s: %w", name, nft.RenderElementKey(s.def, *s.elems[kb]), verb(v.Kind), v.Chain, t.missing("", v.Chain))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		c := t.chains[name]
		if len(name) > maxName {
			fail("chain name of %d bytes: %w", len(name), syscall.ERANGE)
		}
		for i, r := range c.Rules {
			for _, s := range r.Stmts {
				to, sets := refs(s)
				for _, target := range to {
					if t.chains[target] == nil {
						fail("chain %s rule %d: jump to chain %s: %w", name, i, target, t.missing("", target))
					}
					jumps[name] = append(jumps[name], target)
				}
				for _, ref := range sets {
					ts := t.sets[ref.name]
					switch {
					case ts == nil:
						fail("chain %s rule %d: %s @%s: %w", name, i, ref.use, ref.name, t.missing(ref.name, ""))
					case ref.verdicts && !isVerdictMap(ts.def), ref.values && (!ts.def.IsMap() || isVerdictMap(ts.def)):
						fail("chain %s rule %d: %s @%s: not a map of that kind: %w", name, i, ref.use, ref.name, syscall.EINVAL)
					case ref.dynamic && !ts.def.Dynamic:
						fail("chain %s rule %d: %s @%s: not a dynamic set: %w", name, i, ref.use, ref.name, syscall.EOPNOTSUPP)
					case ref.verdicts:
						for _, e := range ts.elems {
							if v := e.Verdict; v != nil && (v.Kind == nft.Jump || v.Kind == nft.Goto) {
								jumps[name] = append(jumps[name], v.Chain)
							}
						}
					}
				}
			}
		}
	}
	var bases []string
	for name, c := range t.chains {
		if c.Hook != nil {
			bases = append(bases, name)
		}
	}
	if loop := findLoop(jumps, bases); loop != "" {
		fail("jump loop through chain %s: %w", loop, syscall.EMLINK)
	}
	return errs
}

func verb(k nft.VerdictKind) string {
	if k == nft.Goto {
		return "goto"
	}
	return "jump"
}

// setRef is a statement's use of a set.
type setRef struct {
	name     string
	use      string // for errors: "lookup", "vmap", …
	verdicts bool   // must be a verdict map
	values   bool   // must be a map of values
	dynamic  bool   // must be a dynamic set
}

// refs returns the chains a statement jumps or goes to and the sets it uses.
func refs(s nft.Stmt) (chains []string, sets []setRef) {
	switch s := s.(type) {
	case nft.Verdict:
		if s.Kind == nft.Jump || s.Kind == nft.Goto {
			chains = append(chains, s.Chain)
		}
	case nft.Lookup:
		sets = append(sets, setRef{name: s.Set, use: "lookup"})
	case nft.VMap:
		sets = append(sets, setRef{name: s.Map, use: "vmap", verdicts: true})
	case nft.DNATNumgenMap:
		sets = append(sets, setRef{name: s.Map, use: "dnat map", values: true})
	case nft.DNATKeyMap:
		sets = append(sets, setRef{name: s.Map, use: "dnat map", values: true})
	case nft.DNATHashMap:
		sets = append(sets, setRef{name: s.Map, use: "dnat map", values: true})
	case nft.UpdateSaddr:
		sets = append(sets, setRef{name: s.Set, use: "update", dynamic: true})
	}
	return chains, sets
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

// ruleset is the table as a flat ruleset, sorted.
func (t *table) ruleset(fam nft.Family, name string) *nft.Ruleset {
	rs := &nft.Ruleset{Family: fam, Table: name}
	for _, n := range slices.Sorted(maps.Keys(t.sets)) {
		s := t.sets[n]
		c := *s.def
		c.Elements = nil
		for _, k := range slices.Sorted(maps.Keys(s.elems)) {
			c.Elements = append(c.Elements, *s.elems[k])
		}
		rs.Sets = append(rs.Sets, &c)
	}
	var base []*nft.Chain
	for _, n := range slices.Sorted(maps.Keys(t.chains)) {
		c := t.chains[n]
		cc := &nft.Chain{Name: c.Name, Hook: c.Hook, Rules: slices.Clone(c.Rules)}
		if c.Hook != nil {
			base = append(base, cc)
		} else {
			rs.Chains = append(rs.Chains, cc)
		}
	}
	rs.Chains = append(rs.Chains, base...)
	return rs
}
