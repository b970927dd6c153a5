package admit

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Limits bound what one object may make every node program. A zero field is no limit.
// A Service over a limit is set aside (not programmed, reported as a problem); all other
// Services are programmed.
type Limits struct {
	// MaxFrontendsPerService caps a Service's frontends: its ports times its cluster,
	// external and load-balancer IPs, all families counted.
	MaxFrontendsPerService int
	// MaxEndpointsPerServicePort caps the endpoints of any one port of a Service.
	MaxEndpointsPerServicePort int
	// MaxEndpointsPerService caps a Service's endpoints summed over its ports.
	MaxEndpointsPerService int
	// MaxSourceRangesPerService caps a Service's loadBalancerSourceRanges (each is an
	// element of every port's source-range set).
	MaxSourceRangesPerService int
	// MaxElements is the table's element budget, checked against an estimate (the
	// cost New is given) before compiling. Over it the budget is shared between
	// namespaces: one within its fair share keeps every Service, and one over it
	// loses its newest.
	MaxElements int
}

// Default limits (flags --max-frontends-per-service, --max-endpoints-per-service-port,
// --max-endpoints-per-service, --max-source-ranges-per-service, --max-table-elements).
// docs/security.md gives their reasons and costs.
const (
	DefaultMaxFrontendsPerService     = 1000
	DefaultMaxEndpointsPerServicePort = 10000
	DefaultMaxEndpointsPerService     = 100000
	DefaultMaxSourceRangesPerService  = 10000
	DefaultMaxElements                = 2000000
)

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{
		MaxFrontendsPerService:     DefaultMaxFrontendsPerService,
		MaxEndpointsPerServicePort: DefaultMaxEndpointsPerServicePort,
		MaxEndpointsPerService:     DefaultMaxEndpointsPerService,
		MaxSourceRangesPerService:  DefaultMaxSourceRangesPerService,
		MaxElements:                DefaultMaxElements,
	}
}

// budget is what the limits need from one call to the next: the element cost
// of every service port, in all and per namespace, and the Services over a limit of
// their own. A sync that adds one Service then costs the look at that Service, not a
// walk over every Service (a sixth of a sync at 30k, twice: once per family).
type budget struct {
	total int                    // the cost summed over the previous call's service ports
	ns    map[string]int         // the same per namespace (absent: none)
	over  map[serviceName]string // Services over a limit of their own: why
}

// serviceName is a Service's namespace and name.
type serviceName struct{ ns, name string }

func nameOf(sp *model.ServicePort) serviceName { return serviceName{sp.Name.Namespace, sp.Name.Name} }

func compareServiceNames(a, b serviceName) int {
	return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.name, b.name))
}

// groupStart returns the index of the first port of Service n in services (in name
// order), or where it would be. With an empty name it is where namespace n.ns starts.
func groupStart(services []*model.ServicePort, n serviceName) int {
	return sort.Search(len(services), func(i int) bool { return compareServiceNames(nameOf(services[i]), n) >= 0 })
}

