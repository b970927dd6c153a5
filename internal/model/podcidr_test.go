package model

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Node's spec.podCIDRs are the NodeCIDR mode's input: at most one per family (the
// first), masked; an unparsable one is skipped.
func TestBuildNodePodCIDRs(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, "[]"},
		{[]string{"10.244.1.0/24", "fd00:244:1::/64"}, "[10.244.1.0/24 fd00:244:1::/64]"},
		{[]string{"10.244.1.7/24", "10.244.2.0/24", "bogus", "fd00::1/64"}, "[10.244.1.0/24 fd00::/64]"},
	} {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: v1.NodeSpec{PodCIDRs: tc.in}}
		snap, _ := Build(nil, nil, n)
		if got := fmt.Sprint(snap.Node.PodCIDRs); got != tc.want {
			t.Errorf("%q: %s, want %s", tc.in, got, tc.want)
		}
	}
}
