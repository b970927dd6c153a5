package main

import (
	"strings"
	"testing"

	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// client-go's features keep their defaults and environment overrides, without the ten
// "Feature gate default state" lines its own implementation logs on first use.
func TestClientGoFeatureGatesAreQuiet(t *testing.T) {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	t.Setenv("KUBE_FEATURE_InOrderInformers", "maybe")
	overrides := quietClientGoFeatures()
	_, buf := testLogger(t, "-v=4")
	// First uses: building a client and asking the gates.
	if _, err := kubernetes.NewForConfig(&rest.Config{Host: "https://192.0.2.1:6443"}); err != nil {
		t.Fatal(err)
	}
	gates := clientfeatures.FeatureGates()
	if gates.Enabled(clientfeatures.WatchListClient) {
		t.Error("KUBE_FEATURE_WatchListClient=false not honoured")
	}
	if !gates.Enabled(clientfeatures.InOrderInformers) {
		t.Error("InOrderInformers lost its default (true) on an invalid override")
	}
	if gates.Enabled(clientfeatures.ClientsPreferCBOR) {
		t.Error("ClientsPreferCBOR lost its default (false)")
	}
	if strings.Contains(buf.String(), "Feature gate") {
		t.Errorf("client-go logged its feature gates at -v=4:\n%s", buf.String())
	}
	got := strings.Join(overrides, "\n")
	if !strings.Contains(got, "WatchListClient=false") || !strings.Contains(got, `InOrderInformers: "maybe" is not true or false`) {
		t.Errorf("overrides reported: %q", overrides)
	}
}
