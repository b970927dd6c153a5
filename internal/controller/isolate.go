package controller

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// When the kernel refuses a transaction, it keeps the table as it was: the last good
// ruleset goes on working. If service ports changed since then, one of them may carry
// what the kernel refuses; rather than fail every later sync (and so block every other
// service's changes), the proxy finds those service ports by bisection, programs
// everything else, and keeps each refused one as it last was (or leaves it out if it is
// new), until its input changes.

// quarantined is a refused part, by family and owner.
type quarantineKey struct {
	fam   nft.Family
	owner string
}

// withQuarantine replaces the parts the kernel refused, while unchanged, by what the
// kernel last accepted for their owner (nothing, if it never accepted one). A changed
// part leaves quarantine and is tried again.
func (p *Proxy) withQuarantine(rulesets []*nft.Ruleset) []*nft.Ruleset {
	if len(p.quarantine) == 0 {
		return rulesets
	}
	excluded := map[quarantineKey]bool{}
	present := map[quarantineKey]bool{}
	for _, rs := range rulesets {
		for _, part := range rs.Parts {
			k := quarantineKey{rs.Family, part.Owner}
			present[k] = true
			if bad, ok := p.quarantine[k]; ok {
				if bad == part {
					excluded[k] = true
				} else {
					delete(p.quarantine, k)
					p.log.Info("Service port changed; trying its rules again", "servicePort", servicePortOf(part), "family", rs.Family)
				}
			}
		}
	}
	for k, bad := range p.quarantine {
		switch {
		case bad == nil && !present[k]:
			excluded[k] = true // a refused removal: the old part stays while the port is absent
		case !excluded[k]:
			delete(p.quarantine, k) // the service port is gone, or came back
		}
	}
	return p.revert(rulesets, excluded)
}

// revert returns rulesets with the excluded owners' parts as last applied.
func (p *Proxy) revert(rulesets []*nft.Ruleset, excluded map[quarantineKey]bool) []*nft.Ruleset {
	if len(excluded) == 0 {
		return rulesets
	}
	good := p.lastGoodParts()
	out := make([]*nft.Ruleset, len(rulesets))
	for i, rs := range rulesets {
		c := *rs
		c.Parts = make([]*nft.Part, 0, len(rs.Parts))
		present := map[string]bool{}
		for _, part := range rs.Parts {
			k := quarantineKey{rs.Family, part.Owner}
			present[part.Owner] = true
			if !excluded[k] {
				c.Parts = append(c.Parts, part)
			} else if g := good[k]; g != nil {
				c.Parts = append(c.Parts, g)
			}
		}
		for k := range excluded { // a part the change removed stays as it was
			if k.fam == rs.Family && !present[k.owner] && good[k] != nil {
				c.Parts = append(c.Parts, good[k])
			}
		}
		out[i] = &c
	}
	return out
}

// lastGoodParts indexes the parts of the last applied rulesets (the dataplane's: a
// trial of isolate that the kernel accepts changes them only for service ports no later
// trial excludes again).
func (p *Proxy) lastGoodParts() map[quarantineKey]*nft.Part {
	out := map[quarantineKey]*nft.Part{}
	for _, rs := range p.dataplane.Applied().Rulesets() {
		for _, part := range rs.Parts {
			out[quarantineKey{rs.Family, part.Owner}] = part
		}
	}
	return out
}

// isolate is called after the kernel refused rulesets. It looks for the changed parts
// the kernel refuses, applies everything else, and quarantines them. It returns the
// stats of the transaction that was finally applied, or an error if even the last good
// ruleset plus the unchanged parts is refused (then nothing is service-specific).
func (p *Proxy) isolate(rulesets []*nft.Ruleset, refusal error) (kernel.Stats, []*nft.Ruleset, error) {
	good := p.lastGoodParts() // empty before the first accepted sync: every part is a suspect
	var suspects []quarantineKey
	for _, rs := range rulesets {
		present := map[string]bool{}
		for _, part := range rs.Parts {
			k := quarantineKey{rs.Family, part.Owner}
			present[part.Owner] = true
			if good[k] != part {
				suspects = append(suspects, k)
			}
		}
		for k := range good {
			if k.fam == rs.Family && !present[k.owner] {
				suspects = append(suspects, k) // removed
			}
		}
	}
	if len(suspects) == 0 {
		return kernel.Stats{}, nil, refusal
	}
	slices.SortFunc(suspects, func(a, b quarantineKey) int {
		if a.fam != b.fam {
			return int(a.fam) - int(b.fam)
		}
		return strings.Compare(a.owner, b.owner)
	})
	attempts := 0
	try := func(excluded map[quarantineKey]bool) (kernel.Stats, []*nft.Ruleset, error) {
		attempts++
		rs := p.revert(rulesets, excluded)
		st, err := p.dataplane.Apply(rs...)
		return st, rs, err
	}
	all := map[quarantineKey]bool{}
	for _, k := range suspects {
		all[k] = true
	}
	if _, _, err := try(all); err != nil {
		return kernel.Stats{}, nil, fmt.Errorf("%w (and the last accepted rules of the %d changed service ports are refused too: %v)", refusal, len(suspects), err)
	}
	// Add the suspects back in halves; a half the kernel refuses is split again.
	excluded := all
	var bad []quarantineKey
	var include func(ks []quarantineKey)
	include = func(ks []quarantineKey) {
		trial := maps.Clone(excluded)
		for _, k := range ks {
			delete(trial, k)
		}
		_, _, err := try(trial)
		switch {
		case err == nil:
			excluded = trial
		case len(ks) == 1:
			var rejected *kernel.RejectedError
			if errors.As(err, &rejected) {
				bad = append(bad, ks[0])
			}
		default:
			include(ks[:len(ks)/2])
			include(ks[len(ks)/2:])
		}
	}
	include(suspects)
	final := map[quarantineKey]bool{}
	for _, k := range bad {
		final[k] = true
	}
	st, applied, err := try(final)
	if err != nil {
		return st, nil, fmt.Errorf("%w (after isolating %d service ports: %v)", refusal, len(bad), err)
	}
	current := map[quarantineKey]*nft.Part{}
	for _, rs := range rulesets {
		for _, part := range rs.Parts {
			current[quarantineKey{rs.Family, part.Owner}] = part
		}
	}
	for _, k := range bad {
		p.quarantine[k] = current[k] // nil for a removal the kernel refused: kept while absent
		part := current[k]
		if part == nil {
			part = good[k]
		}
		name := servicePortOf(part)
		what := "its previous rules stay in place"
		if good[k] == nil {
			what = "it is not programmed"
		}
		p.log.Error(refusal, "The kernel refuses this service port's rules; "+what+" until it changes", "servicePort", name, "family", k.fam, "attempts", attempts)
		if obj := p.src.Object(model.KindService, name.Namespace, name.Name); obj != nil && p.recorder != nil {
			p.recorder.Eventf(obj, "Warning", "NftproxyRefused", "port %q (%s): the kernel refused its rules (%v); %s until the service changes", name.Port, k.fam, refusal, what)
		}
	}
	return st, applied, nil
}

// servicePortOf is the service port a part serves, from the compiler's tag (a part
// without one is named by its owner key, for the log line).
func servicePortOf(part *nft.Part) model.ServicePortName {
	if part == nil {
		return model.ServicePortName{}
	}
	if sp, ok := purpose.ServicePortOf(part.Tag); ok {
		return sp
	}
	return model.ServicePortName{Name: part.Owner}
}
