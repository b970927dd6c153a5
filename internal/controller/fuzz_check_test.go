package controller_test

// Invariants every compiled ruleset must satisfy, whatever the input: cheap checks on the
// typed nft.Ruleset that stand for "the kernel and nft accept it, and it does what it
// says" (the kernel test in fuzz_kernel_test.go checks the seeds against the real thing).

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/trace"
)

// Limits of the kernel and of nft.
const (
	maxNameLen    = 255 // NFT_NAME_MAXLEN (256) including the NUL
	maxCommentLen = 128 // NFTNL_UDATA_COMMENT_MAXLEN: nft -f refuses longer comments
)

// checkParts reports violations of the nft.Part contract that Flatten would hide: every
// part's elements go to a shared set that exists, and two parts (or a part and the set
// itself) add one key only with identical elements.
func checkParts(rs *nft.Ruleset) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	shared := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		shared[s.Name] = s
	}
	type owned struct {
		e     nft.Element
		owner string
	}
	keys := map[string]map[string]owned{}
	add := func(s *nft.Set, e nft.Element, owner string) {
		if len(e.Key) != len(s.Key) {
			return // reported after flattening
		}
		if keys[s.Name] == nil {
			keys[s.Name] = map[string]owned{}
		}
		k := keyBytes(s.Key, e.Key)
		if prev, ok := keys[s.Name][k]; ok && !sameElement(prev.e, e) {
			bad("set %s: key %s added by %q as %s and by %q as %s", s.Name, nft.RenderElementKey(s, e),
				prev.owner, describeElement(s, prev.e), owner, describeElement(s, e))
		} else if !ok {
			keys[s.Name][k] = owned{e, owner}
		}
	}
	for _, s := range rs.Sets {
		for _, e := range s.Elements {
			add(s, e, "(ruleset)")
		}
	}
	owners := map[string]bool{}
	for _, p := range rs.Parts {
		if p.Owner == "" || owners[p.Owner] {
			bad("part owner %q is empty or not unique", p.Owner)
		}
		owners[p.Owner] = true
		for _, se := range p.Elements {
			s := shared[se.Set]
			if i := slices.IndexFunc(p.Sets, func(o *nft.Set) bool { return o.Name == se.Set }); s == nil && i >= 0 {
				s = p.Sets[i] // the part's own set (a source-range set)
			}
			if s == nil {
				bad("part %q adds %d elements to set %q, which is neither shared nor its own", p.Owner, se.Len(), se.Set)
				continue
			}
			for _, e := range se.All() {
				add(s, e, p.Owner)
			}
		}
	}
	return errs
}

func sameElement(a, b nft.Element) bool {
	return slices.Equal(a.Key, b.Key) && slices.Equal(a.Data, b.Data) && a.Comment == b.Comment &&
		(a.Verdict == nil) == (b.Verdict == nil) && (a.Verdict == nil || *a.Verdict == *b.Verdict)
}

func describeElement(s *nft.Set, e nft.Element) string {
	out := nft.RenderElementKey(s, e)
	if e.Verdict != nil {
		out += " : " + nft.RenderStmt(nft.IPv4, *e.Verdict)
	}
	for _, d := range e.Data {
		out += fmt.Sprintf(" : %v/%d", d.Addr(), d.Num())
	}
	if e.Comment != "" {
		out += " comment " + strconv.Quote(e.Comment)
	}
	return out
}

