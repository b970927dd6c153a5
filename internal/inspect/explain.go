package inspect

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/trace"
)

// Question is what explain is asked: the first packet of a new connection to Dest.
type Question struct {
	Dest  netip.AddrPort
	Proto uint8
	// From is the client address; "": a pod (an address in the cluster CIDR), or the
	// node with Local.
	From string
	// Local: the packet is sent by a process on the node (hook output) instead of
	// arriving from the network.
	Local bool
	// Rules: also print the rules each packet goes through.
	Rules bool
}

// Compiled is what the proxy compiles from one listing of the API with its
// configuration.
type Compiled struct {
	Snapshot *model.Snapshot
	Rulesets []*nft.Ruleset
	Problems []model.Problem
	// DetectLocal and NoExternalIPs are the proxy's configuration's: how a pod's
	// traffic is told from other traffic, and the feature gate
	// AllowServiceExternalIPs=false.
	DetectLocal   compile.DetectLocal
	NoExternalIPs bool
}

// Explain traces q's packet through the rulesets of c and writes what the dataplane
// does with it, and why.
func Explain(w io.Writer, q Question, c Compiled) error {
	snap := c.Snapshot
	pkt, sc, err := packetFor(q, c.DetectLocal, snap)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(c.Rulesets, func(rs *nft.Ruleset) bool { return rs.Family == pkt.Family })
	if i < 0 {
		return fmt.Errorf("no %s ruleset", pkt.Family)
	}
	res, err := trace.Trace(c.Rulesets[i], pkt, trace.Context{SaddrLocal: q.Local, IsLocal: nodeAddr(snap, pkt, q.Local)})
	if err != nil {
		return err
	}
	sc.rules, sc.noExternalIPs = q.Rules, c.NoExternalIPs
	sc.services, sc.nodeIPs = frontends(snap), snap.Node.IPs
	sc.problems = problemsOf(c.Problems, sc.services[pkt.Daddr])
	formatResult(w, res, sc)
	return nil
}

// ParseDest parses "ip:port[/proto]" ("[v6]:port" for IPv6); the protocol defaults to tcp.
func ParseDest(s string) (netip.AddrPort, uint8, error) {
	addr, protoName, _ := strings.Cut(s, "/")
	protos := map[string]uint8{"": model.ProtoTCP, "tcp": model.ProtoTCP, "udp": model.ProtoUDP, "sctp": model.ProtoSCTP}
	proto, ok := protos[strings.ToLower(protoName)]
	if !ok {
		return netip.AddrPort{}, 0, fmt.Errorf("%q: protocol %q is not tcp, udp or sctp", s, protoName)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, 0, fmt.Errorf("%q is not ip:port[/tcp|udp|sctp] ([ip]:port for IPv6)", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), proto, nil
}

// packetFor builds the traced packet; the scene it returns says how the source was chosen.
func packetFor(q Question, detectLocal compile.DetectLocal, snap *model.Snapshot) (trace.Packet, scene, error) {
	dest := q.Dest
	v6 := dest.Addr().Is6()
	pkt := trace.Packet{Family: nft.IPv4, Daddr: dest.Addr(), Dport: dest.Port(), L4Proto: q.Proto, Hook: nft.Prerouting}
	if v6 {
		pkt.Family = nft.IPv6
	}
	if q.Local {
		pkt.Hook = nft.Output
	}
	var sc scene
	switch {
	case q.From != "":
		a, err := netip.ParseAddr(q.From)
		if err != nil || a.Unmap().Is6() != v6 {
			return pkt, sc, fmt.Errorf("--from %q is not an %s address like the destination", q.From, pkt.Family)
		}
		pkt.Saddr = a.Unmap()
	case q.Local:
		ips := model.AddrsOf(snap.Node.IPs, v6)
		if len(ips) == 0 {
			return pkt, sc, fmt.Errorf("the Node object has no %s address: give the node's address with --from", pkt.Family)
		}
		pkt.Saddr, sc.source = ips[0], "the node"
	default:
		// a pod: an address in the cluster CIDR (ClusterCIDR mode) or the node's pod
		// CIDR (other modes), coming in through the pod interface (interface modes)
		cidrs, what := detectLocal.ClusterCIDRs, "--cluster-cidr"
		if detectLocal.Mode != compile.LocalClusterCIDR && detectLocal.Mode != "" {
			cidrs, what = snap.Node.PodCIDRs, "pod CIDR on the Node object"
		}
		for _, c := range cidrs {
			if c.Addr().Is6() == v6 {
				pkt.Saddr, sc.source = c.Masked().Addr().Next(), "a pod"
			}
		}
		if !pkt.Saddr.IsValid() {
			return pkt, sc, fmt.Errorf("no %s %s to pick a pod address from: give the client address with --from", pkt.Family, what)
		}
		switch detectLocal.Mode {
		case compile.LocalBridgeInterface:
			pkt.Iifname = detectLocal.Interface
		case compile.LocalInterfaceNamePrefix:
			pkt.Iifname = detectLocal.Interface + "0"
		}
	}
	return pkt, sc, nil
}

// nodeAddr reports the node's addresses: those of its Node object, loopback, and the
// source of a locally generated packet.
func nodeAddr(snap *model.Snapshot, pkt trace.Packet, local bool) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		for _, ip := range snap.Node.IPs {
			if a == ip {
				return true
			}
		}
		return a.IsLoopback() || (local && a == pkt.Saddr)
	}
}

