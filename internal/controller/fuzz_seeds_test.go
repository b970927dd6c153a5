package controller_test

// The seed corpus: hand-chosen inputs, each covering one kind of hostile content, written
// to testdata/fuzz/<target>/seed-<name> in go's corpus format. TestFuzzSeedCorpus keeps
// the files equal to the definitions below; after changing them (or the input format),
// regenerate with
//
//	go test -run TestFuzzSeedCorpus ./internal/controller/ -update-fuzz-seeds

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

var updateSeeds = flag.Bool("update-fuzz-seeds", false, "rewrite the fuzz seed corpus in testdata/fuzz")

// fuzzTargets are the targets every seed is written for.
var fuzzTargets = []string{"FuzzCompile", "FuzzCompileIncremental"}

// Seed building blocks.

// stdHeader: both cluster CIDRs, node ports on the node's primary IPs, both service
// CIDRs, mark bit 14, node-1 in zone z1 with one address per family.
func stdHeader() header {
	return header{Flags: 2, ClusterCIDRs: 3, NodePortAddrs: 1, ServiceCIDRs: 2, Node: nodeRec{
		Present: 3, Name: at(myNodeNames, "node-1"), Zone: at(nodeZones, "z1"),
		Addrs: [3]nodeAddrRec{{IP: at(nodeIPs, "192.0.2.10")}, {IP: at(nodeIPs, "2001:db8::10")}},
	}}
}

func svc(ns, name string, typ v1.ServiceType, clusterIPs ...string) svcRec {
	r := svcRec{NS: at(namespaces, ns), Name: at(names, name), Type: at(svcTypes, typ)}
	for i, ip := range clusterIPs {
		r.ClusterIPs[i] = at(serviceIPs, ip)
	}
	return r
}

func (r svcRec) port(name string, proto v1.Protocol, port, nodePort int32) svcRec {
	r.Ports[r.NPorts] = portRec{Name: at(portNames, name), Proto: at(protocols, proto), Port: at(ports, port), NodePort: at(nodePorts, nodePort)}
	r.NPorts++
	return r
}

func (r svcRec) external(ips ...string) svcRec {
	for i, ip := range ips {
		r.ExternalIPs[i] = at(serviceIPs, ip)
	}
	return r
}

// ingress adds load-balancer ingress IPs with an ipMode ("" for none).
func (r svcRec) ingress(mode string, ips ...string) svcRec {
	for i, ip := range ips {
		r.Ingress[i] = ingressRec{IP: at(serviceIPs, ip), Mode: at(ingressModes, mode)}
	}
	return r
}

func (r svcRec) policies(etp v1.ServiceExternalTrafficPolicy, itp v1.ServiceInternalTrafficPolicy, hcnp int32) svcRec {
	r.ETP, r.ITP, r.HCNP = at(etps, etp), at(itps, itp), at(hcNodePorts, hcnp)
	return r
}

func (r svcRec) affinity(kind string, timeout int32) svcRec {
	r.Affinity, r.Timeout = at(affinities, kind), at(timeouts, timeout)
	return r
}

func (r svcRec) ranges(rs ...string) svcRec {
	for i, s := range rs {
		r.SourceRanges[i] = at(sourceRanges, s)
	}
	return r
}

func sl(ns, service, name string, typ discovery.AddressType) sliceRec {
	return sliceRec{NS: at(namespaces, ns), Service: at(sliceServices, service), Name: at(sliceNames, name), AddressType: at(addressTypes, typ)}
}

// port adds a slice port; "<nil>" leaves the name or protocol unset, math.MinInt32 the
// port number.
func (r sliceRec) port(name string, proto v1.Protocol, port int32) sliceRec {
	r.Ports[r.NPorts] = slicePortRec{Name: at(slicePortName, name), Proto: at(sliceProtos, proto), Port: at(slicePorts, port)}
	r.NPorts++
	return r
}

// Conditions: each of ready, serving, terminating is nil (0), true (1) or false (2).
const (
	condNil      = 0
	condReady    = 1 + 3*1 + 9*2 // ready, serving, not terminating
	condNotReady = 2 + 3*2 + 9*2
	condDraining = 2 + 3*1 + 9*1 // not ready, serving, terminating
	condGone     = 2 + 3*2 + 9*1 // not ready, not serving, terminating
	condOddNil   = 0 + 3*0 + 9*1 // ready and serving unset, terminating
)