// checkRuleset reports every violated invariant of a flat ruleset (no parts) of family
// fam. It must not panic on any ruleset, consistent or not.
func checkRuleset(rs *nft.Ruleset, fam nft.Family) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if rs.Family != fam || rs.Table != compile.TableName {
		bad("table is %s %s, want %s %s", rs.Family, rs.Table, fam, compile.TableName)
	}
	if len(rs.Parts) > 0 {
		bad("ruleset has %d parts; check the flattened ruleset", len(rs.Parts))
	}
	name := func(kind, n string) {
		if n == "" || len(n) > maxNameLen {
			bad("%s name %q: empty or longer than %d bytes", kind, n, maxNameLen)
		}
	}
	comment := func(where, c string) {
		if len(c) > maxCommentLen {
			bad("%s: comment of %d bytes (nft allows %d): %q", where, len(c), maxCommentLen, c)
		}
	}
	addrType := nft.TypeIPv4Addr
	if fam == nft.IPv6 {
		addrType = nft.TypeIPv6Addr
	}
	fieldType := map[nft.Field]nft.Datatype{nft.FieldSaddr: addrType, nft.FieldDaddr: addrType,
		nft.FieldL4Proto: nft.TypeInetProto, nft.FieldTHDport: nft.TypeInetService}
	addrOK := func(a netip.Addr) bool {
		return a.IsValid() && a.Zone() == "" && (a.Is4() == (fam == nft.IPv4)) && !a.Is4In6()
	}

	// Chains first: element verdicts refer to them.
	chains := map[string]*nft.Chain{}
	seenBase := false
	for _, c := range rs.Chains {
		name("chain", c.Name)
		if chains[c.Name] != nil {
			bad("chain %s defined twice", c.Name)
		}
		chains[c.Name] = c
		if c.Hook == nil {
			if seenBase {
				bad("regular chain %s follows a base chain", c.Name)
			}
			continue
		}
		seenBase = true
		if c.Hook.Hook > nft.Postrouting || (c.Hook.Type != nft.TypeFilter && c.Hook.Type != nft.TypeNAT) {
			bad("chain %s: bad hook %+v", c.Name, *c.Hook)
		}
	}
	verdict := func(where string, v nft.Verdict) {
		switch v.Kind {
		case nft.Jump, nft.Goto:
			if t := chains[v.Chain]; t == nil {
				bad("%s: %s to chain %q, which does not exist", where, nft.RenderStmt(fam, v), v.Chain)
			} else if t.Hook != nil {
				bad("%s: %s to base chain %s", where, nft.RenderStmt(fam, v), v.Chain)
			}
		case nft.Accept, nft.Drop, nft.Return:
			if v.Chain != "" {
				bad("%s: verdict %d with chain %q", where, v.Kind, v.Chain)
			}
		default:
			bad("%s: unknown verdict kind %d", where, v.Kind)
		}
	}

	sets := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		name("set", s.Name)
		comment("set "+s.Name, s.Comment)
		if sets[s.Name] != nil {
			bad("set %s defined twice", s.Name)
		}
		sets[s.Name] = s
		setErrs := len(errs)
		checkSetType(s, addrType, bad)
		if len(errs) > setErrs {
			continue // its elements cannot be interpreted
		}
		verdictMap := s.IsMap() && s.Data[0] == nft.TypeVerdict
		keys := map[string]bool{}
		for i, e := range s.Elements {
			where := fmt.Sprintf("set %s element %d", s.Name, i)
			comment(where, e.Comment)
			if !valuesOK(s.Key, e.Key, addrOK) {
				bad("%s: key %+v does not fit type %v", where, e.Key, s.Key)
				continue
			}
			k := keyBytes(s.Key, e.Key)
			if keys[k] {
				bad("%s: duplicate key %s", where, nft.RenderElementKey(s, e))
			}
			keys[k] = true
			switch {
			case verdictMap:
				if e.Verdict == nil || len(e.Data) > 0 {
					bad("%s: verdict map element without a verdict (or with data)", where)
				} else {
					verdict(where, *e.Verdict)
				}
			case s.IsMap():
				if e.Verdict != nil || !valuesOK(s.Data, e.Data, addrOK) {
					bad("%s: data %+v (verdict %v) does not fit type %v", where, e.Data, e.Verdict, s.Data)
				}
			case s.Interval: // a range: its first address is the key, its last the data
				if e.Verdict != nil || !valuesOK(s.Key, e.Data, addrOK) || e.Data[0].Addr().Less(e.Key[0].Addr()) {
					bad("%s: not a range of type %v: %s", where, s.Key, nft.RenderElementKey(s, e))
				}
			default:
				if e.Verdict != nil || len(e.Data) > 0 {
					bad("%s: set element with data", where)
				}
			}
		}
	}

	// Rules, and the chain graph: jumps, gotos and the targets of verdict maps.
	edges := map[string][]string{}
	type slotRange struct {
		lo, hi uint64 // [lo, hi)
		chain  string
	}
	ranges := map[string][]slotRange{}     // endpoints map → ranges DNAT rules draw from
	keyMapReaders := map[string][]string{} // key map → chains whose DNAT rules read it
	for _, c := range rs.Chains {
		for ri, r := range c.Rules {
			where := fmt.Sprintf("chain %s rule %d", c.Name, ri)
			comment(where, r.Comment)
			if len(r.Stmts) == 0 {
				bad("%s: no statements", where)
			}
			for si, st := range r.Stmts {
				switch st := st.(type) {
				case nft.Verdict:
					verdict(where, st)
					if si != len(r.Stmts)-1 {
						bad("%s: statements after verdict %s", where, nft.RenderStmt(fam, st))
					}
					if st.Kind == nft.Jump || st.Kind == nft.Goto {
						edges[c.Name] = append(edges[c.Name], st.Chain)
					}
				case nft.MatchPrefix:
					if (st.Field != nft.FieldSaddr && st.Field != nft.FieldDaddr) || st.Op > nft.OpNeq ||
						!st.Prefix.IsValid() || !addrOK(st.Prefix.Addr()) {
						bad("%s: bad prefix match %+v", where, st)
					}
				case nft.MatchL4Proto:
					if st.Proto != 6 && st.Proto != 17 && st.Proto != 132 {
						bad("%s: protocol %d", where, st.Proto)
					}
				case nft.MatchMarkUnset:
					if st.Bits == 0 {
						bad("%s: empty mark", where)
					}
				case nft.SetMarkBits:
					if st.Bits == 0 {
						bad("%s: empty mark", where)
					}
				case nft.MatchNumgen:
					if st.Mod == 0 {
						bad("%s: numgen mod 0", where)
					}
				case nft.Lookup:
					s := sets[st.Set]
					if s == nil || s.IsMap() || !fieldsFit(st.Fields, s.Key, fieldType) {
						bad("%s: lookup %s does not fit set %q", where, nft.RenderStmt(fam, st), st.Set)
					}
				case nft.VMap:
					s := sets[st.Map]
					if s == nil || !slices.Equal(s.Data, []nft.Datatype{nft.TypeVerdict}) || !fieldsFit(st.Fields, s.Key, fieldType) {
						bad("%s: %s does not fit verdict map %q", where, nft.RenderStmt(fam, st), st.Map)
						continue
					}
					for _, e := range s.Elements {
						if e.Verdict != nil && (e.Verdict.Kind == nft.Jump || e.Verdict.Kind == nft.Goto) {
							edges[c.Name] = append(edges[c.Name], e.Verdict.Chain)
						}
					}
				case nft.UpdateSaddr:
					s := sets[st.Set]
					if s == nil || !s.Dynamic || s.IsMap() || !slices.Equal(s.Key, []nft.Datatype{addrType}) {
						bad("%s: update of %q, which is not a dynamic set of addresses", where, st.Set)
					}
				case nft.DNATTo:
					if !addrOK(st.Addr) || st.Port == 0 {
						bad("%s: dnat to %v port %d", where, st.Addr, st.Port)
					}
				case nft.DNATNumgenMap:
					s := sets[st.Map]
					if s == nil || !slices.Equal(s.Key, []nft.Datatype{nft.TypeNumgen}) ||
						!slices.Equal(s.Data, []nft.Datatype{addrType, nft.TypeInetService}) || st.Mod == 0 {
						bad("%s: %s does not fit endpoints map %q", where, nft.RenderStmt(fam, st), st.Map)
						continue
					}
					ranges[st.Map] = append(ranges[st.Map], slotRange{uint64(st.Offset), uint64(st.Offset) + uint64(st.Mod), c.Name})
				case nft.DNATKeyMap:
					s := sets[st.Map]
					if s == nil || len(s.Key) != len(st.Fields)+1 || !fieldsFit(st.Fields, s.Key[:len(st.Fields)], fieldType) ||
						s.Key[len(st.Fields)] != nft.TypeNumgen || !slices.Equal(s.Data, []nft.Datatype{addrType, nft.TypeInetService}) || st.Mod == 0 {
						bad("%s: %s does not fit key map %q", where, nft.RenderStmt(fam, st), st.Map)
						continue
					}
					keyMapReaders[st.Map] = append(keyMapReaders[st.Map], c.Name)
				case nft.MatchCtStateNew, nft.MatchCtStatusDNAT, nft.MatchFibDaddrLocal, nft.MatchFibSaddrLocal,
					nft.Reject, nft.Masquerade, nft.Counter:
				default:
					bad("%s: unknown statement %T", where, st)
				}
			}
		}
	}

	// Endpoint slots: every slot a DNAT rule may draw holds an endpoint, no two rules
	// draw the same slot, and no slot is left over.
	for m, rr := range ranges {
		sort.Slice(rr, func(i, j int) bool { return rr[i].lo < rr[j].lo })
		for i := 1; i < len(rr); i++ {
			if rr[i].lo < rr[i-1].hi {
				bad("endpoints map %s: chains %s and %s draw overlapping slots [%d,%d) and [%d,%d)", m,
					rr[i-1].chain, rr[i].chain, rr[i-1].lo, rr[i-1].hi, rr[i].lo, rr[i].hi)
			}
		}
		have := map[uint64]bool{}
		for _, e := range sets[m].Elements {
			if len(e.Key) == 1 {
				have[uint64(e.Key[0].Num())] = true
			}
		}
		for _, r := range rr {
			for k := r.lo; k < r.hi; k++ {
				if !have[k] {
					bad("endpoints map %s: chain %s draws slot %d, which has no endpoint", m, r.chain, k)
					break
				}
			}
		}
	}
	for _, s := range rs.Sets {
		if !slices.Equal(s.Key, []nft.Datatype{nft.TypeNumgen}) {
			continue
		}
		for _, e := range s.Elements {
			if len(e.Key) != 1 {
				continue
			}
			k := uint64(e.Key[0].Num())
			if !slices.ContainsFunc(ranges[s.Name], func(r slotRange) bool { return r.lo <= k && k < r.hi }) {
				bad("endpoints map %s: slot %d is drawn by no rule", s.Name, k)
			}
		}
	}

	// The chain graph has no loops (the kernel refuses them), and statements only occur
	// where their hooks allow: dnat in nat prerouting/output, masquerade in nat
	// postrouting, reject in prerouting, input, forward and output.
	graphErrs := checkGraph(rs, chains, edges)
	errs = append(errs, graphErrs...)
	if len(graphErrs) == 0 && len(errs) == 0 {
		// tracing needs a consistent ruleset without loops
		errs = append(errs, checkKeyMaps(rs, sets, chains, edges, keyMapReaders)...)
	}
	return errs
}