// frontends lists, by address, the service ports using it (cluster, external and
// load-balancer IPs), for packets that no rule attributes to a service.
func frontends(snap *model.Snapshot) map[netip.Addr][]servicePortAt {
	out := map[netip.Addr][]servicePortAt{}
	for _, sp := range snap.Services {
		f := servicePortAt{service: sp.Name.Namespace + "/" + sp.Name.Name, port: fmt.Sprintf("%d/%s", sp.Port, model.ProtoString(sp.Name.Protocol))}
		for k, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			f.externalIP = k == 1
			for _, a := range list {
				out[a] = append(out[a], f)
			}
		}
	}
	return out
}

// problemsOf returns the ignored input about the given services.
func problemsOf(problems []model.Problem, fs []servicePortAt) []string {
	var out []string
	for _, p := range problems {
		for _, f := range fs {
			if p.Kind == model.KindService && p.Namespace+"/"+p.Name == f.service {
				out = append(out, p.String())
				break
			}
		}
	}
	return out
}

// servicePortAt is a service port using an address.
type servicePortAt struct {
	service    string // namespace/name
	port       string // "80/TCP"
	externalIP bool   // the address is one of the service's externalIPs
}

// scene is what the explanation says besides the trace.
type scene struct {
	source   string // how the source address was chosen ("a pod", "the node"); "" if given
	services map[netip.Addr][]servicePortAt
	nodeIPs  []netip.Addr
	problems []string // ignored input about the services using the destination address
	rules    bool     // print each outcome's rules
	// noExternalIPs: the feature gate AllowServiceExternalIPs is false
	noExternalIPs bool
}

// formatResult writes the explanation of res for humans.
func formatResult(w io.Writer, res *trace.Result, sc scene) {
	p := res.Packet
	source := p.Saddr.String()
	if sc.source != "" {
		source += " (" + sc.source + ")"
	}
	where := "arriving from the network"
	if p.Hook == nft.Output {
		where = "sent by the node itself"
	}
	fmt.Fprintf(w, "%s %s → %s, %s\n", nft.ProtoName(p.L4Proto), source, netip.AddrPortFrom(p.Daddr, p.Dport), where)
	if svc := serviceOfResult(res); svc != "" {
		fmt.Fprintf(w, "service %s\n", svc)
	}
	for _, o := range res.Outcomes {
		line := outcomeLine(o, p, sc)
		if len(res.Outcomes) > 1 {
			line = fmt.Sprintf("%6s  %s", fmt.Sprintf("%.3g%%", o.Probability*100), line)
		}
		fmt.Fprintf(w, "  %s\n", line)
		if sc.rules {
			writePath(w, o)
		}
	}
	if hasAffinity(res) {
		fmt.Fprintln(w, "note: session affinity (ClientIP): a client seen recently goes back to its endpoint; these are a new client's chances")
	}
	for _, pr := range sc.problems {
		fmt.Fprintf(w, "note: ignored: %s\n", pr)
	}
}

// hasAffinity reports whether a packet's path records the client for session affinity.
func hasAffinity(res *trace.Result) bool {
	for _, o := range res.Outcomes {
		for _, s := range o.Path {
			if purpose.Of(s.Rule.Tag) == purpose.AffinityRecord {
				return true
			}
		}
	}
	return false
}

func writePath(w io.Writer, o trace.Outcome) {
	for _, s := range o.Path {
		fmt.Fprintf(w, "        %s: %s\n", s.Chain, s.Text)
		for _, m := range s.Matched {
			fmt.Fprintf(w, "          @%s: %s\n", m.Set.Name, m.Text)
		}
	}
}

