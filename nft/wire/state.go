package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file reads a table back from the kernel over netlink, and turns a ruleset into
// the same form: both sides go through the same attribute parser (the kernel's dump, and
// our own encoder's messages become a TableState), so that nft/readback can compare
// them. What the kernel adds or normalises in dumps is ignored by RuleKey and by the
// element parser: handles, use counts, chain statistics, counter values, element
// timeouts and expirations, and attributes that are zero on one side and absent on the
// other (the kernel defaults them to zero: e.g. NFTA_LOOKUP_SET_ID, NFTA_LOOKUP_FLAGS,
// NFTA_BITWISE_OP, NFTA_DYNSET_TIMEOUT).

// TableState is one table in comparable form: what the kernel holds, or what a ruleset
// encodes to.
type TableState struct {
	Family nft.Family
	Name   string
	Exists bool
	Chains map[string]*ChainState
	Sets   map[string]*SetState
}

// ChainState is a chain: its hook (nil for a regular chain) and rules in order.
type ChainState struct {
	Name  string
	Hook  *HookState
	Rules []RuleState
}

// HookState is a base chain's hook.
type HookState struct {
	Type     string
	Hooknum  uint32
	Priority int32
	Policy   uint32
}

// RuleState is a rule: its expressions and userdata (the comment).
type RuleState struct {
	Exprs    []ExprState
	UserData []byte
}

// ExprState is one expression: its name and the attributes of NFTA_EXPR_DATA by type.
type ExprState struct {
	Name  string
	Attrs map[uint16][]byte
}

// SetState is a set's definition and elements (keyed by key bytes).
type SetState struct {
	Name     string
	Flags    uint32
	KeyType  uint32
	KeyLen   uint32
	DataType uint32
	DataLen  uint32
	Timeout  uint64 // milliseconds
	Size     uint32
	UserData []byte
	Exprs    []string // names of the set's expressions (e.g. "counter")
	Elements map[string]ElemState
}

// ElemState is one set element.
type ElemState struct {
	Key          []byte
	Data         []byte // map value (nil for a verdict map or a set)
	Verdict      bool
	VerdictCode  uint32
	VerdictChain string
	Flags        uint32
	UserData     []byte
	Exprs        []string
}

// while it was being read.
const maxReadAttempts = 20

// ReadTable reads a table from the kernel of the network namespace open at netns (0:
// the current one): chains with hooks, rules, set definitions and all elements. The
// reads are retried until the ruleset generation is the same before and after them, so
// the result is one consistent state even while another process commits transactions.
func ReadTable(netns int, fam nft.Family, table string) (*TableState, error) {
	conn, err := Dial(netns)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var lastErr error
	for range maxReadAttempts {
		before, err := GenID(conn)
		if err != nil {
			return nil, err
		}
		st, err := readTable(conn, fam, table)
		if err != nil && !errors.Is(err, errInterrupted) {
			return nil, err
		}
		after, gerr := GenID(conn)
		if gerr != nil {
			return nil, gerr
		}
		if err == nil && before == after {
			return st, nil
		}
		lastErr = fmt.Errorf("the ruleset changed while it was read (generation %d → %d)", before, after)
	}
	return nil, fmt.Errorf("reading %s %s: %w, %d times", fam, table, lastErr, maxReadAttempts)
}

var errInterrupted = errors.New("dump interrupted")

func GenID(conn *netlink.Conn) (uint32, error) {
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("reading the ruleset generation: %w", err)
	}
	for _, m := range msgs {
		ad, err := attrs(m.Data)
		if err != nil {
			return 0, err
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), ad.Err()
			}
		}
	}
	return 0, errors.New("reading the ruleset generation: no NFTA_GEN_ID in the answer")
}

// Dump sends a dump request and returns the answers' attribute payloads.
func Dump(conn *netlink.Conn, fam nft.Family, typ uint16, build func(ae *netlink.AttributeEncoder)) ([][]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	if build != nil {
		build(ae)
	}
	data, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		if errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN) {
			return nil, errInterrupted
		}
		return nil, err
	}
	var out [][]byte
	for _, m := range msgs {
		if m.Header.Flags&netlink.DumpInterrupted != 0 {
			return nil, errInterrupted
		}
		if len(m.Data) >= 4 {
			out = append(out, m.Data[4:])
		}
	}
	return out, nil
}