// checkKeyMaps checks the flat path, where a frontend's endpoints are the entries
// "frontend . i → endpoint" of a key map and shared chains pick one: every frontend's
// entries are numbered 0..n-1; a packet to a frontend (an element of a set that a rule
// of a dispatch chain — one a base chain jumps to — looks up before going to a chain
// that leads to a key-map DNAT) is translated to each of its own entries with
// probability 1/n, never left untranslated or sent elsewhere; every entry belongs to
// such a frontend; and, where the compiler tagged them, a frontend's entries serve its
// service port. The shared chains are traced (nft/trace) from the chain the frontend's
// rule goes to, so whatever they read (the count-bit sets) is checked by its effect.
func checkKeyMaps(rs *nft.Ruleset, sets map[string]*nft.Set, chains map[string]*nft.Chain, edges map[string][]string,
	readers map[string][]string) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	type group struct {
		entries []nft.Element
		reached bool
	}
	groups := map[string]map[string]*group{} // key map → frontend key → its entries
	for _, s := range rs.Sets {
		n := len(s.Key)
		if n < 2 || s.Key[n-1] != nft.TypeNumgen {
			continue
		}
		if len(s.Elements) > 0 && len(readers[s.Name]) == 0 {
			bad("key map %s: %d entries, read by no dnat rule", s.Name, len(s.Elements))
		}
		groups[s.Name] = map[string]*group{}
		for _, e := range s.Elements {
			if len(e.Key) != n {
				continue // reported with the set
			}
			k := keyBytes(s.Key[:n-1], e.Key[:n-1])
			g := groups[s.Name][k]
			if g == nil {
				g = &group{}
				groups[s.Name][k] = g
			}
			g.entries = append(g.entries, e)
		}
		for _, g := range groups[s.Name] {
			idx := make([]int, 0, len(g.entries))
			for _, e := range g.entries {
				idx = append(idx, int(e.Key[n-1].Num()))
			}
			sort.Ints(idx)
			for i, x := range idx {
				if x != i {
					bad("key map %s: frontend %s has indexes %v, not 0..%d", s.Name, describeElement(s, g.entries[0]), idx, len(idx)-1)
					break
				}
			}
		}
	}
	if len(groups) == 0 {
		return errs
	}
	// chains from which a key-map DNAT is reachable
	leadsToDNAT := map[string]bool{}
	var leads func(c string, seen map[string]bool) bool
	leads = func(c string, seen map[string]bool) bool {
		if v, ok := leadsToDNAT[c]; ok || seen[c] {
			return v
		}
		seen[c] = true
		v := false
		if ch := chains[c]; ch != nil {
			for _, r := range ch.Rules {
				for _, st := range r.Stmts {
					if _, ok := st.(nft.DNATKeyMap); ok {
						v = true
					}
				}
			}
		}
		for _, t := range edges[c] {
			v = leads(t, seen) || v
		}
		leadsToDNAT[c] = v
		return v
	}
	// dispatch chains: those a base chain jumps or goes to
	dispatch := map[string]bool{}
	for _, c := range rs.Chains {
		if c.Hook != nil {
			for _, t := range edges[c.Name] {
				dispatch[t] = true
			}
		}
	}
	addr := netip.MustParseAddr("192.0.2.1")
	if rs.Family == nft.IPv6 {
		addr = netip.MustParseAddr("2001:db8::1")
	}
	for _, c := range rs.Chains {
		if !dispatch[c.Name] {
			continue
		}
		for _, r := range c.Rules {
			var look *nft.Lookup
			var to string
			for _, st := range r.Stmts {
				switch st := st.(type) {
				case nft.Lookup:
					look = &st
				case nft.Verdict:
					if st.Kind == nft.Jump || st.Kind == nft.Goto {
						to = st.Chain
					}
				}
			}
			if look == nil || to == "" || !leads(to, map[string]bool{}) || sets[look.Set] == nil {
				continue
			}
			// a ruleset whose only base chain goes to the frontend rule's target
			probe := &nft.Ruleset{Family: rs.Family, Table: rs.Table, Sets: rs.Sets}
			for _, ch := range rs.Chains {
				if ch.Hook == nil {
					probe.Chains = append(probe.Chains, ch)
				}
			}
			probe.Chains = append(probe.Chains, &nft.Chain{Name: "probe", Hook: &nft.Hook{Type: nft.TypeNAT, Hook: nft.Prerouting, Priority: -100},
				Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: to}}}}})
			fs := sets[look.Set]
			for _, fe := range fs.Elements {
				if len(fe.Key) != len(look.Fields) {
					continue
				}
				pkt := trace.Packet{Family: rs.Family, Saddr: addr, Daddr: addr, Hook: nft.Prerouting}
				for i, f := range look.Fields {
					switch f {
					case nft.FieldDaddr:
						pkt.Daddr = fe.Key[i].Addr()
					case nft.FieldSaddr:
						pkt.Saddr = fe.Key[i].Addr()
					case nft.FieldL4Proto:
						pkt.L4Proto = uint8(fe.Key[i].Num())
					case nft.FieldTHDport:
						pkt.Dport = uint16(fe.Key[i].Num())
					}
				}
				where := fmt.Sprintf("frontend %s of %s (chain %s → %s)", describeElement(fs, fe), fs.Name, c.Name, to)
				res, err := trace.Trace(probe, pkt, trace.Context{})
				if err != nil {
					bad("%s: trace: %v", where, err)
					continue
				}
				got := map[string]float64{}
				var m string // the key map the packet was translated through
				for _, o := range res.Outcomes {
					if o.Verdict != trace.Accept || !o.DNAT.IsValid() {
						bad("%s: %.3g%% of new connections are not translated (%s)", where, o.Probability*100, o.Verdict)
						continue
					}
					got[o.DNAT.String()] += o.Probability
					for _, st := range o.Path {
						if d, ok := nft.StmtOf[nft.DNATKeyMap](st.Rule); ok {
							if m != "" && m != d.Map {
								bad("%s: translated through key maps %s and %s", where, m, d.Map)
							}
							m = d.Map
						}
					}
				}
				if m == "" {
					bad("%s: never translated through a key map", where)
					continue
				}
				km := sets[m]
				n := len(km.Key)
				g := groups[m][keyBytes(km.Key[:n-1], fe.Key)]
				if g == nil || len(fe.Key) != n-1 {
					bad("%s: translated through %s, which has no entries for it", where, m)
					continue
				}
				g.reached = true
				want := map[string]float64{}
				sp, tagged := purpose.ServicePortOf(fe.Tag)
				for _, e := range g.entries {
					if len(e.Data) == 2 {
						want[netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num())).String()] += 1 / float64(len(g.entries))
					}
					if esp, ok := purpose.ServicePortOf(e.Tag); tagged && ok && esp != sp {
						bad("%s: entry %s of %s serves %s, not %s", where, describeElement(km, e), m, esp, sp)
					}
				}
				if !sameDistribution(got, want) {
					bad("%s: translated to %v, want its entries of %s uniformly: %v", where, got, m, want)
				}
			}
		}
	}
	for m, gs := range groups {
		for _, g := range gs {
			if !g.reached {
				bad("key map %s: entries %s belong to no frontend", m, describeElement(sets[m], g.entries[0]))
			}
		}
	}
	return errs
}

