package config

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The conntrack settings are read from the file, 0 is kept (it means "leave alone"),
// negative values are refused naming the field, and they are written back.
func TestConntrackSettings(t *testing.T) {
	f := mustParse(t, `
conntrack:
  maxPerCore: 0
  min: 1000
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 30m
  tcpBeLiberal: true
  udpTimeout: 30s
  udpStreamTimeout: 2m
`)
	want := Conntrack{MaxPerCore: 0, Min: 1000, TCPEstablishedTimeout: 0, TCPCloseWaitTimeout: 30 * time.Minute,
		TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}
	if f.Values.Conntrack != want {
		t.Errorf("conntrack %+v, want %+v", f.Values.Conntrack, want)
	}
	if len(f.Notes) != 0 {
		t.Errorf("conntrack settings reported as without effect: %q", f.Notes)
	}
	c := Defaulted()
	f.Values.Apply(c)
	var buf bytes.Buffer
	if err := Encode(&buf, c); err != nil {
		t.Fatal(err)
	}
	back := mustParse(t, buf.String())
	if back.Values.Conntrack != want {
		t.Errorf("written back and read: %+v\n%s", back.Values.Conntrack, buf.String())
	}
	for _, bad := range []string{"min: -1", "udpTimeout: -5s", "maxPerCore: -2"} {
		_, err := Parse([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack: {" + bad + "}\n"))
		field := "conntrack." + strings.SplitN(bad, ":", 2)[0]
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