func attrs(data []byte) (*netlink.AttributeDecoder, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("short nfnetlink message (%d bytes)", len(data))
	}
	return decoder(data[4:])
}

func decoder(b []byte) (*netlink.AttributeDecoder, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	return ad, nil
}

func newTableState(fam nft.Family, table string) *TableState {
	return &TableState{Family: fam, Name: table, Chains: map[string]*ChainState{}, Sets: map[string]*SetState{}}
}

func readTable(conn *netlink.Conn, fam nft.Family, table string) (*TableState, error) {
	st := newTableState(fam, table)
	tables, err := Dump(conn, fam, unix.NFT_MSG_GETTABLE, nil)
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", fam, err)
	}
	for _, payload := range tables {
		ad, err := decoder(payload)
		if err != nil {
			return nil, err
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_TABLE_NAME && ad.String() == table {
				st.Exists = true
			}
		}
	}
	if !st.Exists {
		return st, nil
	}
	chains, err := Dump(conn, fam, unix.NFT_MSG_GETCHAIN, nil)
	if err != nil {
		return nil, fmt.Errorf("listing chains of %s %s: %w", fam, table, err)
	}
	for _, payload := range chains {
		if err := st.addChainMsg(payload); err != nil {
			return nil, err
		}
	}
	rules, err := Dump(conn, fam, unix.NFT_MSG_GETRULE, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing rules of %s %s: %w", fam, table, err)
	}
	for _, payload := range rules {
		if err := st.addRuleMsg(payload); err != nil {
			return nil, err
		}
	}
	sets, err := Dump(conn, fam, unix.NFT_MSG_GETSET, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing sets of %s %s: %w", fam, table, err)
	}
	for _, payload := range sets {
		if err := st.addSetMsg(payload); err != nil {
			return nil, err
		}
	}
	for _, name := range sortedKeys(st.Sets) {
		elems, err := Dump(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
		})
		if err != nil {
			return nil, fmt.Errorf("listing elements of set %s %s %s: %w", fam, table, name, err)
		}
		for _, payload := range elems {
			if err := st.addElemsMsg(payload); err != nil {
				return nil, err
			}
		}
	}
	return st, nil
}

// EncodeState returns what the ruleset encodes to, in the form ReadBack returns.
func EncodeState(rs *nft.Ruleset) (*TableState, error) {
	rs = rs.Flatten()
	b := NewBatch(rs.Family, rs.Table)
	var errs []error
	for _, s := range rs.Sets {
		b.AddSet(s)
		if !s.Dynamic {
			es := make([]*nft.Element, len(s.Elements))
			for i := range s.Elements {
				es[i] = &s.Elements[i]
			}
			errs = append(errs, b.Elems(s, es, false))
		}
	}
	for _, c := range rs.Chains {
		b.AddChain(c)
		for _, r := range c.Rules {
			errs = append(errs, b.AddRule(c.Name, r))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	st := newTableState(rs.Family, rs.Table)
	st.Exists = true
	err := b.each(func(typ uint16, payload []byte) error {
		switch typ {
		case unix.NFT_MSG_NEWCHAIN:
			return st.addChainMsg(payload)
		case unix.NFT_MSG_NEWRULE:
			return st.addRuleMsg(payload)
		case unix.NFT_MSG_NEWSET:
			return st.addSetMsg(payload)
		case unix.NFT_MSG_NEWSETELEM:
			return st.addElemsMsg(payload)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (st *TableState) addChainMsg(payload []byte) error {
	ad, err := decoder(payload)
	if err != nil {
		return err
	}
	var table string
	c := &ChainState{}
	var hook HookState
	hasHook := false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			table = ad.String()
		case unix.NFTA_CHAIN_NAME:
			c.Name = ad.String()
		case unix.NFTA_CHAIN_HOOK:
			hasHook = true
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					switch nad.Type() {
					case unix.NFTA_HOOK_HOOKNUM:
						hook.Hooknum = nad.Uint32()
					case unix.NFTA_HOOK_PRIORITY:
						hook.Priority = int32(nad.Uint32())
					}
				}
				return nad.Err()
			})
		case unix.NFTA_CHAIN_POLICY:
			hook.Policy = ad.Uint32()
		case unix.NFTA_CHAIN_TYPE:
			hook.Type = ad.String()
		}
	}
	if err := ad.Err(); err != nil {
		return fmt.Errorf("decoding chain: %w", err)
	}
	if table != st.Name {
		return nil
	}
	if hasHook {
		c.Hook = &hook
	}
	if old := st.Chains[c.Name]; old != nil {
		c.Rules = old.Rules
	}
	st.Chains[c.Name] = c
	return nil
}

func (st *TableState) addRuleMsg(payload []byte) error {
	ad, err := decoder(payload)
	if err != nil {
		return err
	}
	var table, chain string
	var r RuleState
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			table = ad.String()
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_USERDATA:
			r.UserData = bytes.Clone(ad.Bytes())
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					e, err := decodeExpr(nad.Bytes())
					if err != nil {
						return err
					}
					r.Exprs = append(r.Exprs, e)
				}
				return nad.Err()
			})
		}
	}
	if err := ad.Err(); err != nil {
		return fmt.Errorf("decoding rule: %w", err)
	}
	if table != st.Name {
		return nil
	}
	c := st.Chains[chain]
	if c == nil { // a rule seen before its chain: the chain message fills in the rest
		c = &ChainState{Name: chain}
		st.Chains[chain] = c
	}
	c.Rules = append(c.Rules, r)
	return nil
}