func sameDistribution(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, p := range a {
		if q, ok := b[k]; !ok || math.Abs(p-q) > 1e-9 {
			return false
		}
	}
	return true
}

func checkSetType(s *nft.Set, addrType nft.Datatype, bad func(string, ...any)) {
	if len(s.Key) == 0 {
		bad("set %s: no key type", s.Name)
	}
	for _, t := range s.Key {
		if t == nft.TypeVerdict || t < nft.TypeIPv4Addr || t > nft.TypeNumgen || ((t == nft.TypeIPv4Addr || t == nft.TypeIPv6Addr) && t != addrType) {
			bad("set %s: key type %v", s.Name, s.Key)
		}
	}
	// numgen alone (a slot map), or last in a key map's concatenation (frontend . index)
	if i := slices.Index(s.Key, nft.TypeNumgen); i >= 0 && (i != len(s.Key)-1 || (len(s.Key) > 1 && !s.IsMap())) {
		bad("set %s: numgen not the last field of a map's key %v", s.Name, s.Key)
	}
	for _, t := range s.Data {
		if (t == nft.TypeVerdict && len(s.Data) != 1) || t == nft.TypeNumgen || t < nft.TypeIPv4Addr || t > nft.TypeVerdict ||
			((t == nft.TypeIPv4Addr || t == nft.TypeIPv6Addr) && t != addrType) {
			bad("set %s: data type %v", s.Name, s.Data)
		}
	}
	if s.Dynamic && (s.IsMap() || len(s.Elements) > 0) {
		bad("set %s: dynamic set with data or static elements", s.Name)
	}
	if s.Counter && s.IsMap() {
		bad("set %s: counters on a map", s.Name)
	}
}