// group looks at the Service whose ports start at services[from]: where its ports end,
// their cost, and why it is over a limit of its own ("" if it is not).
func (a *Admission) group(services []*model.ServicePort, from int) (to, cost int, reason string) {
	lim := a.policy.Limits
	first := services[from]
	fronts, eps := 0, 0
	for to = from; to < len(services) && services[to].Name.Namespace == first.Name.Namespace && services[to].Name.Name == first.Name.Name; to++ {
		sp := services[to]
		fronts += len(sp.ClusterIPs) + len(sp.ExternalIPs) + len(sp.LoadBalancerIPs)
		eps += len(sp.Endpoints)
		cost += a.cost(sp)
		if n := len(sp.SourceRanges); lim.MaxSourceRangesPerService > 0 && n > lim.MaxSourceRangesPerService && reason == "" {
			reason = fmt.Sprintf("%d loadBalancerSourceRanges, more than --max-source-ranges-per-service=%d: the Service is not programmed",
				n, lim.MaxSourceRangesPerService)
		}
		if n := len(sp.Endpoints); lim.MaxEndpointsPerServicePort > 0 && n > lim.MaxEndpointsPerServicePort && reason == "" {
			reason = fmt.Sprintf("port %q has %d endpoints, more than --max-endpoints-per-service-port=%d: the Service is not programmed",
				sp.Name.Port, n, lim.MaxEndpointsPerServicePort)
		}
	}
	if lim.MaxEndpointsPerService > 0 && eps > lim.MaxEndpointsPerService && reason == "" {
		reason = fmt.Sprintf("%d endpoints over its ports in total, more than --max-endpoints-per-service=%d: the Service is not programmed",
			eps, lim.MaxEndpointsPerService)
	}
	if lim.MaxFrontendsPerService > 0 && fronts > lim.MaxFrontendsPerService {
		reason = fmt.Sprintf("%d frontends (ports × cluster, external and load-balancer IPs), more than --max-frontends-per-service=%d: the Service is not programmed",
			fronts, lim.MaxFrontendsPerService)
	}
	return to, cost, reason
}

// overShare is the reason given to a Service its namespace's share leaves out. It says
// nothing about other namespaces: not the share (which depends on what they use), not
// what is left of the budget, no name.
func overShare(cost int) string {
	return fmt.Sprintf("its namespace needs more than its share of the table's element budget (--max-table-elements), and this Service, among its newest, needs about %d elements: the Service is not programmed", cost)
}

