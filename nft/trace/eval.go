package trace

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
)

const (
	// maxJumpDepth is the kernel's jump stack size (NFT_JUMP_STACK_SIZE).
	maxJumpDepth = 16
	// maxSteps bounds the statements one packet evaluates: the kernel refuses loops,
	// but a Ruleset value is not checked.
	maxSteps = 10000
)

// thread is one way of evaluating the packet; random choices fork it.
type thread struct {
	pkt    Packet     // addresses and port as rewritten by DNAT
	orig   netip.Addr // the destination before DNAT ("ct original ip daddr")
	prob   float64
	mark   uint32
	dnat   netip.AddrPort
	masq   bool
	natted bool    // a NAT statement ran in the current hook
	steps  int     // statements evaluated
	end    Verdict // set when the current base chain is done with the packet
	path   []Step

	// position in the current base chain's evaluation
	chain      *nft.Chain
	rule, stmt int
	stack      []frame
	matched    []Match // elements found so far by the current rule
}

// frame is where a jump returns to.
type frame struct {
	chain *nft.Chain
	rule  int
}

func (t *thread) fork(p float64) *thread {
	c := *t
	c.prob *= p
	c.path = slices.Clone(t.path)
	c.stack = slices.Clone(t.stack)
	c.matched = slices.Clone(t.matched)
	return &c
}

// control is what a statement tells the interpreter to do next.
type control struct {
	kind    controlKind
	verdict nft.Verdict // ctlVerdict
	end     Verdict     // ctlEnd
}

type controlKind uint8

const (
	ctlNext    controlKind = iota // evaluate the rule's next statement
	ctlBreak                      // the rule does not match: go on with the next rule
	ctlVerdict                    // apply verdict
	ctlEnd                        // the base chain is done with the packet: end
)

// branch is one continuation of a statement: t (possibly a fork) goes on with ctl.
type branch struct {
	t   *thread
	ctl control
}

// chain evaluates base chain c for t and returns the threads it ends in, each with end
// set: Accept (by verdict, by a NAT statement or by the policy), Drop or Reject.
func (tr *tracer) chain(t *thread, c *nft.Chain) ([]*thread, error) {
	t.chain, t.rule, t.stmt, t.stack, t.matched = c, 0, 0, nil, nil
	return tr.run(t)
}

// run evaluates t from its position until its base chain is done, forking on random
// choices.
func (tr *tracer) run(t *thread) ([]*thread, error) {
	for t.end == 0 {
		if t.steps++; t.steps > maxSteps {
			return nil, fmt.Errorf("trace: evaluation does not end (a loop through chain %s?)", t.chain.Name)
		}
		if t.rule == len(t.chain.Rules) {
			t.ret() // the end of a chain returns
			continue
		}
		r := t.chain.Rules[t.rule]
		if t.stmt == len(r.Stmts) { // every statement ran: on to the next rule
			tr.record(t)
			t.rule, t.stmt = t.rule+1, 0
			continue
		}
		branches, err := tr.stmt(t, r.Stmts[t.stmt])
		if err != nil {
			return nil, fmt.Errorf("trace: chain %s, rule %d, statement %d: %w", t.chain.Name, t.rule+1, t.stmt+1, err)
		}
		if len(branches) == 1 && branches[0].t == t {
			if err := tr.apply(t, branches[0].ctl); err != nil {
				return nil, err
			}
			continue
		}
		return tr.runBranches(branches)
	}
	return []*thread{t}, nil
}

func (tr *tracer) runBranches(branches []branch) ([]*thread, error) {
	var out []*thread
	for _, b := range branches {
		if err := tr.apply(b.t, b.ctl); err != nil {
			return nil, err
		}
		ends, err := tr.run(b.t)
		if err != nil {
			return nil, err
		}
		out = append(out, ends...)
	}
	return out, nil
}

// apply moves t according to ctl.
func (tr *tracer) apply(t *thread, ctl control) error {
	switch ctl.kind {
	case ctlNext:
		t.stmt++
	case ctlBreak:
		t.rule, t.stmt, t.matched = t.rule+1, 0, nil
	case ctlEnd:
		tr.record(t)
		t.end = ctl.end
	case ctlVerdict:
		tr.record(t)
		return tr.verdict(t, ctl.verdict)
	}
	return nil
}

func (tr *tracer) verdict(t *thread, v nft.Verdict) error {
	switch v.Kind {
	case nft.Accept:
		t.end = Accept
	case nft.Drop:
		t.end = Drop
	case nft.Return:
		t.ret()
	case nft.Jump, nft.Goto:
		c := tr.chains[v.Chain]
		if c == nil {
			return fmt.Errorf("trace: %s to chain %s, which does not exist", nft.RenderStmt(tr.fam, v), v.Chain)
		}
		if c.Hook != nil {
			return fmt.Errorf("trace: %s to base chain %s", nft.RenderStmt(tr.fam, v), v.Chain)
		}
		if v.Kind == nft.Jump {
			if len(t.stack) == maxJumpDepth {
				return fmt.Errorf("trace: more than %d nested jumps at chain %s", maxJumpDepth, v.Chain)
			}
			t.stack = append(t.stack, frame{chain: t.chain, rule: t.rule + 1})
		}
		t.chain, t.rule, t.stmt = c, 0, 0
	default:
		return fmt.Errorf("trace: unknown verdict kind %d", v.Kind)
	}
	return nil
}

// ret returns from the current chain: to the rule after the jump, or, in the base chain,
// to its policy (accept).
func (t *thread) ret() {
	if len(t.stack) == 0 {
		t.end = Accept
		return
	}
	f := t.stack[len(t.stack)-1]
	t.stack = t.stack[:len(t.stack)-1]
	t.chain, t.rule, t.stmt, t.matched = f.chain, f.rule, 0, nil
}

// record appends the current rule to the path.
func (tr *tracer) record(t *thread) {
	r := t.chain.Rules[t.rule]
	t.path = append(t.path, Step{Chain: t.chain.Name, Rule: r, Text: nft.RenderRule(tr.fam, r), Matched: t.matched})
	t.matched = nil
}