// decodeExpr decodes one NFTA_LIST_ELEM of expressions: name and data attributes.
func decodeExpr(b []byte) (ExprState, error) {
	e := ExprState{Attrs: map[uint16][]byte{}}
	ad, err := decoder(b)
	if err != nil {
		return e, err
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_EXPR_NAME:
			e.Name = ad.String()
		case unix.NFTA_EXPR_DATA:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					e.Attrs[nad.Type()] = bytes.Clone(nad.Bytes())
				}
				return nad.Err()
			})
		}
	}
	return e, ad.Err()
}

// exprNames returns the names of the expressions in an NFTA_*_EXPR attribute (one
// expression) or an NFTA_*_EXPRESSIONS list.
func exprNames(b []byte, list bool) []string {
	if !list {
		e, _ := decodeExpr(b)
		return []string{e.Name}
	}
	var out []string
	ad, err := decoder(b)
	if err != nil {
		return nil
	}
	for ad.Next() {
		e, _ := decodeExpr(ad.Bytes())
		out = append(out, e.Name)
	}
	return out
}

const (
	nftaSetExpressions     = 18 // NFTA_SET_EXPRESSIONS
	nftaSetElemExpressions = 11 // NFTA_SET_ELEM_EXPRESSIONS
)

func (st *TableState) addSetMsg(payload []byte) error {
	ad, err := decoder(payload)
	if err != nil {
		return err
	}
	var table string
	s := &SetState{Elements: map[string]ElemState{}}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_TABLE:
			table = ad.String()
		case unix.NFTA_SET_NAME:
			s.Name = ad.String()
		case unix.NFTA_SET_FLAGS:
			s.Flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			s.KeyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			s.KeyLen = ad.Uint32()
		case unix.NFTA_SET_DATA_TYPE:
			s.DataType = ad.Uint32()
		case unix.NFTA_SET_DATA_LEN:
			s.DataLen = ad.Uint32()
		case unix.NFTA_SET_TIMEOUT:
			s.Timeout = ad.Uint64()
		case unix.NFTA_SET_USERDATA:
			s.UserData = bytes.Clone(ad.Bytes())
		case unix.NFTA_SET_DESC:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() == unix.NFTA_SET_DESC_SIZE {
						s.Size = nad.Uint32()
					}
				}
				return nad.Err()
			})
		case nftaSetExpr:
			s.Exprs = exprNames(ad.Bytes(), false)
		case nftaSetExpressions:
			s.Exprs = exprNames(ad.Bytes(), true)
		}
	}
	if err := ad.Err(); err != nil {
		return fmt.Errorf("decoding set: %w", err)
	}
	if table != st.Name || s.Flags&unix.NFT_SET_ANONYMOUS != 0 {
		return nil
	}
	st.Sets[s.Name] = s
	return nil
}

