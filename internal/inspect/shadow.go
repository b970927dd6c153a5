package inspect

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/nft"
)

// When an external or load-balancer IP is one of the node's node-port addresses and
// its port is another service port's node port, one address and port has two
// frontends, and the kernel sends new connections to one of them only: the first rule
// of the services chain that matches (or, when neither is DNATed, of the endpoints
// check). Which one wins is read from the table, by evaluating those chains' rules in
// order for that address and port, not assumed: it is whatever the compiler wrote.

// Shadow is an address where a frontend does not get new connections: another
// service port's frontend takes them.
type Shadow struct {
	Address string `json:"address"`
	By      string `json:"by"`     // the service port that takes them
	ByType  string `json:"byType"` // its frontend there: External or NodePort
}

// shadowing reads which frontend wins where an External frontend and another service
// port's node port share an address and port, and records it on the loser.
type shadowing struct {
	sets   map[string]*nft.Set
	chains map[string]*nft.Chain
	index  map[string]map[string]nft.Element // set → key → element
	local  []netip.Addr                      // nil until needed
	// localAddrs returns the node's addresses, for a table whose node ports answer on
	// every local address ("fib daddr type local")
	localAddrs func() []netip.Addr
}

// mark annotates ports: every External frontend on a node-port address at a port that
// another service port has as node port (same protocol).
func (s *shadowing) mark(ports map[string]*Port) {
	type at struct {
		p *Port
		i int
	}
	nodePorts := map[[2]uint32][]at{} // proto, port → node port frontends
	for _, p := range ports {
		for i, f := range p.Frontends {
			if f.Type == FrontendNodePort {
				k := [2]uint32{uint32(p.proto), uint32(f.Port)}
				nodePorts[k] = append(nodePorts[k], at{p, i})
			}
		}
	}
	if len(nodePorts) == 0 {
		return
	}
	for _, p := range ports {
		for i := range p.Frontends {
			f := &p.Frontends[i]
			if f.Type != FrontendExternal {
				continue
			}
			addr, err := netip.ParseAddr(f.Address)
			if err != nil {
				continue
			}
			for _, np := range nodePorts[[2]uint32{uint32(p.proto), uint32(f.Port)}] {
				if np.p == p {
					continue
				}
				winner, ok := s.winner(addr, p.proto, f.Port)
				if !ok {
					continue // the node port does not answer on addr: no collision
				}
				g := &np.p.Frontends[np.i]
				switch winner {
				case p.Service:
					g.Shadowed = append(g.Shadowed, Shadow{Address: f.Address, By: p.Service, ByType: FrontendExternal})
				case np.p.Service:
					f.Shadowed = append(f.Shadowed, Shadow{Address: f.Address, By: np.p.Service, ByType: FrontendNodePort})
				}
			}
		}
	}
	for _, p := range ports {
		for i := range p.Frontends {
			slices.SortFunc(p.Frontends[i].Shadowed, func(a, b Shadow) int {
				return cmp.Or(compareAddr(a.Address, b.Address), strings.Compare(a.By, b.By))
			})
		}
	}
}

// winner evaluates the services chain, then the endpoints check, for a new connection
// to addr, proto, port arriving on the node, and returns the comment (the service
// port) of the element of the first rule that matches ("" when none does). ok is false
// when no node-port rule admits addr: node ports do not answer there.
func (s *shadowing) winner(addr netip.Addr, proto uint8, port uint16) (string, bool) {
	if !s.nodePortAddr(addr) {
		return "", false
	}
	for _, chain := range []string{compile.ChainServices, compile.ChainEndpointsCheck} {
		if c := s.chains[chain]; c != nil {
			for _, r := range c.Rules {
				if _, _, e, matched := s.match(r, addr, proto, port); matched {
					return e.Comment, true
				}
			}
		}
	}
	return "", true
}

// nodePortAddr reports whether any node-port rule of the services chain admits addr.
func (s *shadowing) nodePortAddr(addr netip.Addr) bool {
	if c := s.chains[compile.ChainServices]; c != nil {
		for _, r := range c.Rules {
			if byPort, pre, _, _ := s.match(r, addr, 0, 0); byPort && pre {
				return true
			}
		}
	}
	return false
}

// match evaluates one rule of the form "conditions on daddr, then a lookup or verdict
// map keyed by the destination (address . proto . port, or proto . port)": byPort
// tells a node-port rule, pre whether the conditions hold for addr, matched whether
// the key is in the set or map too (e its element).
func (s *shadowing) match(r nft.Rule, addr netip.Addr, proto uint8, port uint16) (byPort, pre bool, e nft.Element, matched bool) {
	pre = true
	for _, st := range r.Stmts {
		var fields []nft.Field
		var set string
		switch x := st.(type) {
		case nft.Lookup:
			if len(x.Fields) == 1 && x.Fields[0] == nft.FieldDaddr {
				pre = pre && s.has(x.Set, []nft.Value{nft.Addr(addr)})
				continue
			}
			fields, set = x.Fields, x.Set
		case nft.VMap:
			fields, set = x.Fields, x.Map
		case nft.MatchFibDaddrLocal:
			if s.local == nil && s.localAddrs != nil {
				s.local = s.localAddrs()
			}
			pre = pre && slices.Contains(s.local, addr)
			continue
		case nft.MatchPrefix:
			if x.Field != nft.FieldDaddr {
				return false, false, e, false
			}
			in := x.Prefix.Contains(addr)
			pre = pre && (in == (x.Op == nft.OpEq))
			continue
		default:
			continue // verdicts, counters
		}
		key := make([]nft.Value, 0, len(fields))
		hasAddr := false
		for _, f := range fields {
			switch f {
			case nft.FieldDaddr:
				key, hasAddr = append(key, nft.Addr(addr)), true
			case nft.FieldL4Proto:
				key = append(key, nft.Num(uint32(proto)))
			case nft.FieldTHDport:
				key = append(key, nft.Num(uint32(port)))
			default:
				return false, false, e, false // keyed by something else (sources)
			}
		}
		byPort = !hasAddr
		if !pre {
			return byPort, false, e, false
		}
		e, matched = s.element(set, key)
		return byPort, true, e, matched
	}
	return false, false, e, false
}

func (s *shadowing) has(set string, key []nft.Value) bool {
	_, ok := s.element(set, key)
	return ok
}

func (s *shadowing) element(set string, key []nft.Value) (nft.Element, bool) {
	if s.index == nil {
		s.index = map[string]map[string]nft.Element{}
	}
	idx, ok := s.index[set]
	if !ok {
		idx = map[string]nft.Element{}
		if st := s.sets[set]; st != nil {
			for _, e := range st.Elements {
				idx[valuesKey(e.Key)] = e
			}
		}
		s.index[set] = idx
	}
	e, ok := idx[valuesKey(key)]
	return e, ok
}
