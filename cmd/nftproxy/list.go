package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// nftproxy list shows what is programmed, read from the kernel's tables, not what the API
// says should be: every service port's frontends, where each one leads (endpoints with
// the probability of being picked, reject, drop) and the traffic policy and session
// affinity the rules implement. It needs no API access and no flags.

// Names of the objects of nftproxy's table (internal/compile) that the listing reads.
const (
	listClusterIPs         = "cluster-ips"
	listServiceIPs         = "service-ips"
	listServiceNodePorts   = "service-nodeports"
	listNoEndpointServices = "no-endpoint-services"
	listNoEndpointNodePort = "no-endpoint-nodeports"
	listNoLocalServices    = "no-local-endpoint-services"
	listNoLocalNodePorts   = "no-local-endpoint-nodeports"
	// the flat path: frontends in sets, their endpoints in maps keyed by frontend . index,
	// their endpoint counts in binary in the count-bit sets
	listClusterFrontends  = "cluster-frontends"
	listExternalFrontends = "external-frontends"
	listNodePortFrontends = "nodeport-frontends"
	listEndpoints         = "endpoints"
	listNodePortEndpoints = "nodeport-endpoints"
	listEndpointCountBit  = "endpoint-count-bit"
	listNodePortCountBit  = "nodeport-endpoint-count-bit"
	listCountBits         = 8
	listFirewallIPs       = "firewall-ips"
	listMarkMasq          = "mark-for-masquerade"
)

// Frontend types.
const (
	frontendClusterIP = "ClusterIP"
	frontendExternal  = "External" // an external or load-balancer IP: the table does not tell them apart
	frontendNodePort  = "NodePort"
)

// tableReader reads a table back from the kernel (readback.Reader; an encoded ruleset in tests).
type tableReader interface {
	ReadBack(fam nft.Family, table string) (*wire.TableState, error)
}

// listedPort is one service port as programmed in one family's table.
type listedPort struct {
	Service   string           `json:"service"` // namespace/name:port, as in the rules' comments
	Protocol  string           `json:"protocol"`
	Family    string           `json:"family"` // ip or ip6
	Frontends []listedFrontend `json:"frontends"`
	proto     uint8            // for sorting
	byKey     map[string]int   // frontend key → index
}

// listedFrontend is one address and port that reaches the service, and where it leads.
type listedFrontend struct {
	Type    string `json:"type"`              // ClusterIP, External, NodePort
	Address string `json:"address,omitempty"` // empty for a node port: every address of the nodeport-ips set
	Port    uint16 `json:"port"`
	// Action is "dnat" (to the endpoints), "reject" (no endpoints) or "drop" (a Local
	// traffic policy without endpoints on this node).
	Action string `json:"action"`
	// TrafficPolicy is Local when only endpoints on this node are used, Cluster otherwise.
	TrafficPolicy string `json:"trafficPolicy,omitempty"`
	// AffinityTimeoutSeconds is the ClientIP session affinity timeout; 0: none.
	AffinityTimeoutSeconds uint32 `json:"affinityTimeoutSeconds,omitempty"`
	// SourceRanges are the client prefixes a load-balancer IP admits (others are
	// dropped); empty: everyone.
	SourceRanges []string         `json:"sourceRanges,omitempty"`
	Endpoints    []listedEndpoint `json:"endpoints,omitempty"`
	// Shadowed are the addresses where this frontend gets no new connections because
	// another service port's frontend on the same address and port wins in the
	// kernel's rules (an external IP on a node address at another Service's node port).
	Shadowed []listedShadow `json:"shadowed,omitempty"`
}

// listedEndpoint is one endpoint a frontend can lead to.
type listedEndpoint struct {
	Address     string  `json:"address"` // address:port
	Probability float64 `json:"probability"`
	// Local is set for endpoints reached through a Local traffic policy's chain: they
	// run on this node.
	Local bool `json:"local,omitempty"`
}

// runList implements "nftproxy list [-o text|json]".
func runList(args []string, stdout, stderr io.Writer) int {
	return listCommand(args, readback.Reader{}, stdout, stderr)
}

