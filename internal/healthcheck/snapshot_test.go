package healthcheck

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

func TestFromSnapshot(t *testing.T) {
	ep := func(addr, node string, ready bool) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: 8080, Ready: ready, Serving: true,
			Terminating: !ready, NodeName: node}
	}
	port := func(ns, name, portName string, hc uint16, eps ...model.Endpoint) model.ServicePort {
		return model.ServicePort{
			Name:                model.ServicePortName{Namespace: ns, Name: name, Port: portName, Protocol: model.ProtoTCP},
			ExternalPolicyLocal: hc != 0, HealthCheckNodePort: hc, Endpoints: eps,
		}
	}
	node := model.Node{Name: "n1"}
	tests := []struct {
		name string
		node model.Node
		svcs []model.ServicePort
		want map[ServiceName]Service
	}{
		{name: "no health-check port", node: node, svcs: []model.ServicePort{port("a", "web", "", 0, ep("10.0.0.1", "n1", true))},
			want: map[ServiceName]Service{}},
		{name: "local ready endpoints", node: node,
			svcs: []model.ServicePort{port("a", "web", "", 32000,
				ep("10.0.0.1", "n1", true), ep("10.0.0.2", "n1", true), ep("10.0.0.3", "n2", true))},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000, LocalEndpoints: 2}}},
		{name: "no local endpoint", node: node,
			svcs: []model.ServicePort{port("a", "web", "", 32000, ep("10.0.0.3", "n2", true))},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000, LocalEndpoints: 0}}},
		{name: "terminating endpoints do not count", node: node,
			svcs: []model.ServicePort{port("a", "web", "", 32000, ep("10.0.0.1", "n1", false))},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000, LocalEndpoints: 0}}},
		{name: "one pod on two ports counts once", node: node,
			svcs: []model.ServicePort{
				port("a", "web", "http", 32000, ep("10.0.0.1", "n1", true)),
				port("a", "web", "https", 32000, ep("10.0.0.1", "n1", true), ep("10.0.0.2", "n1", true)),
			},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000, LocalEndpoints: 2}}},
		{name: "dual-stack pods count once", node: node,
			svcs: []model.ServicePort{port("a", "web", "", 32000,
				ep("10.0.0.1", "n1", true), ep("fd00::1", "n1", true), ep("10.0.0.2", "n1", true))},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000, LocalEndpoints: 2}}},
		{name: "services apart", node: node,
			svcs: []model.ServicePort{
				port("a", "web", "", 32000, ep("10.0.0.1", "n1", true)),
				port("b", "web", "", 32001),
			},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000, LocalEndpoints: 1}, {"b", "web"}: {Port: 32001}}},
		{name: "unnamed node has no local endpoint", node: model.Node{},
			svcs: []model.ServicePort{port("a", "web", "", 32000, ep("10.0.0.1", "", true))},
			want: map[ServiceName]Service{{"a", "web"}: {Port: 32000}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := FromSnapshot(&model.Snapshot{Node: tc.node, Services: model.Ports(tc.svcs)})
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
