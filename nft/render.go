package nft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Render returns the ruleset in nft syntax, loadable with "nft -f". Because the table is
// declared and then flushed-and-refilled object by object, loading the text is also an
// atomic replacement of an older version of the table.
func Render(rs *Ruleset) string {
	rs = rs.Flatten()
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", rs.Family, rs.Table)
	first := true
	sep := func() {
		if !first {
			b.WriteString("\n")
		}
		first = false
	}
	for _, s := range rs.Sets {
		sep()
		renderSet(&b, rs.Family, s)
	}
	for _, ft := range rs.Flowtables {
		sep()
		renderFlowtable(&b, ft)
	}
	for _, c := range rs.Chains {
		sep()
		renderChain(&b, rs.Family, c)
	}
	b.WriteString("}\n")
	return b.String()
}

// renderFlowtable renders a flowtable as nft lists it.
func renderFlowtable(b *strings.Builder, ft *Flowtable) {
	fmt.Fprintf(b, "\tflowtable %s {\n", ft.Name)
	prio := "filter"
	if ft.Priority != 0 {
		prio = strconv.Itoa(int(ft.Priority))
	}
	fmt.Fprintf(b, "\t\thook ingress priority %s\n", prio)
	if len(ft.Devices) > 0 {
		fmt.Fprintf(b, "\t\tdevices = { %s }\n", strings.Join(ft.Devices, ", "))
	}
	b.WriteString("\t}\n")
}

func renderSet(b *strings.Builder, fam Family, s *Set) {
	kind := "set"
	if s.IsMap() {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n", kind, s.Name)
	fmt.Fprintf(b, "\t\t%s\n", setTypeLine(fam, s))
	if s.Size > 0 {
		fmt.Fprintf(b, "\t\tsize %d\n", s.Size)
	}
	switch {
	case s.Interval:
		b.WriteString("\t\tflags interval\n")
	case s.Dynamic && s.Timeout > 0:
		b.WriteString("\t\tflags dynamic,timeout\n")
	case s.Dynamic:
		b.WriteString("\t\tflags dynamic\n")
	}
	if s.Timeout > 0 {
		fmt.Fprintf(b, "\t\ttimeout %ds\n", s.Timeout)
	}
	if s.Counter {
		b.WriteString("\t\tcounter\n")
	}
	if s.Comment != "" {
		fmt.Fprintf(b, "\t\tcomment %s\n", strconv.Quote(s.Comment))
	}
	if len(s.Elements) > 0 {
		b.WriteString("\t\telements = { ")
		for i, e := range s.Elements {
			if i > 0 {
				b.WriteString(",\n\t\t\t     ")
			}
			b.WriteString(renderElement(s, e))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
}

// setTypeLine renders "type a . b : c", or "typeof …" for maps keyed by numgen, which nft
// can only express with typeof: a slot map ("typeof numgen random mod 1 : ip daddr . th
// dport") or a map keyed by a packet's own key and an index ("typeof ip daddr . meta
// l4proto . th dport . numgen random mod 256 : ip daddr . th dport"). The modulus in a
// typeof is only userdata; these are the ones nft 1.0.6 lists back unchanged.
func setTypeLine(fam Family, s *Set) string {
	if len(s.Key) == 1 && s.Key[0] == TypeNumgen {
		return "typeof numgen random mod 1 : " + typeofFields(fam, s.Data)
	}
	if IsKeyNumgenMap(s) {
		return "typeof " + typeofFields(fam, s.Key) + " : " + typeofFields(fam, s.Data)
	}
	line := "type " + joinTypes(s.Key)
	if s.IsMap() {
		line += " : " + joinTypes(s.Data)
	}
	return line
}

// IsKeyNumgenMap reports whether s is a map keyed by packet fields followed by a numgen
// index, the map DNATKeyMap reads ("ip daddr . meta l4proto . th dport . numgen random
// mod 256" or "meta l4proto . th dport . numgen random mod 256" to an address and port).
func IsKeyNumgenMap(s *Set) bool {
	return len(s.Key) > 1 && s.Key[len(s.Key)-1] == TypeNumgen && s.IsMap()
}

// typeofFields renders a key or value of packet fields (and a numgen index) as the
// expressions that produce it: addresses are the destination, services the transport
// destination port.
func typeofFields(fam Family, ts []Datatype) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		switch t {
		case TypeIPv4Addr, TypeIPv6Addr:
			parts[i] = fam.String() + " daddr"
		case TypeInetProto:
			parts[i] = "meta l4proto"
		case TypeInetService:
			parts[i] = "th dport"
		case TypeNumgen:
			parts[i] = "numgen random mod 256"
		default:
			parts[i] = typeName(t)
		}
	}
	return strings.Join(parts, " . ")
}

func joinTypes(ts []Datatype) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = typeName(t)
	}
	return strings.Join(parts, " . ")
}

