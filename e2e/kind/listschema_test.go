package kind

import (
	"strings"
	"testing"
)

// The schema must reject what `nftproxy list -o json` never prints, or validating real
// output against it proves nothing.
func TestListSchemaRejects(t *testing.T) {
	s, err := ListSchema()
	if err != nil {
		t.Fatal(err)
	}
	good := `[{"service":"default/web:http","protocol":"tcp","family":"ip","frontends":[
	  {"type":"ClusterIP","address":"10.96.0.10","port":80,"action":"dnat","trafficPolicy":"Cluster",
	   "endpoints":[{"address":"10.244.1.2:8080","probability":0.5},{"address":"10.244.2.2:8080","probability":0.5,"local":true}]},
	  {"type":"External","address":"2001:db8::1","port":80,"action":"drop","trafficPolicy":"Local","sourceRanges":[]},
	  {"type":"NodePort","port":30080,"action":"reject","shadowed":[{"address":"192.0.2.1","by":"default/other:http","byType":"External"}]},
	  {"type":"NodePort","port":30081,"action":"dnat","trafficPolicy":"Cluster","affinityTimeoutSeconds":10800,
	   "endpoints":[{"address":"[2001:db8::2]:80","probability":0.5},{"address":"(missing slot 1)","probability":0.5}]}]}]`
	if err := ValidateList(s, []byte(good)); err != nil {
		t.Fatalf("a valid listing rejected: %v", err)
	}
	if err := ValidateList(s, []byte(strings.Replace(good, `"default/web:http"`, `"default/web"`, 1))); err != nil {
		t.Fatalf("an unnamed port rejected: %v", err)
	}
	if err := ValidateList(s, []byte(`[]`)); err != nil {
		t.Fatalf("an empty listing rejected: %v", err)
	}
	for name, mutate := range map[string][2]string{
		"no action":             {`"port":80,"action":"dnat",`, `"port":80,`},
		"unknown type":          {`"type":"ClusterIP"`, `"type":"LoadBalancer"`},
		"address not an IP":     {`"10.96.0.10"`, `"web.default"`},
		"node port address":     {`"type":"NodePort","port":30080`, `"type":"NodePort","address":"192.0.2.1","port":30080`},
		"cluster IP no address": {`"type":"ClusterIP","address":"10.96.0.10",`, `"type":"ClusterIP",`},
		"port out of range":     {`"port":30080`, `"port":70000`},
		"probability above 1":   {`"probability":0.5}`, `"probability":1.5}`},
		"endpoint without port": {`"10.244.1.2:8080"`, `"10.244.1.2"`},
		"family":                {`"family":"ip"`, `"family":"inet"`},
		"protocol upper case":   {`"protocol":"tcp"`, `"protocol":"TCP"`},
		"affinity zero":         {`"affinityTimeoutSeconds":10800`, `"affinityTimeoutSeconds":0`},
		"null endpoints":        {`"action":"reject",`, `"action":"reject","endpoints":null,`},
		"not an array":          {`[{"service"`, `{"x":[{"service"`},
		"service without name":  {`"default/web:http"`, `"default/:http"`},
		"service port empty":    {`"default/web:http"`, `"default/web:"`},
	} {
		bad := strings.Replace(good, mutate[0], mutate[1], 1)
		if name == "not an array" {
			bad += "}"
		}
		if bad == good {
			t.Fatalf("%s: mutation did not apply", name)
		}
		if err := ValidateList(s, []byte(bad)); err == nil {
			t.Errorf("%s: accepted:\n%s", name, bad)
		}
	}
}
