// Package readback compares what the kernel holds with what a ruleset should be and
// describes every difference in nft syntax (nftproxy verify, the kernel tests). Both
// sides are nft/wire's TableState: the table read back from the kernel
// (wire.ReadTable), and the expected ruleset run through the same encoder and parser
// (wire.EncodeState), so that equal encodings compare equal whatever the kernel adds in
// its dumps.
package readback

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// Diff lists human-readable differences between the kernel and the expected rulesets,
// one per line; empty when they are equal.
type Diff []string

// Empty reports whether there is no difference.
func (d Diff) Empty() bool { return len(d) == 0 }

func (d Diff) String() string { return strings.Join(d, "\n") }

// Option changes how Compare and Verify compare.
type Option func(*config)

type config struct {
	byContent func(*nft.Set) bool // maps compared by what rules select from them
}

// MapsByContent compares the maps pick selects (it sees each map's definition, without
// elements, on both sides) by what rules select from them instead of by key: such a map
// must be keyed by an integer, and a "numgen random mod N offset K" lookup into it is
// compared as the multiset of values at keys K…K+N-1. The names of those maps and the
// keys no rule reaches do not matter, except that an element of the kernel's no rule
// selects is reported. Use it when the expected ruleset may number such maps
// differently from the process that programmed the kernel.
func MapsByContent(pick func(*nft.Set) bool) Option {
	return func(c *config) { c.byContent = pick }
}

// Reader reads tables back from the kernel of one network namespace.
type Reader struct {
	NetNS int // fd of the network namespace, or 0 for the current one
}

// ReadBack reads a table back from the kernel (wire.ReadTable).
func (r Reader) ReadBack(fam nft.Family, table string) (*wire.TableState, error) {
	return wire.ReadTable(r.NetNS, fam, table)
}

// Verify reads the expected ruleset's table back from the kernel and reports every
// difference.
func (r Reader) Verify(expected *nft.Ruleset, opts ...Option) (Diff, error) {
	got, err := r.ReadBack(expected.Family, expected.Table)
	if err != nil {
		return nil, err
	}
	return Compare(got, expected, opts...)
}

// Compare reports the differences between a table state (read back from the kernel) and
// what the expected ruleset encodes to.
func Compare(got *wire.TableState, expected *nft.Ruleset, opts ...Option) (Diff, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	want, err := wire.EncodeState(expected)
	if err != nil {
		return nil, err
	}
	return compareStates(got, want, expected.Flatten(), cfg), nil
}

// sideView is one side of a comparison with the canonical form of every rule.
type sideView struct {
	st       *wire.TableState
	rules    map[string][]string         // chain → canonical rule keys
	resolved map[string][]wire.RuleState // chain → rules as compared (by-content maps resolved)
	// byContent marks the maps compared by content
	byContent map[string]bool
	// reached marks elements of by-content maps some rule selects: set → key bytes.
	reached map[string]map[string]bool
}

func newSideView(st *wire.TableState, pick func(*nft.Set) bool) *sideView {
	v := &sideView{st: st, rules: map[string][]string{}, resolved: map[string][]wire.RuleState{},
		byContent: map[string]bool{}, reached: map[string]map[string]bool{}}
	if pick != nil {
		for name, s := range st.Sets {
			if s.IsMap() && s.KeyLen == 4 && pick(wire.SetDef(s)) {
				v.byContent[name] = true
			}
		}
	}
	for name, c := range st.Chains {
		keys := make([]string, len(c.Rules))
		rules := make([]wire.RuleState, len(c.Rules))
		for i, r := range c.Rules {
			if len(v.byContent) > 0 {
				r = v.resolveByContent(r)
			}
			keys[i], rules[i] = wire.RuleKey(r), r
		}
		v.rules[name], v.resolved[name] = keys, rules
	}
	return v
}

