package controller_test

// Invariants every compiled ruleset must satisfy, whatever the input: cheap checks on the
// typed nft.Ruleset that stand for "the kernel and nft accept it, and it does what it
// says" (the kernel test in fuzz_kernel_test.go checks the seeds against the real thing).

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
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
			if s == nil {
				bad("part %q adds %d elements to set %q, which is not a shared set", p.Owner, len(se.Elements), se.Set)
				continue
			}
			for _, e := range se.Elements {
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
		out += fmt.Sprintf(" : %v/%d", d.Addr, d.Num)
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
	ranges := map[string][]slotRange{} // endpoints map → ranges DNAT rules draw from
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
				have[uint64(e.Key[0].Num)] = true
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
			k := uint64(e.Key[0].Num)
			if !slices.ContainsFunc(ranges[s.Name], func(r slotRange) bool { return r.lo <= k && k < r.hi }) {
				bad("endpoints map %s: slot %d is drawn by no rule", s.Name, k)
			}
		}
	}

	// The chain graph has no loops (the kernel refuses them), and statements only occur
	// where their hooks allow: dnat in nat prerouting/output, masquerade in nat
	// postrouting, reject in prerouting, input, forward and output.
	errs = append(errs, checkGraph(rs, chains, edges)...)
	return errs
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
	if slices.Contains(s.Key, nft.TypeNumgen) && len(s.Key) != 1 {
		bad("set %s: numgen in a concatenation %v", s.Name, s.Key)
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
			if !addrOK(v.Addr) || v.Num != 0 {
				return false
			}
		case nft.TypeInetProto:
			if v.Addr.IsValid() || v.Num > 255 {
				return false
			}
		case nft.TypeInetService:
			if v.Addr.IsValid() || v.Num > 65535 {
				return false
			}
		case nft.TypeNumgen:
			if v.Addr.IsValid() {
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
			b.Write(v.Addr.AsSlice())
		} else {
			b.WriteString(strconv.FormatUint(uint64(v.Num), 10))
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
					case nft.DNATTo, nft.DNATNumgenMap:
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

// normalize renders a flat ruleset without its slot numbering: endpoint maps are left
// out and each DNAT rule lists the endpoints its slots hold, elements are sorted, and
// chains and sets are in name order. Two rulesets that program the same behaviour
// normalize equally, whichever slots their allocators chose.
func normalize(rs *nft.Ruleset) string {
	epMaps := map[string]*nft.Set{}
	var b strings.Builder
	sets := slices.Clone(rs.Sets)
	sort.Slice(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })
	for _, s := range sets {
		if slices.Equal(s.Key, []nft.Datatype{nft.TypeNumgen}) {
			epMaps[s.Name] = s
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
		fmt.Fprintf(&b, "chain %s %+v\n", c.Name, c.Hook)
		for _, r := range c.Rules {
			var parts []string
			for _, st := range r.Stmts {
				if d, ok := st.(nft.DNATNumgenMap); ok {
					parts = append(parts, "dnat to one of "+slotEndpoints(epMaps[d.Map], d))
					continue
				}
				parts = append(parts, nft.RenderStmt(rs.Family, st))
			}
			fmt.Fprintf(&b, "\t%s comment %q\n", strings.Join(parts, " "), r.Comment)
		}
	}
	return b.String()
}

func slotEndpoints(m *nft.Set, d nft.DNATNumgenMap) string {
	if m == nil {
		return "(no map " + d.Map + ")"
	}
	byKey := map[uint32]nft.Element{}
	for _, e := range m.Elements {
		if len(e.Key) == 1 {
			byKey[e.Key[0].Num] = e
		}
	}
	var out []string
	for i := range d.Mod {
		e, ok := byKey[d.Offset+i]
		if !ok || len(e.Data) != 2 {
			out = append(out, "(empty slot)")
			continue
		}
		out = append(out, netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Num)).String())
	}
	return "{" + strings.Join(out, ", ") + "}"
}

// TestChecksCatchCorruption shows that the invariants can fail: each corruption of a
// valid compiled ruleset must be reported.
func TestChecksCatchCorruption(t *testing.T) {
	compileSeed := func() *nft.Ruleset {
		w := decode(seeds()["clusterip"])[0]
		_, rulesets, _, err := controller.Compile(w.cfg, map[nft.Family]*compile.Slots{}, w.svcs, w.slices, w.node)
		if err != nil {
			t.Fatal(err)
		}
		return rulesets[0]
	}
	if errs := checkRuleset(compileSeed(), nft.IPv4); len(errs) > 0 {
		t.Fatalf("the uncorrupted ruleset is reported: %v", errs)
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
	svcChain := compile.ChainName("svc", model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.ProtoTCP})
	for _, tc := range []struct {
		name    string
		corrupt func(rs *nft.Ruleset)
		want    string
	}{
		{"missing chain", func(rs *nft.Ruleset) {
			rs.Chains = slices.DeleteFunc(rs.Chains, func(c *nft.Chain) bool { return c.Name == svcChain })
		}, "which does not exist"},
		{"duplicate chain", func(rs *nft.Ruleset) { rs.Chains = append([]*nft.Chain{chain(rs, svcChain)}, rs.Chains...) }, "defined twice"},
		{"duplicate element", func(rs *nft.Ruleset) {
			s := set(rs, "service-ips")
			s.Elements = append(s.Elements, s.Elements[0])
		}, "duplicate key"},
		{"key arity", func(rs *nft.Ruleset) {
			s := set(rs, "service-ips")
			s.Elements[0].Key = s.Elements[0].Key[:2]
		}, "does not fit"},
		{"missing set", func(rs *nft.Ruleset) {
			rs.Sets = slices.DeleteFunc(rs.Sets, func(s *nft.Set) bool { return s.Name == "hairpin" })
		}, `"hairpin"`},
		{"empty slot", func(rs *nft.Ruleset) { s := set(rs, "endpoints-0"); s.Elements = s.Elements[1:] }, "has no endpoint"},
		{"orphan slot", func(rs *nft.Ruleset) {
			s := set(rs, "endpoints-0")
			s.Elements = append(s.Elements, nft.Element{Key: []nft.Value{nft.Num(200)}, Data: s.Elements[0].Data})
		}, "drawn by no rule"},
		{"loop", func(rs *nft.Ruleset) {
			c := chain(rs, "mark-for-masquerade")
			c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "services"}}})
		}, "chain loop"},
		{"dnat in a filter chain", func(rs *nft.Ruleset) {
			c := chain(rs, "firewall-check")
			c.Rules = append(c.Rules, nft.Rule{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: svcChain}}})
		}, "reachable from base chain filter-prerouting-pre-dnat"},
		{"long comment", func(rs *nft.Ruleset) { chain(rs, svcChain).Rules[1].Comment = strings.Repeat("c", 129) }, "comment of 129 bytes"},
	} {
		rs := compileSeed()
		tc.corrupt(rs)
		errs := checkRuleset(rs, nft.IPv4)
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
			t.Errorf("%s: want an error containing %q, got %q", tc.name, tc.want, errs)
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