func (st *TableState) addElemsMsg(payload []byte) error {
	ad, err := decoder(payload)
	if err != nil {
		return err
	}
	var table, set string
	var elems []ElemState
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_LIST_TABLE:
			table = ad.String()
		case unix.NFTA_SET_ELEM_LIST_SET:
			set = ad.String()
		case unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					e, err := decodeElem(nad.Bytes())
					if err != nil {
						return err
					}
					elems = append(elems, e)
				}
				return nad.Err()
			})
		}
	}
	if err := ad.Err(); err != nil {
		return fmt.Errorf("decoding set elements: %w", err)
	}
	s := st.Sets[set]
	if table != st.Name || s == nil {
		return nil
	}
	for _, e := range elems {
		s.Elements[string(e.Key)] = e
	}
	return nil
}

func decodeElem(b []byte) (ElemState, error) {
	var e ElemState
	ad, err := decoder(b)
	if err != nil {
		return e, err
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_KEY:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() == unix.NFTA_DATA_VALUE {
						e.Key = bytes.Clone(nad.Bytes())
					}
				}
				return nad.Err()
			})
		case unix.NFTA_SET_ELEM_DATA:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					switch nad.Type() {
					case unix.NFTA_DATA_VALUE:
						e.Data = bytes.Clone(nad.Bytes())
					case unix.NFTA_DATA_VERDICT:
						v := decodeVerdict(nad.Bytes())
						e.Verdict, e.VerdictCode, e.VerdictChain = true, v.VerdictCode, v.VerdictChain
					}
				}
				return nad.Err()
			})
		case unix.NFTA_SET_ELEM_FLAGS:
			e.Flags = ad.Uint32()
		case unix.NFTA_SET_ELEM_USERDATA:
			e.UserData = bytes.Clone(ad.Bytes())
		case nftaSetElemExpr:
			e.Exprs = exprNames(ad.Bytes(), false)
		case nftaSetElemExpressions:
			e.Exprs = exprNames(ad.Bytes(), true)
		}
		// NFTA_SET_ELEM_TIMEOUT and _EXPIRATION are ignored: they change by themselves.
	}
	return e, ad.Err()
}

// Comparison.
func WithoutAttrs(m map[uint16][]byte, drop ...uint16) map[uint16][]byte {
	out := make(map[uint16][]byte, len(m))
	for k, v := range m {
		if !slices.Contains(drop, k) {
			out[k] = v
		}
	}
	return out
}

// NAT flags the kernel sets by itself when registers are given (nft_nat_init).
const (
	natRangeMapIPs         = 0x1
	natRangeProtoSpecified = 0x2
)

// RuleKey is the canonical form of a rule: equal keys mean equal rules.
func RuleKey(r RuleState) string {
	var b strings.Builder
	for _, e := range r.Exprs {
		b.WriteString(e.Name)
		b.WriteByte('{')
		if e.Name != "counter" { // counter values change by themselves
			attrs := e.Attrs
			if e.Name == "nat" {
				attrs = WithoutAttrs(attrs)
				flags := be32(attrs[unix.NFTA_NAT_FLAGS])
				if attrs[unix.NFTA_NAT_REG_ADDR_MIN] != nil {
					flags |= natRangeMapIPs
				}
				if attrs[unix.NFTA_NAT_REG_PROTO_MIN] != nil {
					flags |= natRangeProtoSpecified
				}
				attrs[unix.NFTA_NAT_FLAGS] = binary.BigEndian.AppendUint32(nil, flags)
			}
			for _, t := range sortedKeys(attrs) {
				val := attrs[t]
				if allZero(val) && !keepZero(e.Name, t) {
					continue // absent and zero mean the same to the kernel
				}
				if isRegister(e.Name, t) {
					val = binary.BigEndian.AppendUint32(nil, reg32(be32(val)))
				}
				if isData(e.Name, t) {
					fmt.Fprintf(&b, "%d=%s;", t, DataString(val))
					continue
				}
				fmt.Fprintf(&b, "%d=%x;", t, val)
			}
		}
		b.WriteByte('}')
	}
	fmt.Fprintf(&b, "udata=%x", r.UserData)
	return b.String()
}