// outcomeLine is one outcome in words: where the packet goes, or why it does not.
func outcomeLine(o trace.Outcome, p trace.Packet, sc scene) string {
	if !o.DNAT.IsValid() && serviceOf(o) == "" {
		if why := unprogrammed(p, sc); why != "" {
			verb := map[trace.Verdict]string{trace.Drop: "dropped", trace.Reject: "rejected"}[o.Verdict]
			if verb == "" {
				verb = "not translated"
			}
			return verb + ": " + why
		}
	}
	var line string
	switch {
	case o.Verdict == trace.Drop:
		return "dropped: " + dropReason(o, p, sc)
	case o.Verdict == trace.Reject:
		return "rejected: " + rejectReason(o, p, sc)
	case o.DNAT.IsValid():
		line = "→ " + o.DNAT.String()
	default:
		line = "not translated: " + untouchedReason(o, p, sc)
	}
	if o.Masquerade {
		return line + ", masqueraded: " + masqueradeReason(o)
	}
	if o.DNAT.IsValid() {
		return line + ", client address kept"
	}
	return line
}

// serviceOf names the service port an outcome went through, from the compiler's tags:
// of the verdict-map entry that routed it (a chained service port), else of the frontend
// element it matched (the flat path), else of its DNAT rule or the endpoint entry that
// DNAT read, else of any element it matched.
func serviceOf(o trace.Outcome) string {
	if m, ok := lastVerdictEntry(o); ok {
		if sp, ok := purpose.ServicePortOf(m.Element.Tag); ok {
			return sp.String()
		}
	}
	for _, p := range []purpose.Purpose{purpose.Frontend, purpose.RejectNoEndpoints, purpose.DropNoLocalEndpoints} {
		if m, ok := lastMatchOf(o, p); ok {
			if sp, ok := purpose.ServicePortOf(m.Element.Tag); ok {
				return sp.String()
			}
		}
	}
	for _, s := range o.Path {
		if purpose.Of(s.Rule.Tag) == purpose.EndpointDNAT {
			if sp, ok := purpose.ServicePortOf(s.Rule.Tag); ok {
				return sp.String()
			}
			for _, m := range s.Matched { // the flat path's shared DNAT rule: the entry it read
				if sp, ok := purpose.ServicePortOf(m.Element.Tag); ok {
					return sp.String()
				}
			}
		}
	}
	for _, s := range o.Path {
		for _, m := range s.Matched {
			if sp, ok := purpose.ServicePortOf(m.Element.Tag); ok {
				return sp.String()
			}
		}
	}
	return ""
}

// lastMatchOf returns the last element with purpose p that the outcome's packet matched:
// a set lookup's, a verdict map's or a NAT map's.
func lastMatchOf(o trace.Outcome, p purpose.Purpose) (trace.Match, bool) {
	for i := len(o.Path) - 1; i >= 0; i-- {
		ms := o.Path[i].Matched
		for j := len(ms) - 1; j >= 0; j-- {
			if purpose.Of(ms[j].Element.Tag) == p {
				return ms[j], true
			}
		}
	}
	return trace.Match{}, false
}

// lastVerdictEntry returns the last verdict-map entry the outcome's packet matched.
func lastVerdictEntry(o trace.Outcome) (trace.Match, bool) {
	for i := len(o.Path) - 1; i >= 0; i-- {
		ms := o.Path[i].Matched
		for j := len(ms) - 1; j >= 0; j-- {
			if ms[j].Element.Verdict != nil {
				return ms[j], true
			}
		}
	}
	return trace.Match{}, false
}

func serviceOfResult(res *trace.Result) string {
	for _, o := range res.Outcomes {
		if svc := serviceOf(o); svc != "" {
			return svc
		}
	}
	return ""
}

// masqueradeReason says why an outcome is masqueraded: the masquerading rule itself
// (hairpin), or the rule that marked the packet for it.
func masqueradeReason(o trace.Outcome) string {
	for _, s := range o.Path {
		if purpose.Of(s.Rule.Tag) == purpose.Hairpin {
			return "hairpin: the client is the endpoint itself, so the reply must come back through the service"
		}
	}
	for _, s := range o.Path {
		switch purpose.Of(s.Rule.Tag) {
		case purpose.MarkOffCluster:
			for _, st := range s.Rule.Stmts {
				if m, ok := st.(nft.MatchPrefix); ok && m.Field == nft.FieldSaddr {
					return fmt.Sprintf("the source is outside the cluster CIDR %s", m.Prefix)
				}
				if m, ok := st.(nft.MatchIifname); ok { // --detect-local-mode with interfaces
					name := m.Name
					if m.Prefix {
						name += "*"
					}
					return fmt.Sprintf("the packet did not come in through the pods' interface %s (--detect-local-mode)", name)
				}
			}
			return "the source is outside the cluster CIDR"
		case purpose.MarkLocalSource:
			return "the client is the node itself"
		case purpose.MarkExternal:
			return "external traffic (node port, external or load-balancer IP) may go to an endpoint on another node, whose reply must come back through this one"
		case purpose.MarkAll:
			return "--masquerade-all"
		}
	}
	return "by the masquerading rules"
}