// resolveByContent replaces "numgen … offset K" + "lookup @map" of a by-content map by
// the values the lookup can select.
func (v *sideView) resolveByContent(r wire.RuleState) wire.RuleState {
	out := wire.RuleState{UserData: r.UserData, Exprs: slices.Clone(r.Exprs)}
	for i := 0; i+1 < len(out.Exprs); i++ {
		name, mod, off, ok := wire.NumgenLookup(out.Exprs[i], out.Exprs[i+1])
		set := v.st.Sets[name]
		if !ok || set == nil || !v.byContent[set.Name] {
			continue
		}
		vals := make([]string, 0, min(mod, 1<<16))
		if v.reached[set.Name] == nil {
			v.reached[set.Name] = map[string]bool{}
		}
		for k := off; k < off+mod && k-off < 1<<16; k++ {
			kb, _ := wire.AppendValues(nil, []nft.Datatype{nft.TypeNumgen}, []nft.Value{nft.Num(k)})
			key := string(kb)
			if e, ok := set.Elements[key]; ok {
				vals = append(vals, hex.EncodeToString(e.Data))
				v.reached[set.Name][key] = true
			} else {
				vals = append(vals, "missing")
			}
		}
		sort.Strings(vals)
		ng, lk := wire.Selecting(out.Exprs[i], out.Exprs[i+1], strings.Join(vals, ","))
		out.Exprs[i], out.Exprs[i+1] = ng, lk
	}
	return out
}

func compareStates(got, want *wire.TableState, rs *nft.Ruleset, cfg config) Diff {
	prefix := fmt.Sprintf("%s %s: ", want.Family, want.Name)
	var d Diff
	add := func(format string, args ...any) { d = append(d, prefix+fmt.Sprintf(format, args...)) }
	if !got.Exists {
		add("table missing")
		return d
	}
	gv, wv := newSideView(got, cfg.byContent), newSideView(want, cfg.byContent)
	r := &renderer{rs: rs, want: want, byKey: map[string]string{}, got: gv}
	if cfg.byContent != nil {
		for _, s := range rs.Sets {
			if s.IsMap() && cfg.byContent(s) {
				r.contentTypes = s.Data
				break
			}
		}
	}
	for _, c := range rs.Chains {
		keys := wv.rules[c.Name]
		for i, rule := range c.Rules {
			if i < len(keys) {
				r.byKey[keys[i]] = nft.RenderRule(rs.Family, rule)
			}
		}
	}

	// sets
	// by-content maps: each of the kernel's is compared with the first expected one's
	// definition (their names and numbering may differ)
	var template *wire.SetState
	for _, name := range sortedKeys(want.Sets) {
		if wv.byContent[name] && template == nil {
			template = want.Sets[name]
		}
	}
	for _, name := range union(sortedKeys(got.Sets), sortedKeys(want.Sets)) {
		gs, ws := got.Sets[name], want.Sets[name]
		if gv.byContent[name] || wv.byContent[name] {
			if gs != nil && template != nil {
				for _, what := range setDefDiff(gs, template) {
					add("set %s: %s", name, what)
				}
			}
			if gs != nil {
				for _, k := range sortedKeys(gs.Elements) {
					if !gv.reached[name][k] {
						add("set %s: element %s is selected by no rule", name, r.elem(name, gs, gs.Elements[k]))
					}
				}
			}
			continue
		}
		switch {
		case gs == nil:
			add("set %s missing (%d elements)", name, len(ws.Elements))
			continue
		case ws == nil:
			add("set %s extra (%d elements)", name, len(gs.Elements))
			continue
		}
		if what := setDefDiff(gs, ws); len(what) > 0 {
			for _, w := range what {
				add("set %s: %s", name, w)
			}
			add("set %s: kernel definition `%s`, expected `%s`", name, wire.SetHeader(rs.Family, gs), wire.SetHeader(rs.Family, ws))
		}
		if ws.Dynamic() {
			continue // dynamic: elements are learned by the rules
		}
		for _, k := range union(sortedKeys(gs.Elements), sortedKeys(ws.Elements)) {
			ge, gok := gs.Elements[k]
			we, wok := ws.Elements[k]
			switch {
			case !gok:
				add("set %s: missing element %s", name, r.elem(name, ws, we))
			case !wok && nftZeroEnd(gs, ge):
				// nft puts an interval's end at the zero address before the first
				// range (older kernels needed it); it admits nothing
			case !wok:
				add("set %s: extra element %s", name, r.elem(name, gs, ge))
			case !sameElem(ge, we):
				add("set %s: element differs: kernel %s, expected %s", name, r.elem(name, gs, ge), r.elem(name, ws, we))
			}
		}
	}

	// chains
	for _, name := range union(sortedKeys(got.Chains), sortedKeys(want.Chains)) {
		gc, wc := got.Chains[name], want.Chains[name]
		switch {
		case gc == nil:
			add("chain %s missing (%d rules)", name, len(wc.Rules))
			continue
		case wc == nil:
			add("chain %s extra (%d rules)", name, len(gc.Rules))
			for i := range gc.Rules {
				add("chain %s: extra rule %d: %s", name, i, r.rule(gv, name, i))
			}
			continue
		}
		if !sameHook(gc.Hook, wc.Hook) {
			add("chain %s: hook differs: kernel %s, expected %s", name, hookString(gc.Hook), hookString(wc.Hook))
		}
		for _, op := range diffLists(gv.rules[name], wv.rules[name]) {
			switch {
			case op.got >= 0 && op.want >= 0:
				add("chain %s: rule %d differs: kernel %s, expected %s", name, op.got, r.rule(gv, name, op.got), r.rule(wv, name, op.want))
			case op.got >= 0:
				add("chain %s: extra rule %d: %s", name, op.got, r.rule(gv, name, op.got))
			default:
				add("chain %s: missing rule %d: %s", name, op.want, r.rule(wv, name, op.want))
			}
		}
	}

	// flowtables: hook, priority and devices
	for _, name := range union(sortedKeys(got.Flowtables), sortedKeys(want.Flowtables)) {
		gf, wf := got.Flowtables[name], want.Flowtables[name]
		switch {
		case gf == nil:
			add("flowtable %s missing (devices %s)", name, strings.Join(wf.Devices, ", "))
		case wf == nil:
			add("flowtable %s extra (devices %s)", name, strings.Join(gf.Devices, ", "))
		case gf.Hooknum != wf.Hooknum || gf.Priority != wf.Priority:
			add("flowtable %s: hook %d priority %d, expected hook %d priority %d", name, gf.Hooknum, gf.Priority, wf.Hooknum, wf.Priority)
		case !slices.Equal(gf.Devices, wf.Devices):
			add("flowtable %s: devices %s, expected %s", name, strings.Join(gf.Devices, ", "), strings.Join(wf.Devices, ", "))
		}
	}
	return d
}