// isRegister reports whether an expression attribute names a register.
func isRegister(expr string, attr uint16) bool {
	regs := map[string][]uint16{
		"payload":   {unix.NFTA_PAYLOAD_DREG, unix.NFTA_PAYLOAD_SREG},
		"meta":      {unix.NFTA_META_DREG, unix.NFTA_META_SREG},
		"ct":        {unix.NFTA_CT_DREG, unix.NFTA_CT_SREG},
		"cmp":       {unix.NFTA_CMP_SREG},
		"bitwise":   {unix.NFTA_BITWISE_SREG, unix.NFTA_BITWISE_DREG},
		"lookup":    {unix.NFTA_LOOKUP_SREG, unix.NFTA_LOOKUP_DREG},
		"immediate": {unix.NFTA_IMMEDIATE_DREG},
		"numgen":    {unix.NFTA_NG_DREG},
		"fib":       {unix.NFTA_FIB_DREG},
		"nat":       {unix.NFTA_NAT_REG_ADDR_MIN, unix.NFTA_NAT_REG_ADDR_MAX, unix.NFTA_NAT_REG_PROTO_MIN, unix.NFTA_NAT_REG_PROTO_MAX},
		"masq":      {unix.NFTA_MASQ_REG_PROTO_MIN, unix.NFTA_MASQ_REG_PROTO_MAX},
		"dynset":    {unix.NFTA_DYNSET_SREG_KEY, unix.NFTA_DYNSET_SREG_DATA},
	}
	return slices.Contains(regs[expr], attr)
}

// reg32 is a register number as the index of a 32-bit register. The kernel stores
// registers that way and dumps one that starts a 16-byte register by the 16-byte name:
// NFT_REG32_04 (12), where an IPv6 concatenation's second field goes, reads back as
// NFT_REG_2 (2).
func reg32(r uint32) uint32 {
	switch {
	case r == 0: // the verdict register
		return 0
	case r <= 4: // NFT_REG_1 … NFT_REG_4
		return r * 4
	case r >= reg32base:
		return r - reg32base + 4
	}
	return r
}

// isData reports whether an expression attribute holds nested NFTA_DATA_* attributes,
// which are compared by content: the kernel's dump does not set NLA_F_NESTED where our
// encoder does.
func isData(expr string, attr uint16) bool {
	switch expr {
	case "immediate":
		return attr == unix.NFTA_IMMEDIATE_DATA
	case "cmp":
		return attr == unix.NFTA_CMP_DATA
	case "bitwise":
		return attr == unix.NFTA_BITWISE_MASK || attr == unix.NFTA_BITWISE_XOR
	}
	return false
}

// DataString is the canonical form of nested NFTA_DATA_VALUE / NFTA_DATA_VERDICT.
func DataString(b []byte) string {
	var out []string
	ad, err := decoder(b)
	if err != nil {
		return "0x" + hex.EncodeToString(b)
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_DATA_VALUE:
			out = append(out, "value "+hex.EncodeToString(ad.Bytes()))
		case unix.NFTA_DATA_VERDICT:
			out = append(out, VerdictString(decodeVerdict(ad.Bytes())))
		default:
			out = append(out, fmt.Sprintf("attr %d %x", ad.Type(), ad.Bytes()))
		}
	}
	if ad.Err() != nil {
		return "0x" + hex.EncodeToString(b)
	}
	return strings.Join(out, ",")
}

func decodeVerdict(b []byte) ElemState {
	e := ElemState{Verdict: true}
	ad, err := decoder(b)
	if err != nil {
		return e
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			e.VerdictCode = ad.Uint32()
		case unix.NFTA_VERDICT_CHAIN:
			e.VerdictChain = ad.String()
		}
	}
	return e
}