type epOpt struct {
	conds             uint8
	node, zone, hints string
}

var ready = epOpt{conds: condReady, node: "<nil>", zone: "<nil>"}

func (r sliceRec) ep(o epOpt, addrs ...string) sliceRec {
	e := epRec{NAddrs: uint8(len(addrs)), Conds: o.conds, Node: at(nodeNames, o.node), Zone: at(zones, o.zone), Hints: at(hintsKinds, o.hints)}
	for i, a := range addrs {
		e.Addrs[i] = at(endpointIPs, a)
	}
	r.Endpoints[r.NEndpoints] = e
	r.NEndpoints++
	return r
}

// bulk adds n generated endpoints; pattern varies their conditions.
func (r sliceRec) bulk(n int, pattern uint8) sliceRec {
	for i := range 8 {
		if bulkCounts[i] == n {
			r.Bulk = uint8(i) | pattern<<3
			return r
		}
	}
	panic(fmt.Sprintf("no bulk count %d", n))
}

func seed(h header, ops ...func(*encoder)) []byte {
	e := (&encoder{}).write(h)
	for _, op := range ops {
		op(e)
	}
	return e.Bytes()
}

func addSvc(r svcRec) func(*encoder)     { return func(e *encoder) { e.op(opService, r) } }
func addSlice(r sliceRec) func(*encoder) { return func(e *encoder) { e.op(opSlice, r) } }
func delSvc(i uint8) func(*encoder)      { return func(e *encoder) { e.op(opDeleteService, indexRec{i}) } }
func delSlice(i uint8) func(*encoder)    { return func(e *encoder) { e.op(opDeleteSlice, indexRec{i}) } }
func setNode(r nodeRec) func(*encoder)   { return func(e *encoder) { e.op(opNode, r) } }
func syncNow() func(*encoder)            { return func(e *encoder) { e.op(opSync, nil) } }