func listCommand(args []string, r tableReader, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("nftproxy list", pflag.ContinueOnError)
	output := fs.StringP("output", "o", "text", "Output format: text (an aligned table) or json.")
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: nftproxy list [flags]\n\n"+
			"Lists every service port programmed in nftproxy's tables in the kernel (the ip and\n"+
			"ip6 tables \"nftproxy\"): its frontends (cluster IPs, external and load-balancer\n"+
			"IPs, node ports) and the endpoints each leads to with the probability of being\n"+
			"picked, the traffic policy and the session affinity. Needs no kubeconfig; needs\n"+
			"CAP_NET_ADMIN in the node's network namespace. Exits 1 when no table is found.\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "nftproxy list:", err)
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "nftproxy list: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "nftproxy list: --output %q: want text or json\n", *output)
		return 2
	}
	var all []listedPort
	found := 0
	for _, fam := range pipeline.Families {
		st, err := r.ReadBack(fam, compile.TableName)
		if err != nil {
			fmt.Fprintf(stderr, "nftproxy list: reading %s %s from the kernel: %v\n", fam, compile.TableName, err)
			return 2
		}
		if !st.Exists {
			continue
		}
		found++
		rs, undecoded := wire.Decode(st)
		for _, u := range undecoded {
			fmt.Fprintf(stderr, "nftproxy list: %s %s: %s is not a rule nftproxy writes; ignored\n", fam, compile.TableName, u)
		}
		all = append(all, listServices(rs)...)
	}
	if found == 0 {
		fmt.Fprintf(stderr, "nftproxy list: no %s table in the kernel (is nftproxy running on this node, in this network namespace?)\n", compile.TableName)
		return 1
	}
	sortPorts(all)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if all == nil {
			all = []listedPort{}
		}
		if err := enc.Encode(all); err != nil {
			fmt.Fprintln(stderr, "nftproxy list:", err)
			return 2
		}
		return 0
	}
	if err := formatList(stdout, all); err != nil {
		fmt.Fprintln(stderr, "nftproxy list:", err)
		return 2
	}
	return 0
}

// listServices reads the service ports out of one family's decoded table.
func listServices(rs *nft.Ruleset) []listedPort {
	sets := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	chains := map[string]*nft.Chain{}
	for _, c := range rs.Chains {
		chains[c.Name] = c
	}
	clusterIPs := map[netip.Addr]bool{}
	if s := sets[listClusterIPs]; s != nil {
		for _, e := range s.Elements {
			if len(e.Key) == 1 {
				clusterIPs[e.Key[0].Addr()] = true
			}
		}
	}
	ports := map[string]*listedPort{}
	port := func(comment string, proto uint8) *listedPort {
		k := comment + "|" + strconv.Itoa(int(proto))
		p := ports[k]
		if p == nil {
			p = &listedPort{Service: comment, Protocol: strings.ToLower(model.ProtoString(proto)), Family: rs.Family.String(), proto: proto, byKey: map[string]int{}}
			ports[k] = p
		}
		return p
	}
	// frontend returns the service port's frontend for a map key (address . proto . port,
	// or proto . port for a node port); typ is its type when the set it is in says so,
	// else "" (an address is a cluster IP when it is in the cluster IP set).
	frontend := func(e nft.Element, typ string) *listedFrontend {
		var f listedFrontend
		var proto uint8
		switch len(e.Key) {
		case 3:
			a := e.Key[0].Addr()
			f.Address, proto, f.Port = a.String(), uint8(e.Key[1].Num()), uint16(e.Key[2].Num())
			f.Type = frontendExternal
			if clusterIPs[a] {
				f.Type = frontendClusterIP
			}
			if typ != "" {
				f.Type = typ
			}
		case 2:
			f.Type, proto, f.Port = frontendNodePort, uint8(e.Key[0].Num()), uint16(e.Key[1].Num())
		default:
			return nil
		}
		p := port(e.Comment, proto)
		k := f.Type + " " + f.Address + " " + strconv.Itoa(int(f.Port))
		i, ok := p.byKey[k]
		if !ok {
			i = len(p.Frontends)
			p.byKey[k] = i
			p.Frontends = append(p.Frontends, f)
		}
		return &p.Frontends[i]
	}
	// the flat path's frontends, whose endpoints are entries of the endpoint maps
	flat := &flatEndpoints{sets: sets}
	for name, typ := range map[string]string{listClusterFrontends: frontendClusterIP, listExternalFrontends: frontendExternal, listNodePortFrontends: frontendNodePort} {
		s := sets[name]
		if s == nil {
			continue
		}
		for _, e := range s.Elements {
			f := frontend(e, typ)
			if f == nil {
				continue
			}
			f.Action, f.TrafficPolicy, f.AffinityTimeoutSeconds = "dnat", "Cluster", 0
			f.Endpoints = flat.of(e.Key)
		}
	}
	// chained service ports' verdict maps, then the no-endpoint sets (verdict maps in
	// tables of older versions), which win: the filter chains apply them before the nat
	// chains see the packet
	for _, name := range []string{listServiceIPs, listServiceNodePorts, listNoEndpointServices, listNoEndpointNodePort, listNoLocalServices, listNoLocalNodePorts} {
		s := sets[name]
		if s == nil {
			continue
		}
		for _, e := range s.Elements {
			f := frontend(e, "")
			if f == nil {
				continue
			}
			v := e.Verdict
			if v == nil {
				switch name {
				case listNoEndpointServices, listNoEndpointNodePort:
					v = &nft.Verdict{Kind: nft.Goto, Chain: compile.ChainReject}
				case listNoLocalServices, listNoLocalNodePorts:
					v = &nft.Verdict{Kind: nft.Drop}
				default:
					continue
				}
			}
			f.Endpoints, f.TrafficPolicy, f.AffinityTimeoutSeconds = nil, "", 0
			switch {
			case v.Kind == nft.Drop:
				f.Action = "drop"
				f.TrafficPolicy = "Local"
			case v.Chain == compile.ChainReject:
				f.Action = "reject"
			case v.Kind == nft.Goto || v.Kind == nft.Jump:
				f.Action = "dnat"
				w := &walker{rs: rs, sets: sets, chains: chains, policy: "Cluster"}
				w.walk(v.Chain, 1, false, 0)
				f.Endpoints, f.TrafficPolicy, f.AffinityTimeoutSeconds = w.endpoints(), w.policy, w.affinity
			default:
				f.Action = "verdict " + strconv.Itoa(int(v.Kind))
			}
		}
	}
	if s := sets[listFirewallIPs]; s != nil {
		for _, e := range s.Elements {
			if len(e.Key) != 3 || e.Verdict == nil {
				continue
			}
			f := frontend(e, "")
			if f.Action == "" { // a firewall entry for a frontend without a route
				f.Action = "none"
			}
			f.SourceRanges = []string{} // closed unless a rule admits a range
			if c := chains[e.Verdict.Chain]; c != nil {
				for _, r := range c.Rules {
					if len(r.Stmts) != 2 {
						continue
					}
					if v, ok := r.Stmts[1].(nft.Verdict); !ok || v.Kind != nft.Return {
						continue
					}
					switch m := r.Stmts[0].(type) {
					case nft.MatchPrefix: // a table written by an older nftproxy
						if m.Field == nft.FieldSaddr && m.Op == nft.OpEq {
							f.SourceRanges = append(f.SourceRanges, m.Prefix.String())
						}
					case nft.Lookup: // the interval set of admitted sources
						if rs := sets[m.Set]; rs != nil && rs.Interval && len(m.Fields) == 1 && m.Fields[0] == nft.FieldSaddr {
							for _, el := range rs.Elements {
								f.SourceRanges = append(f.SourceRanges, sourceRange(rs, el))
							}
						}
					}
				}
			}
		}
	}
	(&shadowing{sets: sets, chains: chains}).mark(ports)
	out := make([]listedPort, 0, len(ports))
	for _, p := range ports {
		for i := range p.Frontends {
			if p.Frontends[i].Action == "" {
				p.Frontends[i].Action = "none"
			}
		}
		out = append(out, *p)
	}
	return out
}

