package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"time"

	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/readback"
)

// Exit codes of nftproxy verify.
const (
	VerifyEqual     = 0
	VerifyDifferent = 1
	VerifyError     = 2
)

// Verifier reads the kernel back and compares (readback.Reader; a fake in tests).
type Verifier interface {
	Verify(expected *nft.Ruleset, opts ...readback.Option) (readback.Diff, error)
}

// slotsByContent compares the compiler's endpoint slot maps by what each service's
// rule selects from them, not by slot number: the proxy's slot numbers depend on the
// order in which services came and went (compile.Slots), which a fresh compile cannot
// know.
var slotsByContent = readback.MapsByContent(isEndpointSlotMap)

// isEndpointSlotMap recognises compile's endpoint slot maps (slot → endpoint address .
// port) by the layout.
func isEndpointSlotMap(s *nft.Set) bool {
	o, ok := compile.SetOf(s.Name)
	return ok && o.Role == compile.RoleEndpointSlots && s.IsMap()
}

// Result is one comparison of the kernel with the API.
type Result struct {
	Tables       []string // "ip nftproxy", …
	ServicePorts int      // the service ports the API's listing compiled to
	Diff         readback.Diff
	Attempts     int
}

// Compare compares each ruleset (compiled from the API with the proxy's configuration)
// with its table in the kernel. Endpoint slots are compared by content: the proxy's slot
// numbers depend on the order in which services came and went (compile.Slots), which a
// fresh compile cannot know.
func Compare(v Verifier, rulesets []*nft.Ruleset, servicePorts int) (Result, error) {
	res := Result{ServicePorts: servicePorts}
	for _, rs := range rulesets {
		d, err := v.Verify(rs, slotsByContent)
		if err != nil {
			return res, fmt.Errorf("reading %s %s back from the kernel: %w", rs.Family, rs.Table, err)
		}
		res.Tables = append(res.Tables, fmt.Sprintf("%s %s", rs.Family, rs.Table))
		res.Diff = append(res.Diff, d...)
	}
	return res, nil
}

// Until compares with once until the kernel matches or wait has passed (once a second),
// and returns the last result with the number of comparisons made.
func Until(ctx context.Context, wait time.Duration, once func(context.Context) (Result, error)) (Result, error) {
	deadline := time.Now().Add(wait)
	for attempt := 1; ; attempt++ {
		res, err := once(ctx)
		if err != nil {
			return res, err
		}
		if res.Diff.Empty() || !time.Now().Add(time.Second).Before(deadline) {
			res.Attempts = attempt
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// Report prints the result and returns the exit code.
func (r Result) Report(w io.Writer) int {
	tries := ""
	if r.Attempts > 1 {
		tries = fmt.Sprintf(" (after %d comparisons)", r.Attempts)
	}
	if r.Diff.Empty() {
		fmt.Fprintf(w, "equal: the kernel's tables %s match the API's %d service ports%s\n", strings.Join(r.Tables, ", "), r.ServicePorts, tries)
		return VerifyEqual
	}
	for _, l := range r.Diff {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "different: %d differences between the kernel's tables %s and the API's %d service ports%s\n", len(r.Diff), strings.Join(r.Tables, ", "), r.ServicePorts, tries)
	return VerifyDifferent
}

// Overlay writes over the proxy's configuration every setting whose value on verify's
// command line (given) differs from what no flag gives (defaults), and verify's own
// API client and logging settings. Both are compared as JSON, field by field.
func Overlay(proxy, given, defaults *v1alpha1.KubeProxyConfiguration) (*v1alpha1.KubeProxyConfiguration, error) {
	var p, g, d map[string]any
	for _, x := range []struct {
		c   *v1alpha1.KubeProxyConfiguration
		out *map[string]any
	}{{proxy, &p}, {given, &g}, {defaults, &d}} {
		b, err := json.Marshal(x.c)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, x.out); err != nil {
			return nil, err
		}
	}
	overlayJSON(p, g, d)
	p["clientConnection"], p["logging"] = g["clientConnection"], g["logging"]
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.KubeProxyConfiguration{}
	return out, json.Unmarshal(b, out)
}

func overlayJSON(proxy, given, defaults map[string]any) {
	for k, v := range given {
		if reflect.DeepEqual(v, defaults[k]) {
			continue
		}
		gm, ok1 := v.(map[string]any)
		pm, ok2 := proxy[k].(map[string]any)
		if dm, ok3 := defaults[k].(map[string]any); ok1 && ok2 && ok3 {
			overlayJSON(pm, gm, dm)
			continue
		}
		proxy[k] = v
	}
}

// Dialable turns a bind address into one to connect to: an unspecified host (all
// addresses) is reached on loopback.
func Dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