// rejectReason: a service frontend routed to reject (no endpoints: its element of a
// no-endpoint set, or of a verdict map, is among the matches), or a cluster IP
// port that no service defines.
func rejectReason(o trace.Outcome, p trace.Packet, sc scene) string {
	if _, ok := lastMatchOf(o, purpose.RejectNoEndpoints); ok {
		return "no endpoints: the service has no ready endpoints"
	}
	last := o.Path[len(o.Path)-1]
	if purpose.Of(last.Rule.Tag) == purpose.UndefinedPort {
		return notAPort(p, sc)
	}
	return fmt.Sprintf("by rule %q in chain %s", last.Text, last.Chain)
}

// dropReason: a Local traffic policy without local endpoints, a source outside
// loadBalancerSourceRanges, or an unallocated service IP.
func dropReason(o trace.Outcome, p trace.Packet, sc scene) string {
	last := o.Path[len(o.Path)-1]
	if _, ok := lastMatchOf(o, purpose.DropNoLocalEndpoints); ok {
		return "no local endpoints: the service's traffic policy for this traffic is Local and none of its ready endpoints runs on this node"
	}
	switch purpose.Of(last.Rule.Tag) {
	case purpose.SourceRangeDrop:
		return fmt.Sprintf("the source %s is not in the service's loadBalancerSourceRanges", p.Saddr)
	case purpose.UnallocatedServiceIP:
		if m, ok := nft.StmtOf[nft.MatchPrefix](last.Rule); ok && len(sc.services[p.Daddr]) == 0 {
			return fmt.Sprintf("no service uses this address (an unallocated address of the service CIDR %s)", m.Prefix)
		}
	}
	return fmt.Sprintf("by rule %q in chain %s", last.Text, last.Chain)
}

// untouchedReason: no rule picked the packet up.
func untouchedReason(o trace.Outcome, p trace.Packet, sc scene) string {
	if len(sc.services[p.Daddr]) > 0 {
		return notAPort(p, sc) + "; nftproxy leaves the packet alone"
	}
	if slices.Contains(sc.nodeIPs, p.Daddr) {
		return fmt.Sprintf("no node port %d/%s; nftproxy leaves the packet to the node", p.Dport, model.ProtoString(p.L4Proto))
	}
	return "no service uses this address; nftproxy leaves the packet alone"
}

// unprogrammed says why no rule picked up a packet to a port that a service does have at
// the destination address: the proxy does not program it. "" if no service has it.
func unprogrammed(p trace.Packet, sc scene) string {
	port := fmt.Sprintf("%d/%s", p.Dport, model.ProtoString(p.L4Proto))
	for _, f := range sc.services[p.Daddr] {
		if f.port != port {
			continue
		}
		why := "see the ignored input below"
		switch {
		case f.externalIP && sc.noExternalIPs:
			why = "the feature gate AllowServiceExternalIPs is false, so no externalIP is programmed"
		case len(sc.problems) == 0:
			why = "nftproxy does not program it"
		}
		return fmt.Sprintf("service %s's port %s at this address is not programmed: %s", f.service, port, why)
	}
	return ""
}

// notAPort says which ports the services at the destination address do have.
func notAPort(p trace.Packet, sc scene) string {
	fs := sc.services[p.Daddr]
	if len(fs) == 0 {
		return "no service uses this address"
	}
	var names []string
	ports := map[string][]string{}
	for _, f := range fs {
		if ports[f.service] == nil {
			names = append(names, f.service)
		}
		ports[f.service] = append(ports[f.service], f.port)
	}
	for i, n := range names {
		names[i] = fmt.Sprintf("%s (%s)", n, strings.Join(ports[n], ", "))
	}
	return fmt.Sprintf("port %d/%s is not a port of service %s", p.Dport, model.ProtoString(p.L4Proto), strings.Join(names, ", "))
}