// flatEndpoints reads a flat frontend's endpoints: the entries "frontend . i →
// endpoint" of the endpoints (or nodeport-endpoints) map for i below the frontend's
// endpoint count, which the count-bit sets hold in binary, each picked with probability
// 1/count. An index below the count without an entry is listed as a missing slot; a
// table without count-bit sets counts the entries present.
type flatEndpoints struct {
	sets    map[string]*nft.Set
	indexed bool
	entries map[string][]nft.Element // frontend key → its entries, of either map
	counts  map[string]uint32        // frontend key → endpoint count, from the bit sets
	bits    map[string]bool          // the bit set prefixes the table has
}

func (fe *flatEndpoints) of(key []nft.Value) []listedEndpoint {
	if !fe.indexed {
		fe.index()
	}
	k := valuesKey(key)
	entries := fe.entries[k]
	byIndex := make(map[uint32]nft.Element, len(entries))
	for _, e := range entries {
		byIndex[e.Key[len(e.Key)-1].Num()] = e
	}
	bitSet := listEndpointCountBit
	if len(key) == 2 {
		bitSet = listNodePortCountBit
	}
	count := fe.counts[k]
	if !fe.bits[bitSet] {
		count = uint32(len(entries))
	}
	w := &walker{}
	for i := range count {
		p := 1 / float64(count)
		e, ok := byIndex[i]
		if !ok {
			w.add("(missing slot "+strconv.Itoa(int(i))+")", p, false)
			continue
		}
		w.add(netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num())).String(), p, false)
	}
	return w.endpoints()
}