// setAside marks the ports of the Services the limits set aside (stateAside), reports
// each Service once (by the Admission of its first cluster IP's family), and returns
// their names, sorted. Services over a limit of their own go first. If the others
// together exceed the element budget, it is shared between namespaces max-min fair
// (fairShares): a namespace that needs no more than its share keeps all its Services,
// and in a namespace over it the oldest Services (then by name) are admitted while they
// fit in the share; what the shares leave unused goes to the remaining Services of those
// namespaces, oldest first. changes (see Admission.diff) bring the budget up to date;
// over the element budget it walks the namespaces over their share, never the others.
func (a *Admission) setAside(services []*model.ServicePort, changes []portChange, state []uint8) []serviceName {
	lim := a.policy.Limits
	if lim == (Limits{}) {
		return nil
	}
	b := &a.budget
	if b.over == nil {
		b.over, b.ns = map[serviceName]string{}, map[string]int{}
	}
	if len(changes) > len(services)/32 { // many (the first call): one walk, counting anew
		clear(b.over)
		clear(b.ns)
		b.total = 0
		for from := 0; from < len(services); {
			to, cost, reason := a.group(services, from)
			if reason != "" {
				b.over[nameOf(services[from])] = reason
			}
			b.total += cost
			b.ns[services[from].Name.Namespace] += cost
			from = to
		}
	} else {
		// the costs of the changes, and their Services (in name order, as the changes
		// are) looked at again, each once
		var last serviceName
		for _, ch := range changes {
			if ch.old != nil {
				b.add(ch.old.Name.Namespace, -a.cost(ch.old))
			}
			if ch.new != nil {
				b.add(ch.new.Name.Namespace, a.cost(ch.new))
			}
			for _, sp := range [2]*model.ServicePort{ch.old, ch.new} {
				if sp == nil || nameOf(sp) == last { // a Service's name is never empty
					continue
				}
				n := nameOf(sp)
				last = n
				delete(b.over, n)
				if from := groupStart(services, n); from < len(services) && nameOf(services[from]) == n {
					if _, _, reason := a.group(services, from); reason != "" {
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
	var nsOver map[string]int // the cost of each namespace's Services over a limit of their own
	for _, n := range names {
		from := groupStart(services, n)
		to, cost, _ := a.group(services, from)
		overCost += cost
		if nsOver == nil {
			nsOver = map[string]int{}
		}
		nsOver[n.ns] += cost
		a.setAsideGroup(services, from, to, state, b.over[n])
	}
	if lim.MaxElements <= 0 || b.total-overCost <= lim.MaxElements {
		return names
	}

	// over budget: each namespace's demand is what its admissible Services cost
	demands := make([]nsDemand, 0, len(b.ns))
	for ns, cost := range b.ns {
		if d := cost - nsOver[ns]; d > 0 {
			demands = append(demands, nsDemand{ns, d})
		}
	}
	share, used, over := fairShares(demands, lim.MaxElements) // used: what the namespaces within their share take
	// in each namespace over its share, the oldest Services first (then by name), the
	// same choice on every node and after every restart
	type group struct {
		from, to, cost int
		admitted       bool
	}
	var rest []group // those the shares leave out, of every such namespace
	for _, ns := range over {
		var groups []group
		end := sort.Search(len(services), func(i int) bool { return services[i].Name.Namespace > ns })
		for from := groupStart(services, serviceName{ns: ns}); from < end; {
			to, cost, _ := a.group(services, from)
			if _, aside := b.over[nameOf(services[from])]; !aside {
				groups = append(groups, group{from: from, to: to, cost: cost})
			}
			from = to
		}
		slices.SortStableFunc(groups, func(a, b group) int { return services[a.from].Created.Compare(services[b.from].Created) })
		taken := 0
		for i := range groups {
			if taken+groups[i].cost <= share {
				taken += groups[i].cost
				groups[i].admitted = true
			}
		}
		used += taken
		for _, g := range groups {
			if !g.admitted {
				rest = append(rest, g)
			}
		}
	}
	// what the shares leave unused (a Service is admitted whole or not at all): to the
	// rest, oldest first
	slices.SortStableFunc(rest, func(a, b group) int {
		return cmp.Or(services[a.from].Created.Compare(services[b.from].Created), compareServiceNames(nameOf(services[a.from]), nameOf(services[b.from])))
	})
	for _, g := range rest {
		if used+g.cost <= lim.MaxElements {
			used += g.cost
			continue
		}
		a.setAsideGroup(services, g.from, g.to, state, overShare(g.cost))
		names = append(names, nameOf(services[g.from]))
	}
	slices.SortFunc(names, compareServiceNames)
	return names
}

// add adds cost to namespace ns (and to the total), forgetting a namespace at zero.
func (b *budget) add(ns string, cost int) {
	b.total += cost
	if n := b.ns[ns] + cost; n != 0 {
		b.ns[ns] = n
	} else {
		delete(b.ns, ns)
	}
}

// nsDemand is what a namespace's admissible Services cost.
type nsDemand struct {
	ns   string
	cost int
}

// fairShares shares total elements between the namespaces' demands, max-min fair
// (water filling): a namespace that needs no more than an equal part of what the
// smaller ones leave gets all it needs; each of the others gets share. It returns share,
// what the namespaces within it take together, and the namespaces over it, sorted. With
// n namespaces each gets at least total/n (or all it needs), whatever the others do.
// The demands are sorted in place.
func fairShares(demands []nsDemand, total int) (share, within int, over []string) {
	slices.SortFunc(demands, func(a, b nsDemand) int { return cmp.Or(cmp.Compare(a.cost, b.cost), cmp.Compare(a.ns, b.ns)) })
	for i, d := range demands {
		k := len(demands) - i
		if d.cost*k <= total-within { // no more than an equal part of what is left: all of it
			within += d.cost
			continue
		}
		// this one and all larger ones are over: each gets an equal part
		for _, o := range demands[i:] {
			over = append(over, o.ns)
		}
		slices.Sort(over)
		return (total - within) / k, within, over
	}
	return total - within, within, nil
}

func (a *Admission) setAsideGroup(services []*model.ServicePort, from, to int, state []uint8, reason string) {
	for k := from; k < to; k++ {
		state[k] |= stateAside
	}
	sp := services[from]
	if len(sp.ClusterIPs) > 0 && sp.ClusterIPs[0].Is6() == a.v6 {
		a.problems = append(a.problems, model.Problem{Kind: model.KindService, Namespace: sp.Name.Namespace, Name: sp.Name.Name, Reason: reason})
	}
}