func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// nftZeroEnd reports whether e is the end of an interval at the zero address, which nft
// adds to an interval set whose first range does not start there.
func nftZeroEnd(s *wire.SetState, e wire.ElemState) bool {
	return s.Flags&unix.NFT_SET_INTERVAL != 0 && e.Flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 && !slices.ContainsFunc(e.Key, func(b byte) bool { return b != 0 })
}

func sameElem(a, b wire.ElemState) bool {
	return bytes.Equal(a.Data, b.Data) && a.Verdict == b.Verdict && a.VerdictCode == b.VerdictCode &&
		a.VerdictChain == b.VerdictChain && a.Flags == b.Flags && bytes.Equal(a.UserData, b.UserData) &&
		slices.Equal(a.Exprs, b.Exprs)
}

func setDefDiff(got, want *wire.SetState) []string {
	var out []string
	cmp := func(what string, g, w any) {
		if g != w {
			out = append(out, fmt.Sprintf("%s differs: kernel %v, expected %v", what, g, w))
		}
	}
	cmp("flags", fmt.Sprintf("%#x", got.Flags), fmt.Sprintf("%#x", want.Flags))
	if !wire.SameKeyType(got.KeyType, want.KeyType) {
		cmp("key type", got.KeyType, want.KeyType)
	}
	cmp("key length", got.KeyLen, want.KeyLen)
	cmp("data type", fmt.Sprintf("%#x", got.DataType), fmt.Sprintf("%#x", want.DataType))
	if !want.Verdicts() { // the kernel reports a verdict's size, nft sends 0
		cmp("data length", got.DataLen, want.DataLen)
	}
	cmp("timeout (ms)", got.Timeout, want.Timeout)
	if want.Size != 0 { // else the applier's capacity (nft/kernel/capacity.go), if any
		cmp("size", got.Size, want.Size)
	}
	cmp("expressions", strings.Join(got.Exprs, ","), strings.Join(want.Exprs, ","))
	if !bytes.Equal(got.UserData, want.UserData) {
		out = append(out, fmt.Sprintf("userdata (type, comment) differs: kernel %q, expected %q", got.UserData, want.UserData))
	}
	return out
}

