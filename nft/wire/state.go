package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file parses tables into comparable form: the kernel's dumps (read.go) and what a
// ruleset encodes to (EncodeState) go through the same attribute parser (the kernel's dump, and
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
	// Flowtables by name; nil when none was read (a table without flowtables).
	Flowtables map[string]*FlowtableState
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
	for _, ft := range rs.Flowtables {
		b.AddFlowtable(ft)
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
		case unix.NFT_MSG_NEWFLOWTABLE:
			return st.addFlowtableMsg(payload)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (st *TableState) addChainMsg(payload []byte) error {
	table, c, err := parseChain(payload)
	if err != nil || table != st.Name {
		return err
	}
	if old := st.Chains[c.Name]; old != nil {
		c.Rules = old.Rules
	}
	st.Chains[c.Name] = c
	return nil
}

// parseChain parses a NEWCHAIN message (or a chain of a dump): the chain's table, name
// and hook.
func parseChain(payload []byte) (table string, c *ChainState, err error) {
	ad, err := decoder(payload)
	if err != nil {
		return "", nil, err
	}
	c = &ChainState{}
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
		return "", nil, fmt.Errorf("decoding chain: %w", err)
	}
	if hasHook {
		c.Hook = &hook
	}
	return table, c, nil
}

func (st *TableState) addRuleMsg(payload []byte) error {
	table, chain, r, err := parseRule(payload)
	if err != nil || table != st.Name {
		return err
	}
	c := st.Chains[chain]
	if c == nil { // a rule seen before its chain: the chain message fills in the rest
		c = &ChainState{Name: chain}
		st.Chains[chain] = c
	}
	c.Rules = append(c.Rules, r)
	return nil
}

// parseRule parses a NEWRULE message: the rule's table and chain, and the rule.
func parseRule(payload []byte) (table, chain string, r RuleState, err error) {
	ad, err := decoder(payload)
	if err != nil {
		return "", "", r, err
	}
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
		return "", "", r, fmt.Errorf("decoding rule: %w", err)
	}
	return table, chain, r, nil
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

func (st *TableState) addFlowtableMsg(payload []byte) error {
	table, ft, err := parseFlowtable(payload)
	if err != nil || table != st.Name {
		return err
	}
	if st.Flowtables == nil {
		st.Flowtables = map[string]*FlowtableState{}
	}
	st.Flowtables[ft.Name] = ft
	return nil
}

func (st *TableState) addSetMsg(payload []byte) error {
	table, s, err := parseSet(payload)
	if err != nil || table != st.Name || s.Flags&unix.NFT_SET_ANONYMOUS != 0 {
		return err
	}
	st.Sets[s.Name] = s
	return nil
}

// parseSet parses a NEWSET message (or a set of a dump): the set's table and
// definition, with no elements.
func parseSet(payload []byte) (table string, s *SetState, err error) {
	ad, err := decoder(payload)
	if err != nil {
		return "", nil, err
	}
	s = &SetState{Elements: map[string]ElemState{}}
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
		return "", nil, fmt.Errorf("decoding set: %w", err)
	}
	return table, s, nil
}

func (st *TableState) addElemsMsg(payload []byte) error {
	table, set, elems, err := parseElems(payload)
	if err != nil {
		return err
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

// parseElems parses a NEWSETELEM or DELSETELEM message: the set's table and name, and
// the elements (none: a flush).
func parseElems(payload []byte) (table, set string, elems []ElemState, err error) {
	ad, err := decoder(payload)
	if err != nil {
		return "", "", nil, err
	}
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
		return "", "", nil, fmt.Errorf("decoding set elements: %w", err)
	}
	return table, set, elems, nil
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

// IsMap reports whether the set is a map (of values or verdicts).
func (s *SetState) IsMap() bool { return s.Flags&unix.NFT_SET_MAP != 0 }

// Verdicts reports whether the set is a verdict map.
func (s *SetState) Verdicts() bool { return s.IsMap() && s.DataType == unix.NFT_DATA_VERDICT }

// Dynamic reports whether rules add to the set (its elements are learned).
func (s *SetState) Dynamic() bool { return s.Flags&unix.NFT_SET_EVAL != 0 }