func typeName(t Datatype) string {
	switch t {
	case TypeIPv4Addr:
		return "ipv4_addr"
	case TypeIPv6Addr:
		return "ipv6_addr"
	case TypeInetProto:
		return "inet_proto"
	case TypeInetService:
		return "inet_service"
	case TypeVerdict:
		return "verdict"
	case TypeNumgen:
		return "integer"
	}
	panic(fmt.Sprintf("nft: unknown datatype %d", t))
}

func renderElement(s *Set, e Element) string {
	if s.Interval {
		return RenderElementKey(s, e)
	}
	out := renderValues(s.Key, e.Key)
	if s.Counter {
		out += " counter packets 0 bytes 0"
	}
	if e.Comment != "" {
		out += " comment " + strconv.Quote(e.Comment)
	}
	switch {
	case e.Verdict != nil:
		out += " : " + renderVerdict(*e.Verdict)
	case len(e.Data) > 0:
		out += " : " + renderValues(s.Data, e.Data)
	}
	return out
}

// RenderElementKey renders an element's key, for messages: an interval set's range as a
// prefix when it is one, else as "first-last".
func RenderElementKey(s *Set, e Element) string {
	if s.Interval && len(e.Key) == 1 && len(e.Data) == 1 {
		if p, ok := RangePrefix(e.Key[0].Addr(), e.Data[0].Addr()); ok {
			if p.Bits() == p.Addr().BitLen() {
				return p.Addr().String()
			}
			return p.String()
		}
		return e.Key[0].Addr().String() + "-" + e.Data[0].Addr().String()
	}
	return renderValues(s.Key, e.Key)
}

func renderValues(types []Datatype, vals []Value) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = renderValue(types[i], v)
	}
	return strings.Join(parts, " . ")
}

func renderValue(t Datatype, v Value) string {
	switch t {
	case TypeIPv4Addr, TypeIPv6Addr:
		return v.Addr().String()
	case TypeInetProto:
		return ProtoName(uint8(v.Num()))
	}
	return strconv.FormatUint(uint64(v.Num()), 10)
}

// ProtoName is nft's name for an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

func renderChain(b *strings.Builder, fam Family, c *Chain) {
	fmt.Fprintf(b, "\tchain %s {\n", c.Name)
	if h := c.Hook; h != nil {
		fmt.Fprintf(b, "\t\ttype %s hook %s priority %d; policy accept;\n", h.Type, h.Hook, h.Priority)
	}
	for _, r := range c.Rules {
		fmt.Fprintf(b, "\t\t%s\n", RenderRule(fam, r))
	}
	b.WriteString("\t}\n")
}

// RenderRule renders one rule in nft syntax.
func RenderRule(fam Family, r Rule) string {
	parts := make([]string, 0, len(r.Stmts)+1)
	for _, s := range r.Stmts {
		parts = append(parts, RenderStmt(fam, s))
	}
	if r.Comment != "" {
		parts = append(parts, "comment "+strconv.Quote(r.Comment))
	}
	return strings.Join(parts, " ")
}