func sameHook(a, b *wire.HookState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func hookString(h *wire.HookState) string {
	if h == nil {
		return "none (regular chain)"
	}
	return fmt.Sprintf("type %s hook %s priority %d policy %d", h.Type, nft.HookPoint(h.Hooknum), h.Priority, h.Policy)
}

// listOp is one difference between two lists: got and want indexes, -1 when absent.
type listOp struct{ got, want int }

// diffLists aligns two lists by their longest common subsequence and returns the
// unmatched entries; a removal and an addition at the same place become one "differs".
func diffLists(got, want []string) []listOp {
	n, m := len(got), len(want)
	if n*m > 4<<20 { // too large for the table: compare by position
		var ops []listOp
		for i := range max(n, m) {
			switch {
			case i >= n:
				ops = append(ops, listOp{-1, i})
			case i >= m:
				ops = append(ops, listOp{i, -1})
			case got[i] != want[i]:
				ops = append(ops, listOp{i, i})
			}
		}
		return ops
	}
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if got[i] == want[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var ops []listOp
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && got[i] == want[j]:
			i, j = i+1, j+1
		case i < n && j < m && lcs[i+1][j] == lcs[i][j] && lcs[i][j+1] == lcs[i][j] && lcs[i+1][j+1] == lcs[i][j]:
			ops = append(ops, listOp{i, j}) // replaced
			i, j = i+1, j+1
		case j >= m || (i < n && lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, listOp{i, -1})
			i++
		default:
			ops = append(ops, listOp{-1, j})
			j++
		}
	}
	return ops
}

// renderer describes rules and elements for humans, with the expected ruleset's types.
type renderer struct {
	rs    *nft.Ruleset
	want  *wire.TableState
	got   *sideView
	byKey map[string]string // canonical rule key → rendered expected rule
	// contentTypes: the value types of the expected by-content maps
	contentTypes []nft.Datatype
}

func (r *renderer) rule(v *sideView, chain string, i int) string {
	if s, ok := r.byKey[v.rules[chain][i]]; ok {
		return "`" + s + "`"
	}
	rule := v.resolved[chain][i]
	if c := v.st.Chains[chain]; c != nil && i < len(c.Rules) {
		if dec, ok := wire.DecodeRule(r.rs.Family, c.Rules[i]); ok {
			out := "`" + nft.RenderRule(r.rs.Family, dec) + "`"
			for _, e := range rule.Exprs {
				if sel, ok := wire.Selected(e); ok {
					out += " selecting " + r.selected(sel)
				}
			}
			return out
		}
	}
	// not an encoding of any statement nftproxy writes: its expressions
	var parts []string
	for _, e := range rule.Exprs {
		parts = append(parts, r.expr(e))
	}
	out := "[" + strings.Join(parts, ", ") + "]"
	if c := wire.CommentOf(rule.UserData); c != "" {
		out += fmt.Sprintf(" comment %q", c)
	}
	return out
}

// expr describes an expression that matches no expected rule, with its main operands.
func (r *renderer) expr(e wire.ExprState) string {
	if sel, ok := wire.Selected(e); ok {
		return e.Name + " selecting " + r.selected(sel)
	}
	return wire.DescribeExpr(e)
}

// selected decodes the values a lookup into a by-content map selects.
func (r *renderer) selected(sel string) string {
	types := r.contentTypes
	var out []string
	for _, h := range strings.Split(sel, ",") {
		b, err := hex.DecodeString(h)
		if err != nil || types == nil {
			out = append(out, h)
			continue
		}
		out = append(out, wire.RenderBytes(types, b))
	}
	return "{" + strings.Join(out, ", ") + "}"
}

// elem renders an element as nft would: key, value, comment.
func (r *renderer) elem(set string, s *wire.SetState, e wire.ElemState) string {
	keyTypes, dataTypes := wire.TypesOf(s.KeyType, s.KeyLen), wire.TypesOf(s.DataType, s.DataLen)
	if s.Verdicts() {
		dataTypes = nil
	}
	for _, rs := range r.rs.Sets {
		if rs.Name == set {
			keyTypes, dataTypes = rs.Key, rs.Data
			break
		}
	}
	if r.got.byContent[set] && r.contentTypes != nil && s.IsMap() {
		dataTypes = r.contentTypes
	}
	out := wire.RenderBytes(keyTypes, e.Key)
	switch {
	case e.Verdict:
		out += " : " + wire.VerdictString(e)
	case e.Data != nil:
		out += " : " + wire.RenderBytes(dataTypes, e.Data)
	}
	if c := wire.CommentOf(e.UserData); c != "" {
		out += fmt.Sprintf(" comment %q", c)
	}
	return out
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
