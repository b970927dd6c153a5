package compile

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/nftproxy/nftproxy/internal/model"
)

// budget is what the limits need from one call to the next: the estimated element cost
// of every service port, and the Services over a limit of their own. A sync that adds
// one Service then costs the look at that Service, not a walk over every Service (a
// sixth of a sync at 30k, twice: once per family).
type budget struct {
	total int                    // ElementCost summed over the previous call's service ports
	over  map[serviceName]string // Services over a limit of their own: why
}

// serviceName is a Service's namespace and name.
type serviceName struct{ ns, name string }

func nameOf(sp *model.ServicePort) serviceName { return serviceName{sp.Name.Namespace, sp.Name.Name} }

func compareServiceNames(a, b serviceName) int {
	return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.name, b.name))
}

// groupStart returns the index of the first port of Service n in services (in name
// order), or where it would be.
func groupStart(services []*model.ServicePort, n serviceName) int {
	return sort.Search(len(services), func(i int) bool { return compareServiceNames(nameOf(services[i]), n) >= 0 })
}

// group looks at the Service whose ports start at services[from]: where its ports end,
// their cost, and why it is over a limit of its own ("" if it is not).
func (lim Limits) group(services []*model.ServicePort, from int) (to, cost int, reason string) {
	first := services[from]
	fronts := 0
	for to = from; to < len(services) && services[to].Name.Namespace == first.Name.Namespace && services[to].Name.Name == first.Name.Name; to++ {
		sp := services[to]
		fronts += frontends(sp)
		cost += ElementCost(sp)
		if n := len(sp.SourceRanges); lim.MaxSourceRangesPerService > 0 && n > lim.MaxSourceRangesPerService && reason == "" {
			reason = fmt.Sprintf("%d loadBalancerSourceRanges, more than --max-source-ranges-per-service=%d: the Service is not programmed",
				n, lim.MaxSourceRangesPerService)
		}
		if n := len(sp.Endpoints); lim.MaxEndpointsPerServicePort > 0 && n > lim.MaxEndpointsPerServicePort && reason == "" {
			reason = fmt.Sprintf("port %q has %d endpoints, more than --max-endpoints-per-service-port=%d: the Service is not programmed",
				sp.Name.Port, n, lim.MaxEndpointsPerServicePort)
		}
	}
	if lim.MaxFrontendsPerService > 0 && fronts > lim.MaxFrontendsPerService {
		reason = fmt.Sprintf("%d frontends (ports × cluster, external and load-balancer IPs), more than --max-frontends-per-service=%d: the Service is not programmed",
			fronts, lim.MaxFrontendsPerService)
	}
	return to, cost, reason
}

// setAside marks the ports of the Services the limits set aside (stateAside), reports
// each Service once (by the compiler of its first cluster IP's family), and returns
// their names, sorted. Services over a limit of their own go first, in name order; if
// the others together exceed the element budget, the oldest (then by name) are admitted
// while they fit and the rest are set aside. changes (see Compiler.diff) bring the
// budget up to date; only over the element budget does it walk every Service.
func (cc *Compiler) setAside(c *compiler, services []*model.ServicePort, changes []portChange, state []uint8) []serviceName {
	lim := c.cfg.Limits
	if lim == (Limits{}) {
		return nil
	}
	b := &cc.budget
	if b.over == nil {
		b.over = map[serviceName]string{}
	}
	if len(changes) > len(services)/32 { // many (the first call): one walk, counting anew
		clear(b.over)
		b.total = 0
		for from := 0; from < len(services); {
			to, cost, reason := lim.group(services, from)
			if reason != "" {
				b.over[nameOf(services[from])] = reason
			}
			b.total += cost
			from = to
		}
	} else {
		// the costs of the changes, and their Services (in name order, as the changes
		// are) looked at again, each once
		var last serviceName
		for _, ch := range changes {
			if ch.old != nil {
				b.total -= ElementCost(ch.old)
			}
			if ch.new != nil {
				b.total += ElementCost(ch.new)
			}
			for _, sp := range [2]*model.ServicePort{ch.old, ch.new} {
				if sp == nil || nameOf(sp) == last { // a Service's name is never empty
					continue
				}
				n := nameOf(sp)
				last = n
				delete(b.over, n)
				if from := groupStart(services, n); from < len(services) && nameOf(services[from]) == n {
					if _, _, reason := lim.group(services, from); reason != "" {
						b.over[n] = reason
					}
				}
			}
		}
	}
	names := make([]serviceName, 0, len(b.over))
	for n := range b.over {
		names = append(names, n)
	}
	slices.SortFunc(names, compareServiceNames)
	overCost := 0
	for _, n := range names {
		from := groupStart(services, n)
		to, cost, _ := lim.group(services, from)
		overCost += cost
		c.setAsideGroup(services, from, to, state, b.over[n])
	}
	if lim.MaxElements <= 0 || b.total-overCost <= lim.MaxElements {
		return names
	}
	// over budget: admit the oldest Services first (then by name), the same choice on
	// every node and after every restart
	type group struct{ from, to, cost int }
	var groups []group
	for from := 0; from < len(services); {
		to, cost, reason := lim.group(services, from)
		if reason == "" {
			groups = append(groups, group{from, to, cost})
		}
		from = to
	}
	slices.SortStableFunc(groups, func(a, b group) int { return services[a.from].Created.Compare(services[b.from].Created) })
	used := 0
	for _, g := range groups {
		if used+g.cost <= lim.MaxElements {
			used += g.cost
			continue
		}
		c.setAsideGroup(services, g.from, g.to, state, fmt.Sprintf(
			"the table's element budget (--max-table-elements=%d) is taken by older Services; this one needs about %d more: the Service is not programmed",
			lim.MaxElements, g.cost))
		names = append(names, nameOf(services[g.from]))
	}
	slices.SortFunc(names, compareServiceNames)
	return names
}

func (c *compiler) setAsideGroup(services []*model.ServicePort, from, to int, state []uint8, reason string) {
	for k := from; k < to; k++ {
		state[k] |= stateAside
	}
	sp := services[from]
	if len(sp.ClusterIPs) > 0 && sp.ClusterIPs[0].Is6() == c.v6 {
		c.problems = append(c.problems, model.Problem{Kind: "Service", Namespace: sp.Name.Namespace, Name: sp.Name.Name, Reason: reason})
	}
}