// web is a ClusterIP service with one named port and a ready endpoint slice.
func web() (svcRec, sliceRec) {
	return svc("default", "web", v1.ServiceTypeClusterIP, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 0),
		sl("default", "web", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2").ep(ready, "10.244.1.3")
}

func seeds() map[string][]byte {
	h := stdHeader()
	webSvc, webSlice := web()
	local := epOpt{conds: condReady, node: "node-1", zone: "z1"}
	remote := epOpt{conds: condReady, node: "node-2", zone: "z2"}
	lb := svc("default", "a", v1.ServiceTypeLoadBalancer, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 30080)
	lbSlices := []func(*encoder){
		addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(local, "10.244.1.2").ep(remote, "10.244.2.2")),
		addSlice(sl("default", "a", "s2", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).ep(local, "fd00:244::2").ep(remote, "fd00:244::3")),
	}
	noNode := h
	noNode.Node = nodeRec{}
	allLocal, garbageNP, masqAll := h, h, h
	allLocal.NodePortAddrs = 4  // 0.0.0.0/0 and ::/0
	garbageNP.NodePortAddrs = 6 // "garbage": the configuration is rejected
	masqAll.Flags, masqAll.ClusterCIDRs, masqAll.ServiceCIDRs, masqAll.MasqBit = 1, 0, 0, 31
	oddNode := h
	oddNode.Node = nodeRec{Present: 4, Name: at(myNodeNames, ""), Zone: at(nodeZones, ""), Addrs: [3]nodeAddrRec{
		{Type: at(nodeAddrTyp, v1.NodeHostName), IP: at(nodeIPs, "garbage")},
		{Type: at(nodeAddrTyp, v1.NodeExternalIP), IP: at(nodeIPs, "::ffff:192.0.2.11")},
		{Type: at(nodeAddrTyp, v1.NodeInternalIP), IP: at(nodeIPs, "fe80::1")},
	}}

	return map[string][]byte{
		"empty":           seed(h),
		"all-zero-header": seed(header{}),
		"clusterip":       seed(h, addSvc(webSvc), addSlice(webSlice)),
		"dual-stack": seed(h,
			addSvc(svc("default", "web", v1.ServiceTypeNodePort, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 30080).external("203.0.113.7", "2001:db8:1::7")),
			addSlice(webSlice),
			addSlice(sl("default", "web", "s2", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).ep(ready, "fd00:244::2").ep(ready, "fd00:244::3"))),
		"ipv4-mapped": seed(h,
			addSvc(svc("default", "web", v1.ServiceTypeClusterIP, "::ffff:10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 0).external("::ffff:10.96.0.1")),
			addSlice(sl("default", "web", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "::ffff:10.244.1.2")),
			addSlice(sl("default", "web", "s2", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).ep(ready, "::ffff:10.244.1.2", "fd00:244::2"))),
		"invalid-ips": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "not-an-ip", "10.96.0.1 ", "010.96.0.1").port("", "", 80, 0)),
			addSvc(svc("default", "b", v1.ServiceTypeNodePort, "10.96.0.1/32", "10.96.0.2").port("", "", 80, 30080).external("not-an-ip", "0.0.0.0")),
			addSlice(sl("default", "b", "s1", discovery.AddressTypeIPv4).port("", v1.ProtocolTCP, 8080).
				ep(ready, "not-an-ip", "10.244.1.2").ep(ready, "").ep(ready).ep(ready, "0.0.0.0"))),
		"odd-addresses": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeLoadBalancer, "0.0.0.0", "::").port("", "", 80, 30080).
				external("255.255.255.255", "224.0.0.1").ingress("VIP", "127.0.0.1", "::1")),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("", v1.ProtocolTCP, 8080).
				ep(ready, "127.0.0.1").ep(ready, "10.96.0.1").ep(ready, "192.0.2.10")),
			addSlice(sl("default", "a", "s2", discovery.AddressTypeIPv6).port("", v1.ProtocolTCP, 8080).ep(ready, "::").ep(ready, "2001:db8::10"))),
		"headless-externalname-no-ip": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "None").port("http", v1.ProtocolTCP, 80, 0)),
			addSvc(svc("default", "b", v1.ServiceTypeExternalName, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0)),
			addSvc(svc("default", "web", "").port("http", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2"))),
		"same-port-number-twice": seed(h,
			addSvc(svc("default", "web", v1.ServiceTypeNodePort, "10.96.0.1").
				port("http", v1.ProtocolTCP, 80, 30080).port("https", v1.ProtocolTCP, 80, 30080).port("dns", v1.ProtocolUDP, 80, 30080)),
			addSlice(sl("default", "web", "s1", discovery.AddressTypeIPv4).
				port("http", v1.ProtocolTCP, 8080).port("https", v1.ProtocolTCP, 8080).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.1.2"))),
		"port-extremes": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeNodePort, "10.96.0.1").
				port("http", v1.ProtocolTCP, 0, 65535).port("https", v1.ProtocolTCP, 65535, 70000).port("dns", v1.ProtocolTCP, 65536, -1).port("HTTP", v1.ProtocolTCP, 1, 65535)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).
				port("https", v1.ProtocolTCP, 65535).port("HTTP", v1.ProtocolTCP, 0).port("http", v1.ProtocolTCP, 70000).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "a", "s2", discovery.AddressTypeIPv4).port("HTTP", v1.ProtocolTCP, -1).ep(ready, "10.244.1.3"))),
		"cluster-ip-conflict": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 0)),
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 0)),
			addSvc(svc("kube-system", "a", v1.ServiceTypeClusterIP, "10.96.0.1").port("dns", v1.ProtocolUDP, 80, 0).external("10.96.0.1")),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "b", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.3")),
			addSlice(sl("kube-system", "a", "s1", discovery.AddressTypeIPv4).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.2.2"))),
		"external-ip-is-another-cluster-ip": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 0)),
			addSvc(svc("default", "b", v1.ServiceTypeLoadBalancer, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 30080).
				external("10.96.0.1", "192.0.2.10").ingress("", "10.96.0.2", "203.0.113.7")),
			addSlice(sl("default", "b", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2"))),
		"nodeport-clash": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeNodePort, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 30080)),
			addSvc(svc("default", "b", v1.ServiceTypeLoadBalancer, "10.96.0.2").port("http", v1.ProtocolTCP, 443, 30080).policies(v1.ServiceExternalTrafficPolicyLocal, "", 30080)),
			addSvc(svc("default", "web", v1.ServiceTypeNodePort, "10.96.0.2").port("http", v1.ProtocolUDP, 80, 30080)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "b", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(local, "10.244.1.3"))),
		"empty-names": seed(h,
			addSvc(svc("", "", v1.ServiceTypeNodePort, "10.96.0.1", "fd00:96::1").port("", "", 80, 30080).affinity("ClientIP", 10800)),
			addSlice(sl("", "", "", discovery.AddressTypeIPv4).port("", "<nil>", 8080).ep(ready, "10.244.1.2")),
			addSlice(sl("", "", "s1", discovery.AddressTypeIPv6).port("<nil>", v1.ProtocolTCP, 8080).ep(ready, "fd00:244::2"))),
		"protocols": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeNodePort, "10.96.0.1", "fd00:96::1").
				port("http", v1.ProtocolSCTP, 80, 30080).port("dns", v1.ProtocolUDP, 53, 30053).port("https", "ICMP", 443, 30443).port("HTTP", "tcp", 8080, 0)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).
				port("http", v1.ProtocolSCTP, 8080).port("dns", v1.ProtocolUDP, 53).port("https", "ICMP", 80).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "a", "s2", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).port("dns", "<nil>", 53).ep(ready, "fd00:244::2"))),
		"conditions": seed(h, addSvc(webSvc),
			addSlice(sl("default", "web", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).
				ep(epOpt{conds: condNil}, "10.244.1.2").ep(epOpt{conds: condNotReady}, "10.244.1.3").
				ep(epOpt{conds: condGone}, "10.244.2.2").ep(epOpt{conds: condOddNil}, "10.244.1.2")),
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("default", "b", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).
				ep(epOpt{conds: condDraining}, "10.244.1.2").ep(epOpt{conds: condGone}, "10.244.1.3").bulk(16, 5))),
		"missing-and-unmatched-ports": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 0).port("dns", v1.ProtocolUDP, 53, 0)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "a", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, math.MinInt32).ep(ready, "10.244.1.3")),
			addSlice(sl("default", "a", "s3", discovery.AddressTypeIPv4).port("https", v1.ProtocolTCP, 8080).port("dns", v1.ProtocolTCP, 53).port("<nil>", "<nil>", 80).ep(ready, "10.244.2.2")),
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.2").port("", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("default", "b", "s4", discovery.AddressTypeIPv4).port("<nil>", "<nil>", 8080).port("", v1.ProtocolTCP, 80).ep(ready, "10.244.1.2"))),
		"etp-local": seed(h, addSvc(lb.ingress("VIP", "198.51.100.1", "2001:db8:1::7").policies(v1.ServiceExternalTrafficPolicyLocal, "", 32000)), lbSlices[0], lbSlices[1]),
		"etp-local-remote-only": seed(h,
			addSvc(lb.ingress("", "198.51.100.1").policies(v1.ServiceExternalTrafficPolicyLocal, v1.ServiceInternalTrafficPolicyLocal, -1)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(remote, "10.244.2.2").ep(epOpt{conds: condDraining, node: "node-1"}, "10.244.1.3"))),
		"itp-local": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 0).policies(v1.ServiceExternalTrafficPolicyLocal, v1.ServiceInternalTrafficPolicyLocal, 70000)),
			lbSlices[0], lbSlices[1],
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0).policies("", v1.ServiceInternalTrafficPolicyLocal, 0)),
			addSlice(sl("default", "b", "s3", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(remote, "10.244.2.2"))),
		"affinity-timeouts": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeNodePort, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 30080).affinity("ClientIP/timeout", math.MinInt32)),
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0).affinity("ClientIP/timeout", 86401)),
			addSvc(svc("kube-system", "a", v1.ServiceTypeClusterIP, "fd00:96::2").port("http", v1.ProtocolTCP, 80, 0).affinity("ClientIP/no-clientIP", 0)),
			addSvc(svc("kube-system", "b", v1.ServiceTypeClusterIP, "10.96.0.1").port("dns", v1.ProtocolUDP, 53, 0).affinity("ClientIP/nil-timeout", 0)),
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("dns", v1.ProtocolUDP, 53, 0).affinity("ClientIP/timeout", 1)),
			lbSlices[0], lbSlices[1],
			addSlice(sl("default", "b", "s3", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2").ep(ready, "10.244.1.3")),
			addSlice(sl("kube-system", "a", "s1", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).ep(ready, "fd00:244::2")),
			addSlice(sl("kube-system", "b", "s2", discovery.AddressTypeIPv4).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.2.2")),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.2.2"))),
		"affinity-many-endpoints": seed(h,
			addSvc(svc("default", "web", v1.ServiceTypeLoadBalancer, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 30080).ingress("", "198.51.100.1").
				affinity("ClientIP/timeout", 86400).policies(v1.ServiceExternalTrafficPolicyLocal, "", 32000)),
			addSlice(webSlice.bulk(17, 0))),
		"source-ranges": seed(h,
			addSvc(lb.ingress("", "198.51.100.1", "2001:db8:1::7").ranges("garbage", " 192.168.0.0/16 ", "10.0.0.1/33")),
			addSvc(svc("default", "b", v1.ServiceTypeLoadBalancer, "10.96.0.2", "fd00:96::2").port("http", v1.ProtocolTCP, 80, 30443).
				ingress("Proxy", "203.0.113.7").ranges("192.0.2.0/24", "2001:db8::/32", "1.2.3.4")),
			addSvc(svc("default", "web", v1.ServiceTypeLoadBalancer, "10.96.0.1").port("dns", v1.ProtocolUDP, 53, 30053).
				ingress("VIP", "203.0.113.7", "not-an-ip").ranges("10.1.2.3/8", "0.0.0.0/0", "::/0")),
			lbSlices[0], lbSlices[1],
			addSlice(sl("default", "b", "s3", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.3")),
			addSlice(sl("default", "web", "s4", discovery.AddressTypeIPv4).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.1.3"))),
		"topology-hints": seed(h, addSvc(webSvc),
			addSlice(sl("default", "web", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).
				ep(epOpt{conds: condReady, node: "node-1", zone: "z1", hints: "z1"}, "10.244.1.2").
				ep(epOpt{conds: condReady, node: "node-2", zone: "z2", hints: "z2"}, "10.244.2.2").
				ep(epOpt{conds: condReady, node: "", zone: "", hints: "node-1+z1"}, "10.244.1.3").
				ep(epOpt{conds: condNotReady, node: "node-2", hints: "empty"}, "fd00:244::2")),
			addSvc(svc("default", "b", v1.ServiceTypeNodePort, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 30080)),
			addSlice(sl("default", "b", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).
				ep(epOpt{conds: condReady, node: "node-2", hints: "node-2"}, "10.244.2.2").
				ep(epOpt{conds: condReady, node: "node-1", hints: "node-1"}, "10.244.1.2"))),
		"slice-address-types": seed(h,
			addSvc(svc("default", "web", v1.ServiceTypeClusterIP, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("default", "web", "s1", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2").ep(ready, "fd00:244::2")),
			addSlice(sl("default", "web", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "fd00:244::3").ep(ready, "10.244.1.3")),
			addSlice(sl("default", "web", "s3", discovery.AddressTypeFQDN).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.2.2")),
			addSlice(sl("default", "web", "s4", "").port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.2.2"))),
		"slices-without-service": seed(h, addSvc(webSvc),
			addSlice(sl("default", "missing", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "<no label>", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2")),
			addSlice(sl("kube-system", "web", "s3", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2")),
			addSlice(sl("default", "", "s4", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2"))),
		"huge-endpoints": seed(h,
			addSvc(svc("default", "a", v1.ServiceTypeNodePort, "10.96.0.1", "fd00:96::1").port("http", v1.ProtocolTCP, 80, 30080)),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).bulk(300, 0)),
			addSlice(sl("default", "a", "s2", discovery.AddressTypeIPv6).port("http", v1.ProtocolTCP, 8080).bulk(256, 1)),
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("default", "b", "s3", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).bulk(17, 2)),
			addSvc(webSvc), addSlice(webSlice)),
		"nodeports-on-all-local-addresses": seed(allLocal,
			addSvc(lb.ingress("", "198.51.100.1").policies(v1.ServiceExternalTrafficPolicyLocal, "", 32000)), lbSlices[0], lbSlices[1],
			addSvc(svc("default", "b", v1.ServiceTypeNodePort, "10.96.0.2").port("http", v1.ProtocolUDP, 80, 30053))),
		"nodeport-addresses-garbage": seed(garbageNP, addSvc(webSvc), addSlice(webSlice)),
		"no-node":                    seed(noNode, addSvc(lb.policies(v1.ServiceExternalTrafficPolicyLocal, v1.ServiceInternalTrafficPolicyLocal, 32000)), lbSlices[0], lbSlices[1]),
		"odd-node": seed(oddNode,
			addSvc(lb.ingress("", "198.51.100.1").policies(v1.ServiceExternalTrafficPolicyLocal, "", 32000).ranges("192.0.2.0/24", "::/0")),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(epOpt{conds: condReady, node: ""}, "10.244.1.2"))),
		"masquerade-all-no-cidrs": seed(masqAll,
			addSvc(lb.ingress("", "198.51.100.1").policies(v1.ServiceExternalTrafficPolicyLocal, "", 32000)), lbSlices[0], lbSlices[1],
			addSvc(webSvc), addSlice(webSlice)),

		// Sequences of syncs, for the incremental target (and the kernel test's diffs).
		"churn": seed(h,
			addSvc(webSvc), addSlice(webSlice), syncNow(),
			addSvc(lb), lbSlices[0], syncNow(),
			addSlice(webSlice.bulk(17, 0)), syncNow(), // web grows past one slot block
			delSvc(0), syncNow(), // web is gone; its slice stays
			addSvc(webSvc.affinity("ClientIP", 0)), syncNow(),
			delSlice(0), delSlice(0), syncNow(),
			lbSlices[1], addSlice(sl("default", "web", "s3", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).bulk(256, 0))),
		"endpoints-grow-and-shrink": seed(h,
			addSvc(webSvc), addSlice(webSlice.bulk(1, 0)), syncNow(),
			addSlice(webSlice.bulk(16, 0)), syncNow(),
			addSlice(webSlice.bulk(300, 0)), syncNow(),
			addSvc(svc("default", "b", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("default", "b", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).bulk(17, 0)), syncNow(),
			addSlice(webSlice), syncNow(),
			addSlice(webSlice.bulk(256, 3))),
		"conflict-moves": seed(h,
			addSvc(svc("default", "b", v1.ServiceTypeNodePort, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 30080).external("203.0.113.7")),
			addSlice(sl("default", "b", "s2", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.3")), syncNow(),
			addSvc(svc("default", "a", v1.ServiceTypeNodePort, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 30080).external("203.0.113.7")),
			addSlice(sl("default", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2")), syncNow(),
			delSvc(1), syncNow(), // default/a goes: default/b wins its node port back
			addSvc(svc("default", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0))),
		"node-changes": seed(h,
			addSvc(lb.ingress("", "198.51.100.1").policies(v1.ServiceExternalTrafficPolicyLocal, "", 32000).ranges("192.0.2.0/24")),
			lbSlices[0], lbSlices[1], addSvc(webSvc), addSlice(webSlice), syncNow(),
			setNode(nodeRec{Present: 2, Name: at(myNodeNames, "node-2"), Zone: at(nodeZones, "z2"), Addrs: [3]nodeAddrRec{{IP: at(nodeIPs, "192.0.2.12")}}}), syncNow(),
			setNode(nodeRec{}), syncNow(),
			setNode(stdHeader().Node)),
	}
}

func corpusFile(data []byte) []byte {
	return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
}

// readCorpusFile parses a corpus file of a []byte target.
func readCorpusFile(content []byte) ([]byte, error) {
	lines := strings.Split(strings.TrimSpace(string(content)), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
		return nil, fmt.Errorf("not a corpus file of one []byte")
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	return []byte(s), err
}

// TestFuzzSeedCorpus keeps testdata/fuzz in step with seeds(): go test runs those files
// as test cases, so a stale file would test something else than its name says.
func TestFuzzSeedCorpus(t *testing.T) {
	all := seeds()
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, target := range fuzzTargets {
		dir := filepath.Join("testdata", "fuzz", target)
		if *updateSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range names {
			path := filepath.Join(dir, "seed-"+n)
			want := corpusFile(all[n])
			if *updateSeeds {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s is missing or stale (%v): run go test -run TestFuzzSeedCorpus ./internal/controller/ -update-fuzz-seeds", path, err)
				continue
			}
			if back, err := readCorpusFile(got); err != nil || !bytes.Equal(back, all[n]) {
				t.Errorf("%s does not read back: %v", path, err)
			}
		}
	}
}