func fieldsFit(fields []nft.Field, key []nft.Datatype, fieldType map[nft.Field]nft.Datatype) bool {
	if len(fields) != len(key) {
		return false
	}
	for i, f := range fields {
		if fieldType[f] != key[i] {
			return false
		}
	}
	return true
}

func valuesOK(types []nft.Datatype, vals []nft.Value, addrOK func(netip.Addr) bool) bool {
	if len(types) != len(vals) {
		return false
	}
	for i, t := range types {
		v := vals[i]
		switch t {
		case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
			if !addrOK(v.Addr()) || v.Num() != 0 {
				return false
			}
		case nft.TypeInetProto:
			if v.Addr().IsValid() || v.Num() > 255 {
				return false
			}
		case nft.TypeInetService:
			if v.Addr().IsValid() || v.Num() > 65535 {
				return false
			}
		case nft.TypeNumgen:
			if v.Addr().IsValid() {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// keyBytes is a key as the kernel compares it: address bytes (an IPv6 zone is not part
// of them) and numbers.
func keyBytes(types []nft.Datatype, vals []nft.Value) string {
	var b strings.Builder
	for i, v := range vals {
		if i < len(types) && (types[i] == nft.TypeIPv4Addr || types[i] == nft.TypeIPv6Addr) {
			b.Write(v.Addr().AsSlice())
		} else {
			b.WriteString(strconv.FormatUint(uint64(v.Num()), 10))
		}
		b.WriteByte(0)
	}
	return b.String()
}

func checkGraph(rs *nft.Ruleset, chains map[string]*nft.Chain, edges map[string][]string) []string {
	var errs []string
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var visit func(c string, path []string)
	visit = func(c string, path []string) {
		switch color[c] {
		case grey:
			errs = append(errs, fmt.Sprintf("chain loop: %s", strings.Join(append(path, c), " → ")))
			return
		case black:
			return
		}
		color[c] = grey
		for _, t := range edges[c] {
			if chains[t] != nil {
				visit(t, append(path, c))
			}
		}
		color[c] = black
	}
	for _, c := range rs.Chains {
		visit(c.Name, nil)
	}
	if len(errs) > 0 {
		return errs // reachability below assumes no loops
	}
	for _, base := range rs.Chains {
		if base.Hook == nil {
			continue
		}
		h := *base.Hook
		seen := map[string]bool{}
		var walk func(c string)
		walk = func(c string) {
			if seen[c] || chains[c] == nil {
				return
			}
			seen[c] = true
			for _, r := range chains[c].Rules {
				for _, st := range r.Stmts {
					ok := true
					switch st.(type) {
					case nft.DNATTo, nft.DNATNumgenMap, nft.DNATKeyMap:
						ok = h.Type == nft.TypeNAT && (h.Hook == nft.Prerouting || h.Hook == nft.Output)
					case nft.Masquerade:
						ok = h.Type == nft.TypeNAT && h.Hook == nft.Postrouting
					case nft.Reject:
						ok = h.Hook != nft.Postrouting
					}
					if !ok {
						errs = append(errs, fmt.Sprintf("chain %s: %s is reachable from base chain %s (%s %s)",
							c, nft.RenderStmt(rs.Family, st), base.Name, h.Type, h.Hook))
					}
				}
			}
			for _, t := range edges[c] {
				walk(t)
			}
		}
		walk(base.Name)
	}
	return errs
}

// normalize renders a flat ruleset without its slot numbering and its endpoint trees'
// depth: endpoint maps are left out and each DNAT rule lists the endpoints its slots
// hold; the shared chains that pick a flat frontend's endpoint (treeChains) are left
// out, "goto (endpoint tree)" stands for the jumps into them, and the count-bit sets
// they read are left out when empty; elements are sorted, and chains and sets are in
// name order. Two rulesets that program the same behaviour normalize equally, whichever
// slots their allocators chose and however deep their trees grew (checkKeyMaps holds
// each tree to the counts it reads).
func normalize(rs *nft.Ruleset) string {
	epMaps := map[string]*nft.Set{}
	tree, treeSets := treeChains(rs)
	var b strings.Builder
	sets := slices.Clone(rs.Sets)
	sort.Slice(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })
	for _, s := range sets {
		if slices.Equal(s.Key, []nft.Datatype{nft.TypeNumgen}) {
			epMaps[s.Name] = s
			continue
		}
		if treeSets[s.Name] && len(s.Elements) == 0 {
			continue
		}
		c := *s
		c.Elements = nil
		fmt.Fprintf(&b, "%s", strings.TrimSuffix(nft.Render(&nft.Ruleset{Family: rs.Family, Table: "x", Sets: []*nft.Set{&c}}), "}\n"))
		var elems []string
		for _, e := range s.Elements {
			elems = append(elems, describeElement(s, e))
		}
		sort.Strings(elems)
		fmt.Fprintf(&b, "\t\t%s\n", strings.Join(elems, "\n\t\t"))
	}
	chains := slices.Clone(rs.Chains)
	sort.Slice(chains, func(i, j int) bool { return chains[i].Name < chains[j].Name })
	for _, c := range chains {
		if tree[c.Name] {
			continue
		}
		fmt.Fprintf(&b, "chain %s %+v\n", c.Name, c.Hook)
		for _, r := range c.Rules {
			var parts []string
			for _, st := range r.Stmts {
				if d, ok := st.(nft.DNATNumgenMap); ok {
					parts = append(parts, "dnat to one of "+slotEndpoints(epMaps[d.Map], d))
					continue
				}
				if v, ok := st.(nft.Verdict); ok && tree[v.Chain] {
					parts = append(parts, fmt.Sprintf("verdict %d (endpoint tree)", v.Kind))
					continue
				}
				parts = append(parts, nft.RenderStmt(rs.Family, st))
			}
			fmt.Fprintf(&b, "\t%s comment %q\n", strings.Join(parts, " "), r.Comment)
		}
	}
	return b.String()
}

// treeChains finds the chains that pick a flat frontend's endpoint: those whose every
// rule is an optional set lookup followed by a key-map DNAT or a goto to another such
// chain; and the sets only they look up (the count bits).
func treeChains(rs *nft.Ruleset) (chains, sets map[string]bool) {
	chains = map[string]bool{}
	for changed := true; changed; {
		changed = false
		for _, c := range rs.Chains {
			if chains[c.Name] || c.Hook != nil || len(c.Rules) == 0 {
				continue
			}
			ok := true
			for _, r := range c.Rules {
				n := len(r.Stmts)
				if n == 0 || n > 2 {
					ok = false
					break
				}
				if _, isLookup := r.Stmts[0].(nft.Lookup); n == 2 && !isLookup {
					ok = false
					break
				}
				switch st := r.Stmts[n-1].(type) {
				case nft.DNATKeyMap:
				case nft.Verdict:
					ok = ok && st.Kind == nft.Goto && chains[st.Chain]
				default:
					ok = false
				}
			}
			if ok {
				chains[c.Name] = true
				changed = true
			}
		}
	}
	sets = map[string]bool{}
	other := map[string]bool{}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			for _, st := range r.Stmts {
				if l, ok := st.(nft.Lookup); ok {
					if chains[c.Name] {
						sets[l.Set] = true
					} else {
						other[l.Set] = true
					}
				}
			}
		}
	}
	for s := range other {
		delete(sets, s)
	}
	return chains, sets
}

func slotEndpoints(m *nft.Set, d nft.DNATNumgenMap) string {
	if m == nil {
		return "(no map " + d.Map + ")"
	}
	byKey := map[uint32]nft.Element{}
	for _, e := range m.Elements {
		if len(e.Key) == 1 {
			byKey[e.Key[0].Num()] = e
		}
	}
	var out []string
	for i := range d.Mod {
		e, ok := byKey[d.Offset+i]
		if !ok || len(e.Data) != 2 {
			out = append(out, "(empty slot)")
			continue
		}
		out = append(out, netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num())).String())
	}
	return "{" + strings.Join(out, ", ") + "}"
}