// keepZero names zero-valued attributes whose presence matters: a lookup with a
// destination register (register 0: a verdict map) differs from one without.
func keepZero(expr string, attr uint16) bool {
	return expr == "lookup" && attr == unix.NFTA_LOOKUP_DREG
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func be32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func cstring(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }

func sortedKeys[K ~string | ~uint16, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func ImmediateVerdict(data []byte) (string, bool) {
	ad, err := decoder(data)
	if err != nil {
		return "", false
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_DATA_VERDICT {
			return VerdictString(decodeVerdict(ad.Bytes())), true
		}
	}
	return "", false
}

func VerdictString(e ElemState) string {
	switch e.VerdictCode {
	case nfAccept:
		return "accept"
	case nfDrop:
		return "drop"
	case verdictReturn:
		return "return"
	case verdictJump:
		return "jump " + e.VerdictChain
	case verdictGoto:
		return "goto " + e.VerdictChain
	}
	return fmt.Sprintf("verdict %d", int32(e.VerdictCode))
}

// CommentOf extracts the comment TLV of rule or element userdata.
func CommentOf(u []byte) string {
	for len(u) >= 2 {
		typ, n := u[0], int(u[1])
		if len(u) < 2+n {
			break
		}
		if typ == udataComment {
			return cstring(u[2 : 2+n])
		}
		u = u[2+n:]
	}
	return ""
}

// TypesOf reverses concatType for the datatypes nftproxy uses.
func TypesOf(id, length uint32) []nft.Datatype {
	all := []nft.Datatype{nft.TypeIPv4Addr, nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen}
	var out []nft.Datatype
	for id != 0 {
		found := false
		for _, t := range all {
			if typeID(t) == id&0x3f {
				out = append([]nft.Datatype{t}, out...)
				found = true
			}
		}
		if !found {
			return nil
		}
		id >>= 6
	}
	if _, l := concatType(out); l != length {
		return nil
	}
	return out
}

// RenderBytes decodes key or value bytes with their datatypes; hex when they do not fit.
func RenderBytes(types []nft.Datatype, b []byte) string {
	vals, ok := decodeValues(types, b)
	if !ok {
		return "0x" + hex.EncodeToString(b)
	}
	return nft.RenderElementKey(&nft.Set{Key: types}, nft.Element{Key: vals})
}

// decodeValues reverses AppendValues.
func decodeValues(types []nft.Datatype, b []byte) ([]nft.Value, bool) {
	if len(types) == 0 {
		return nil, false
	}
	var out []nft.Value
	for _, t := range types {
		n := int(typeLen(t))
		width := n
		if len(types) > 1 {
			width = (n + 3) &^ 3
		}
		if len(b) < width {
			return nil, false
		}
		f := b[:n]
		switch t {
		case nft.TypeIPv4Addr:
			out = append(out, nft.Addr(netip.AddrFrom4([4]byte(f))))
		case nft.TypeIPv6Addr:
			out = append(out, nft.Addr(netip.AddrFrom16([16]byte(f))))
		case nft.TypeInetProto:
			out = append(out, nft.Num(uint32(f[0])))
		case nft.TypeInetService:
			out = append(out, nft.Num(uint32(binary.BigEndian.Uint16(f))))
		case nft.TypeNumgen:
			out = append(out, nft.Num(binary.LittleEndian.Uint32(f)))
		default:
			return nil, false
		}
		b = b[width:]
	}
	return out, len(b) == 0
}

// SetHeader is a set's definition without elements in nft syntax, on one line.
func SetHeader(fam nft.Family, s *SetState) string {
	d := decodeSet(&SetState{Name: s.Name, Flags: s.Flags, KeyType: s.KeyType, KeyLen: s.KeyLen, DataType: s.DataType,
		DataLen: s.DataLen, Timeout: s.Timeout, Size: s.Size, UserData: s.UserData, Exprs: s.Exprs})
	text := nft.Render(&nft.Ruleset{Family: fam, Table: "t", Sets: []*nft.Set{d}})
	lines := strings.Split(text, "\n")
	var out []string
	for _, l := range lines[1:] { // the table line
		if l = strings.TrimSpace(l); l != "" && l != "}" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return out[0] + " " + strings.Join(out[1:], "; ") + " }"
}
