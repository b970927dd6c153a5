// Package trace follows the first packet of a new connection through an *nft.Ruleset —
// the same typed values the kernel encoder and the renderer read — and reports every way
// the dataplane can treat it: each outcome with its probability, verdict, DNAT target,
// masquerading and the rules it went through.
//
// The tracer knows statements, not chain names: it evaluates the base chains hook by hook
// in priority order like netfilter, follows jump, goto and return, looks concatenated keys
// up in sets and verdict maps, and forks where the ruleset draws at random (numgen). A
// statement kind it does not know is an error, never a silent pass.
//
// Limits: the packet is always the first of its connection (ct state new, no conntrack
// entry yet), dynamic sets hold what the Ruleset holds (for compiled rulesets: nothing,
// i.e. a client that session affinity has not seen recently), and masquerading is
// reported but the source address it would pick is not.
package trace

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
)

// Packet is the first packet of a connection.
type Packet struct {
	Family  nft.Family
	Saddr   netip.Addr
	Daddr   netip.Addr
	L4Proto uint8 // IP protocol number: 6 tcp, 17 udp, 132 sctp
	Dport   uint16
	// Iifname is the interface the packet came in on ("iifname"); "" for a locally
	// generated packet, or when it does not matter.
	Iifname string
	// Hook is where the packet enters the ruleset: nft.Prerouting for a packet arriving
	// from the network, nft.Output for a locally generated one.
	Hook nft.HookPoint
}

// Context is what the tracer needs to know about the node.
type Context struct {
	// SaddrLocal reports that the source address is one of the node's ("fib saddr type
	// local"). A locally generated packet (Hook nft.Output) always has a local source.
	SaddrLocal bool
	// IsLocal reports whether an address belongs to the node: "fib daddr type local",
	// and the routing decision between the input and forward hooks. Nil: none does.
	IsLocal func(netip.Addr) bool
}

// Verdict is the fate of a packet.
type Verdict uint8

// Final verdicts.
const (
	Accept Verdict = iota + 1
	Drop
	Reject // dropped with an ICMP error (TCP clients get a connection refused)
)