// index reads the endpoint maps and count-bit sets once. Frontend keys of the two kinds
// have different lengths, so one index serves both.
func (fe *flatEndpoints) index() {
	fe.indexed = true
	fe.entries, fe.counts, fe.bits = map[string][]nft.Element{}, map[string]uint32{}, map[string]bool{}
	for _, name := range []string{listEndpoints, listNodePortEndpoints} {
		if m := fe.sets[name]; m != nil {
			for _, e := range m.Elements {
				if n := len(e.Key); n > 1 && len(e.Data) == 2 {
					k := valuesKey(e.Key[:n-1])
					fe.entries[k] = append(fe.entries[k], e)
				}
			}
		}
	}
	for _, prefix := range []string{listEndpointCountBit, listNodePortCountBit} {
		for b := range listCountBits {
			s := fe.sets[prefix+strconv.Itoa(b)]
			if s == nil {
				continue
			}
			fe.bits[prefix] = true
			for _, e := range s.Elements {
				fe.counts[valuesKey(e.Key)] |= 1 << b
			}
		}
	}
}

// valuesKey is a map key for a concatenation of values.
func valuesKey(vs []nft.Value) string {
	var b strings.Builder
	for _, v := range vs {
		if v.Addr().IsValid() {
			b.WriteString(v.Addr().String())
		}
		b.WriteByte('/')
		b.WriteString(strconv.FormatUint(uint64(v.Num()), 10))
		b.WriteByte(' ')
	}
	return b.String()
}

// walker follows a frontend's chain to the endpoints it picks, with the probability of
// each: "numgen random mod N" choices split the remaining probability, a DNAT through
// the slot map spreads it evenly over the slots, a fixed DNAT takes it all. Rules that
// only match some sources (short-circuits for pods and the node itself, affinity
// lookups of clients seen before) do not change who new clients reach and are passed
// over; an affinity lookup records the affinity timeout.
type walker struct {
	rs       *nft.Ruleset
	sets     map[string]*nft.Set
	chains   map[string]*nft.Chain
	got      []listedEndpoint
	policy   string
	affinity uint32
}

const maxWalkDepth = 8

func (w *walker) walk(chain string, p float64, local bool, depth int) {
	c := w.chains[chain]
	if c == nil || depth > maxWalkDepth {
		return
	}
	if strings.HasPrefix(chain, "local-") {
		local = true
		w.policy = "Local"
	}
	rem := p
	for _, r := range c.Rules {
		if rem <= 0 {
			return
		}
		var conditional bool
		var numgen uint32
		for _, s := range r.Stmts {
			switch s := s.(type) {
			case nft.DNATNumgenMap:
				w.slots(s, rem, local)
				return
			case nft.DNATTo:
				w.add(netip.AddrPortFrom(s.Addr, s.Port).String(), rem, local)
				return
			case nft.MatchNumgen:
				numgen = s.Mod
			case nft.Lookup:
				if set := w.sets[s.Set]; set != nil && set.Dynamic {
					w.affinity = set.Timeout
				}
				conditional = true
			case nft.MatchPrefix, nft.MatchIifname, nft.MatchFibSaddrLocal, nft.MatchFibDaddrLocal, nft.MatchMarkUnset, nft.MatchL4Proto:
				conditional = true
			case nft.Verdict:
				switch {
				case s.Kind != nft.Goto && s.Kind != nft.Jump:
					if !conditional && numgen == 0 && s.Kind == nft.Drop {
						return
					}
				case s.Chain == listMarkMasq || conditional:
				case numgen > 0:
					share := rem / float64(numgen)
					w.walk(s.Chain, share, local, depth+1)
					rem -= share
				default:
					w.walk(s.Chain, rem, local, depth+1)
					if s.Kind == nft.Goto {
						return
					}
					rem = 0
				}
			}
		}
	}
}

// slots spreads p over the endpoints at the slots a DNAT through the slot map can pick.
func (w *walker) slots(d nft.DNATNumgenMap, p float64, local bool) {
	set := w.sets[d.Map]
	if set == nil || d.Mod == 0 {
		return
	}
	byKey := map[uint32]nft.Element{}
	for _, e := range set.Elements {
		if len(e.Key) == 1 {
			byKey[e.Key[0].Num()] = e
		}
	}
	for k := d.Offset; k < d.Offset+d.Mod; k++ {
		e, ok := byKey[k]
		if !ok || len(e.Data) != 2 {
			w.add("(missing slot "+strconv.Itoa(int(k))+")", p/float64(d.Mod), local)
			continue
		}
		w.add(netip.AddrPortFrom(e.Data[0].Addr(), uint16(e.Data[1].Num())).String(), p/float64(d.Mod), local)
	}
}