// RenderStmt renders one statement in nft syntax.
func RenderStmt(fam Family, s Stmt) string {
	switch s := s.(type) {
	case MatchPrefix:
		op := ""
		if s.Op == OpNeq {
			op = "!= "
		}
		p := s.Prefix.Masked()
		if p.Bits() == p.Addr().BitLen() {
			return fmt.Sprintf("%s %s%s", fieldName(fam, s.Field), op, p.Addr())
		}
		return fmt.Sprintf("%s %s%s", fieldName(fam, s.Field), op, p)
	case MatchIifname:
		op := ""
		if s.Op == OpNeq {
			op = "!= "
		}
		name := s.Name
		if s.Prefix {
			name += "*"
		}
		return "iifname " + op + strconv.Quote(name)
	case MatchL4Proto:
		return "meta l4proto " + ProtoName(s.Proto)
	case MatchCtStateNew:
		return "ct state new"
	case MatchCtStatusDNAT:
		return "ct status dnat"
	case MatchCtStateEstablished:
		return "ct state established"
	case FlowOffload:
		return "flow add @" + s.Flowtable
	case MatchMarkUnset:
		return fmt.Sprintf("meta mark & 0x%08x == 0x00000000", s.Bits)
	case MatchFibDaddrLocal:
		return "fib daddr type local"
	case Lookup:
		return fieldList(fam, s.Fields) + " @" + s.Set
	case VMap:
		return fieldList(fam, s.Fields) + " vmap @" + s.Map
	case Verdict:
		return renderVerdict(s)
	case Reject:
		return "reject"
	case SetMarkBits:
		op := "|"
		if s.Xor {
			op = "^"
		}
		return fmt.Sprintf("meta mark set meta mark %s 0x%08x", op, s.Bits)
	case Masquerade:
		if s.FullyRandom {
			return "masquerade fully-random"
		}
		return "masquerade"
	case DNATNumgenMap:
		if s.Offset == 0 {
			return fmt.Sprintf("dnat %s to numgen random mod %d map @%s", fam, s.Mod, s.Map)
		}
		return fmt.Sprintf("dnat %s to numgen random mod %d offset %d map @%s", fam, s.Mod, s.Offset, s.Map)
	case SNATTo:
		return fmt.Sprintf("snat %s to %s fully-random", fam, s.Addr)
	case DNATHashMap:
		return fmt.Sprintf("dnat %s to jhash %s saddr . th sport mod %d seed 0x%08x offset %d map @%s", fam, fam, s.Mod, s.Seed, s.Offset, s.Map)
	case DNATKeyMap:
		return fmt.Sprintf("dnat %s to %s . numgen random mod %d map @%s", fam, fieldList(fam, s.Fields), s.Mod, s.Map)
	case Counter:
		return "counter packets 0 bytes 0"
	case MatchFibSaddrLocal:
		return "fib saddr type local"
	case MatchNumgen:
		return fmt.Sprintf("numgen random mod %d 0", s.Mod)
	case DNATTo:
		return "dnat to " + netip.AddrPortFrom(s.Addr, s.Port).String()
	case UpdateSaddr:
		return fmt.Sprintf("update @%s { %s saddr }", s.Set, fam)
	}
	panic(fmt.Sprintf("nft: no rendering for statement %T", s))
}

func renderVerdict(v Verdict) string {
	switch v.Kind {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	case Goto:
		return "goto " + v.Chain
	}
	panic(fmt.Sprintf("nft: unknown verdict %d", v.Kind))
}

func fieldList(fam Family, fs []Field) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = fieldName(fam, f)
	}
	return strings.Join(parts, " . ")
}

func fieldName(fam Family, f Field) string {
	switch f {
	case FieldSaddr:
		return fam.String() + " saddr"
	case FieldDaddr:
		return fam.String() + " daddr"
	case FieldL4Proto:
		return "meta l4proto"
	case FieldTHDport:
		return "th dport"
	case FieldCtOrigDaddr:
		return "ct original " + fam.String() + " daddr"
	}
	panic(fmt.Sprintf("nft: unknown field %d", f))
}