func (v Verdict) String() string {
	switch v {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// Result lists every way the ruleset can treat a packet.
type Result struct {
	Packet   Packet
	Outcomes []Outcome // in evaluation order; probabilities sum to 1
}

// Outcome is one way the ruleset can treat the packet.
type Outcome struct {
	Probability float64
	Verdict     Verdict
	DNAT        netip.AddrPort // the new destination; invalid when not translated
	Masquerade  bool
	Path        []Step // the rules that matched, in evaluation order
}

// Step is one rule that matched: all its statements ran, or it ended in a verdict.
// Rules whose match failed are left out.
type Step struct {
	Chain   string
	Rule    nft.Rule
	Text    string  // the rule in nft syntax, with its comment
	Matched []Match // elements found by this rule's set lookups, verdict maps and NAT maps
}

// Match is a set element or map entry a rule found.
type Match struct {
	Set     *nft.Set
	Element nft.Element
	Text    string // the element in nft syntax: key, comment and value
}

// ErrUnsupported is wrapped by the error for a statement kind the tracer does not handle.
var ErrUnsupported = errors.New("statement kind not supported by the tracer")

// Trace evaluates the ruleset for pkt.
func Trace(rs *nft.Ruleset, pkt Packet, ctx Context) (*Result, error) {
	if pkt.Family != rs.Family {
		return nil, fmt.Errorf("trace: %s packet in an %s table", pkt.Family, rs.Family)
	}
	v6 := pkt.Family == nft.IPv6
	if !pkt.Saddr.IsValid() || !pkt.Daddr.IsValid() || pkt.Saddr.Is6() != v6 || pkt.Daddr.Is6() != v6 {
		return nil, fmt.Errorf("trace: addresses %s and %s are not both %s", pkt.Saddr, pkt.Daddr, pkt.Family)
	}
	var stages []stage
	switch pkt.Hook {
	case nft.Prerouting:
		stages = []stage{{hook: nft.Prerouting, nat: true}}
	case nft.Output:
		stages = []stage{{hook: nft.Output, nat: true}, {hook: nft.Postrouting, nat: true}}
	default:
		return nil, fmt.Errorf("trace: a packet enters at prerouting or output, not %s", pkt.Hook)
	}
	ends, err := newTracer(rs, ctx).stages(&thread{pkt: pkt, orig: pkt.Daddr, prob: 1}, stages)
	if err != nil {
		return nil, err
	}
	res := &Result{Packet: pkt}
	for _, t := range ends {
		res.Outcomes = append(res.Outcomes, Outcome{
			Probability: t.prob, Verdict: t.end, DNAT: t.dnat, Masquerade: t.masq, Path: t.path,
		})
	}
	return res, nil
}

type tracer struct {
	fam    nft.Family
	ctx    Context
	chains map[string]*nft.Chain
	sets   map[string]*nft.Set
	base   map[nft.HookPoint][]*nft.Chain // by hook, in priority order
}

func newTracer(rs *nft.Ruleset, ctx Context) *tracer {
	rs = rs.Flatten()
	tr := &tracer{
		fam: rs.Family, ctx: ctx,
		chains: map[string]*nft.Chain{}, sets: map[string]*nft.Set{}, base: map[nft.HookPoint][]*nft.Chain{},
	}
	for _, c := range rs.Chains {
		tr.chains[c.Name] = c
		if c.Hook != nil {
			tr.base[c.Hook.Hook] = append(tr.base[c.Hook.Hook], c)
		}
	}
	for _, s := range rs.Sets {
		tr.sets[s.Name] = s
	}
	for _, cs := range tr.base {
		// Netfilter runs lower priorities first; equal ones in registration order.
		slices.SortStableFunc(cs, func(a, b *nft.Chain) int { return cmp.Compare(a.Hook.Priority, b.Hook.Priority) })
	}
	return tr
}

func (tr *tracer) isLocal(a netip.Addr) bool { return tr.ctx.IsLocal != nil && tr.ctx.IsLocal(a) }

// stage is one hook a packet traverses; nat is false when the connection's NAT for that
// hook is already decided (a looped-back locally generated packet), so NAT chains are
// skipped as netfilter does.
type stage struct {
	hook nft.HookPoint
	nat  bool
}

// stages runs t through the hooks of the list and those routing adds after them, and
// returns the threads it ends in.
func (tr *tracer) stages(t *thread, list []stage) ([]*thread, error) {
	if len(list) == 0 {
		return []*thread{t}, nil
	}
	ends, err := tr.hook(t, list[0])
	if err != nil {
		return nil, err
	}
	var out []*thread
	for _, e := range ends {
		if e.end != Accept {
			out = append(out, e)
			continue
		}
		more, err := tr.stages(e, tr.route(e, list[0], list[1:]))
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
	return out, nil
}

// route returns the hooks that follow done: after prerouting, input for a local
// destination (after DNAT) or forward and postrouting; after the postrouting of a locally
// generated packet to a local address, its loopback delivery through prerouting and input.
func (tr *tracer) route(t *thread, done stage, rest []stage) []stage {
	switch {
	case done.hook == nft.Prerouting && done.nat:
		if tr.isLocal(t.pkt.Daddr) {
			return []stage{{hook: nft.Input, nat: true}}
		}
		return []stage{{hook: nft.Forward, nat: true}, {hook: nft.Postrouting, nat: true}}
	case done.hook == nft.Postrouting && t.pkt.Hook == nft.Output && tr.isLocal(t.pkt.Daddr):
		return []stage{{hook: nft.Prerouting}, {hook: nft.Input}}
	}
	return rest
}

// hook runs the base chains of one hook in priority order.
func (tr *tracer) hook(t *thread, s stage) ([]*thread, error) {
	t.end, t.natted = 0, false
	return tr.baseChains(t, tr.base[s.hook], s)
}

// baseChains runs t through chains cs, one after the other while it is accepted. Once a
// NAT chain has set up a translation, the hook's later NAT chains are skipped, as
// netfilter does.
func (tr *tracer) baseChains(t *thread, cs []*nft.Chain, s stage) ([]*thread, error) {
	if len(cs) == 0 {
		t.end = Accept
		return []*thread{t}, nil
	}
	if cs[0].Hook.Type == nft.TypeNAT && (!s.nat || t.natted) {
		return tr.baseChains(t, cs[1:], s)
	}
	ends, err := tr.chain(t, cs[0])
	if err != nil {
		return nil, err
	}
	var out []*thread
	for _, e := range ends {
		if e.end != Accept {
			out = append(out, e)
			continue
		}
		e.end = 0
		more, err := tr.baseChains(e, cs[1:], s)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
	return out, nil
}