// TestChecksCatchCorruption shows that the invariants can fail: each corruption of a
// valid compiled ruleset must be reported. The clusterip seed's service port is on the
// flat path; the etp-local seed's (external Local policy with a node port) has chains of
// its own and endpoint slots.
func TestChecksCatchCorruption(t *testing.T) {
	compileSeed := func(name string) *nft.Ruleset {
		w := decode(seeds()[name])[0]
		_, rulesets, _, err := pipeline.Compile(w.cfg.Pipeline, map[nft.Family]*compile.Slots{}, w.svcs, w.slices, w.node)
		if err != nil {
			t.Fatal(err)
		}
		return rulesets[0]
	}
	for _, name := range []string{"clusterip", "etp-local", "affinity-timeouts"} {
		if errs := checkRuleset(compileSeed(name), nft.IPv4); len(errs) > 0 {
			t.Fatalf("the uncorrupted ruleset of %s is reported: %v", name, errs)
		}
	}
	set := func(rs *nft.Ruleset, name string) *nft.Set {
		for _, s := range rs.Sets {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no set %s", name)
		return nil
	}
	chain := func(rs *nft.Ruleset, name string) *nft.Chain {
		for _, c := range rs.Chains {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no chain %s", name)
		return nil
	}
	// entries of the endpoints map for the web service's cluster IP
	web := netip.MustParseAddr("10.96.0.1")
	webEntries := func(rs *nft.Ruleset) *nft.Set {
		s := set(rs, "endpoints")
		if !slices.ContainsFunc(s.Elements, func(e nft.Element) bool { return e.Key[0].Addr() == web }) {
			t.Fatalf("no endpoints entry for %s", web)
		}
		return s
	}
	root := func(rs *nft.Ruleset) string { // the tree the cluster frontends go to
		for _, r := range chain(rs, "cluster-frontend").Rules {
			if v, ok := r.Stmts[len(r.Stmts)-1].(nft.Verdict); ok && v.Kind == nft.Goto {
				return v.Chain
			}
		}
		t.Fatal("cluster-frontend goes nowhere")
		return ""
	}
	svcChain := compile.ChainName("svc", model.ServicePortName{Namespace: "default", Name: "a", Port: "http", Protocol: model.ProtoTCP})
	slotMap := func(rs *nft.Ruleset) *nft.Set {
		for _, r := range chain(rs, svcChain).Rules {
			for _, st := range r.Stmts {
				if d, ok := st.(nft.DNATNumgenMap); ok {
					return set(rs, d.Map)
				}
			}
		}
		t.Fatalf("chain %s draws no slots", svcChain)
		return nil
	}
	for _, tc := range []struct {
		seed    string
		name    string
		corrupt func(rs *nft.Ruleset)
		want    string
	}{
		// the flat path
		{"clusterip", "missing chain", func(rs *nft.Ruleset) {
			rs.Chains = slices.DeleteFunc(rs.Chains, func(c *nft.Chain) bool { return c.Name == "cluster-frontend" })
		}, "which does not exist"},
		{"clusterip", "duplicate chain", func(rs *nft.Ruleset) { rs.Chains = append([]*nft.Chain{chain(rs, "cluster-frontend")}, rs.Chains...) }, "defined twice"},
		{"clusterip", "duplicate element", func(rs *nft.Ruleset) {
			s := set(rs, "cluster-frontends")
			s.Elements = append(s.Elements, s.Elements[0])
		}, "duplicate key"},
		{"clusterip", "key arity", func(rs *nft.Ruleset) {
			s := set(rs, "cluster-frontends")
			s.Elements[0].Key = s.Elements[0].Key[:2]
		}, "does not fit"},
		{"clusterip", "numgen first", func(rs *nft.Ruleset) {
			s := webEntries(rs)
			s.Key = append([]nft.Datatype{nft.TypeNumgen}, s.Key[:len(s.Key)-1]...)
		}, "numgen not the last field"},
		{"clusterip", "missing set", func(rs *nft.Ruleset) {
			rs.Sets = slices.DeleteFunc(rs.Sets, func(s *nft.Set) bool { return s.Name == "hairpin" })
		}, `"hairpin"`},
		{"clusterip", "missing entry", func(rs *nft.Ruleset) {
			s := webEntries(rs)
			s.Elements = slices.DeleteFunc(s.Elements, func(e nft.Element) bool { return e.Key[0].Addr() == web && e.Key[3].Num() == 0 })
		}, "has indexes"},
		{"clusterip", "entry beyond the count", func(rs *nft.Ruleset) {
			s := webEntries(rs)
			e := s.Elements[0]
			e.Key = append(slices.Clone(e.Key[:3]), nft.Num(200))
			s.Elements = append(s.Elements, e)
		}, "has indexes"},
		{"clusterip", "count too high", func(rs *nft.Ruleset) {
			s := set(rs, "endpoint-count-bit3")
			s.Elements = append(s.Elements, set(rs, "cluster-frontends").Elements[0])
		}, "are not translated"},
		{"clusterip", "count too low", func(rs *nft.Ruleset) {
			// one more entry than the count the bits hold: it is never drawn
			s := webEntries(rs)
			n := 0
			for _, e := range s.Elements {
				if e.Key[0].Addr() == web {
					n++
				}
			}
			e := s.Elements[0]
			e.Key = append(slices.Clone(e.Key[:3]), nft.Num(uint32(n)))
			s.Elements = append(s.Elements, e)
		}, "want its entries"},
		{"clusterip", "entry of another service port", func(rs *nft.Ruleset) {
			s := webEntries(rs)
			s.Elements[0].Tag = &purpose.Tag{Port: &model.ServicePortName{Namespace: "x", Name: "y"}, Purpose: purpose.EndpointSlot}
		}, "serves x/y"},
		{"clusterip", "orphan entries", func(rs *nft.Ruleset) {
			s := set(rs, "cluster-frontends")
			s.Elements = nil
		}, "belong to no frontend"},
		{"clusterip", "loop", func(rs *nft.Ruleset) {
			c := chain(rs, "mark-for-masquerade")
			c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "services"}}})
		}, "chain loop"},
		{"clusterip", "dnat in a filter chain", func(rs *nft.Ruleset) {
			c := chain(rs, "firewall-check")
			c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: root(rs)}}})
		}, "reachable from base chain filter-prerouting-pre-dnat"},
		{"clusterip", "long comment", func(rs *nft.Ruleset) { chain(rs, "cluster-frontend").Rules[0].Comment = strings.Repeat("c", 129) }, "comment of 129 bytes"},
		// a service port with a chain of its own
		{"etp-local", "missing service chain", func(rs *nft.Ruleset) {
			rs.Chains = slices.DeleteFunc(rs.Chains, func(c *nft.Chain) bool { return c.Name == svcChain })
		}, "which does not exist"},
		{"etp-local", "duplicate dispatch element", func(rs *nft.Ruleset) {
			s := set(rs, "service-ips")
			s.Elements = append(s.Elements, s.Elements[0])
		}, "duplicate key"},
		{"etp-local", "empty slot", func(rs *nft.Ruleset) { s := slotMap(rs); s.Elements = s.Elements[1:] }, "has no endpoint"},
		{"etp-local", "orphan slot", func(rs *nft.Ruleset) {
			s := slotMap(rs)
			s.Elements = append(s.Elements, nft.Element{Key: []nft.Value{nft.Num(200)}, Data: s.Elements[0].Data})
		}, "drawn by no rule"},
		{"etp-local", "service chain from a filter chain", func(rs *nft.Ruleset) {
			c := chain(rs, "firewall-check")
			c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: svcChain}}})
		}, "reachable from base chain filter-prerouting-pre-dnat"},
	} {
		rs := compileSeed(tc.seed)
		tc.corrupt(rs)
		errs := checkRuleset(rs, nft.IPv4)
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
			t.Errorf("%s: %s: want an error containing %q, got %q", tc.seed, tc.name, tc.want, errs)
		}
	}

	// Two parts adding one key with different values.
	rs := &nft.Ruleset{Family: nft.IPv4, Table: compile.TableName, Sets: []*nft.Set{{Name: "s", Key: []nft.Datatype{nft.TypeNumgen},
		Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}}}}
	elem := func(port uint32) []nft.SetElements {
		return []nft.SetElements{{Set: "s", Elements: []nft.Element{{Key: []nft.Value{nft.Num(0)},
			Data: []nft.Value{nft.Addr(netip.MustParseAddr("10.0.0.1")), nft.Num(port)}}}}}
	}
	rs.Parts = []*nft.Part{{Owner: "a", Elements: elem(80)}, {Owner: "b", Elements: elem(80)}}
	if errs := checkParts(rs); len(errs) > 0 {
		t.Errorf("identical elements of two parts are reported: %v", errs)
	}
	rs.Parts = append(rs.Parts, &nft.Part{Owner: "c", Elements: elem(81)}, &nft.Part{Owner: "a"})
	errs := checkParts(rs)
	if len(errs) != 2 || !strings.Contains(errs[0], `added by "a"`) || !strings.Contains(errs[1], "not unique") {
		t.Errorf("conflicting parts: got %q", errs)
	}
}