func (w *walker) add(addr string, p float64, local bool) {
	for i := range w.got {
		if w.got[i].Address == addr {
			w.got[i].Probability += p
			w.got[i].Local = w.got[i].Local || local
			return
		}
	}
	w.got = append(w.got, listedEndpoint{Address: addr, Probability: p, Local: local})
}

func (w *walker) endpoints() []listedEndpoint {
	slices.SortFunc(w.got, func(a, b listedEndpoint) int { return strings.Compare(a.Address, b.Address) })
	for i := range w.got { // 1/3 + 1/3 + 1/3 is not quite 1 in floating point
		w.got[i].Probability = float64(int64(w.got[i].Probability*1e6+0.5)) / 1e6
	}
	return w.got
}

var frontendOrder = map[string]int{frontendClusterIP: 0, frontendExternal: 1, frontendNodePort: 2}

// sortPorts orders service ports by name, protocol and family, and each one's frontends
// by type, address and port, so that the output is stable.
func sortPorts(ps []listedPort) {
	for _, p := range ps {
		slices.SortFunc(p.Frontends, func(a, b listedFrontend) int {
			return cmp.Or(cmp.Compare(frontendOrder[a.Type], frontendOrder[b.Type]), compareAddr(a.Address, b.Address), cmp.Compare(a.Port, b.Port))
		})
	}
	slices.SortFunc(ps, func(a, b listedPort) int {
		return cmp.Or(strings.Compare(a.Service, b.Service), cmp.Compare(a.proto, b.proto), strings.Compare(a.Family, b.Family))
	})
}

func compareAddr(a, b string) int {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	if errX != nil || errY != nil {
		return strings.Compare(a, b)
	}
	return x.Compare(y)
}

// formatList writes the text table: one line per frontend and endpoint, the service,
// frontend and policy columns only on a frontend's first line.
func formatList(w io.Writer, ps []listedPort) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tPROTO\tFRONTEND\tTYPE\tPOLICY\tAFFINITY\tENDPOINTS")
	for _, p := range ps {
		for _, f := range p.Frontends {
			addr := "*:" + strconv.Itoa(int(f.Port))
			if f.Address != "" {
				addr = netip.AddrPortFrom(netip.MustParseAddr(f.Address), f.Port).String()
			}
			policy := f.TrafficPolicy
			if policy == "" {
				policy = "-"
			}
			affinity := "-"
			if f.AffinityTimeoutSeconds > 0 {
				affinity = "ClientIP " + strconv.Itoa(int(f.AffinityTimeoutSeconds)) + "s"
			}
			lines := endpointLines(f)
			if f.SourceRanges != nil {
				ranges := "none"
				if len(f.SourceRanges) > 0 {
					ranges = strings.Join(f.SourceRanges, ",")
				}
				lines = append(lines, "(source ranges: "+ranges+")")
			}
			for _, sh := range f.Shadowed {
				if f.Type == frontendNodePort {
					lines = append(lines, "(not on "+sh.Address+": "+sh.By+" takes it, "+sh.ByType+")")
				} else {
					lines = append(lines, "(shadowed: "+sh.By+" takes it, "+sh.ByType+")")
				}
			}
			for i, l := range lines {
				if i == 0 {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Service, p.Protocol, addr, f.Type, policy, affinity, l)
				} else {
					fmt.Fprintf(tw, "\t\t\t\t\t\t%s\n", l)
				}
			}
		}
	}
	return tw.Flush()
}

func endpointLines(f listedFrontend) []string {
	switch f.Action {
	case "reject":
		return []string{"(none: rejected)"}
	case "drop":
		return []string{"(none on this node: dropped)"}
	case "dnat":
	default:
		return []string{"(" + f.Action + ")"}
	}
	if len(f.Endpoints) == 0 {
		return []string{"(none)"}
	}
	var out []string
	for _, e := range f.Endpoints {
		l := fmt.Sprintf("%s %s", e.Address, strconv.FormatFloat(e.Probability*100, 'f', 1, 64)+"%")
		if e.Local {
			l += " local"
		}
		out = append(out, l)
	}
	return out
}

// sourceRange shows a range of a source-range set as a prefix when it is one (a single
// address with its full length, as loadBalancerSourceRanges writes it), else as
// "first-last".
func sourceRange(s *nft.Set, e nft.Element) string {
	if len(e.Key) == 1 && len(e.Data) == 1 {
		if p, ok := nft.RangePrefix(e.Key[0].Addr(), e.Data[0].Addr()); ok {
			return p.String()
		}
	}
	return nft.RenderElementKey(s, e)
}
