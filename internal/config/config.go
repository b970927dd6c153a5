// Package config reads and writes kube-proxy's configuration file, a
// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1), so that the file a
// kube-proxy DaemonSet mounts works unchanged with nftproxy.
//
// Load decodes a file, fills in kube-proxy's defaults, validates the settings nftproxy
// uses (an invalid value is an error that names its field) and lists the settings that
// have no effect here. Values is the part of the file nftproxy uses; Apply writes it back
// into a KubeProxyConfiguration for --write-config-to.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// Default ports of the health and metrics servers, as kube-proxy's.
const (
	HealthzPort = 10256
	MetricsPort = 10249
)

// Values are the settings of a KubeProxyConfiguration that nftproxy uses. Each has a
// command-line flag of the same meaning.
type Values struct {
	Kubeconfig         string   // clientConnection.kubeconfig
	KubeAPIQPS         float32  // clientConnection.qps
	KubeAPIBurst       int32    // clientConnection.burst
	KubeAPIContentType string   // clientConnection.contentType
	HostnameOverride   string   // hostnameOverride
	ClusterCIDR        string   // clusterCIDR
	NodePortAddresses  []string // nodePortAddresses
	MasqueradeAll      bool     // nftables.masqueradeAll, else iptables.masqueradeAll
	MasqueradeBit      int32    // nftables.masqueradeBit, else iptables.masqueradeBit
	// IPTablesMasqueradeBit is iptables.masqueradeBit (--iptables-masquerade-bit): as in
	// kube-proxy's nftables mode it marks nothing; it is kept for --write-config-to.
	IPTablesMasqueradeBit int32
	SyncPeriod            time.Duration // nftables.syncPeriod, else iptables.syncPeriod
	MinSyncPeriod         time.Duration // nftables.minSyncPeriod, else iptables.minSyncPeriod
	HealthzBindAddress    string        // healthzBindAddress
	MetricsBindAddress    string        // metricsBindAddress
	EnableProfiling       bool          // enableProfiling: /debug/pprof on the metrics server
	DetectLocalMode       string        // detectLocalMode
	// BridgeInterface and InterfaceNamePrefix are detectLocal.*, used by the
	// BridgeInterface and InterfaceNamePrefix modes.
	BridgeInterface     string    // detectLocal.bridgeInterface
	InterfaceNamePrefix string    // detectLocal.interfaceNamePrefix
	Verbosity           int       // logging.verbosity
	LoggingFormat       string    // logging.format
	Conntrack           Conntrack // conntrack.*
	// FeatureGates are the file's featureGates; only AllowServiceExternalIPs has an
	// effect (see ExternalIPsAllowed).
	FeatureGates map[string]bool // featureGates
}

// GateAllowServiceExternalIPs is the feature gate that, set to false, makes kube-proxy
// (and nftproxy) program no Service externalIPs at all.
const GateAllowServiceExternalIPs = "AllowServiceExternalIPs"

// ExternalIPsAllowed reports whether Service externalIPs are programmed under gates
// (the gate defaults to true, as in kube-proxy v1.37).
func ExternalIPsAllowed(gates map[string]bool) bool {
	v, ok := gates[GateAllowServiceExternalIPs]
	return !ok || v
}

// ParseFeatureGates parses the --feature-gates flag: comma-separated Name=true|false.
func ParseFeatureGates(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not Name=true|false", kv)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%q: %q is not a boolean", k, v)
		}
		out[k] = b
	}
	return out, nil
}

// GateNotes lists the gates in gates that have no effect in nftproxy, one note each,
// sorted; where says where they were set.
func GateNotes(where string, gates map[string]bool) []string {
	var out []string
	for k, v := range gates {
		if k != GateAllowServiceExternalIPs {
			out = append(out, fmt.Sprintf("%s: feature gate %s=%t has no effect in nftproxy", where, k, v))
		}
	}
	sort.Strings(out)
	return out
}

// File is a loaded configuration file.
type File struct {
	// Config is the file's configuration with kube-proxy's defaults filled in.
	Config *v1alpha1.KubeProxyConfiguration
	// Values are the settings nftproxy uses, validated.
	Values Values
	// Parsed are the Values that have a typed form, parsed once here.
	Parsed Parsed
	// Notes are things to tell the operator once: settings that have no effect in
	// nftproxy, unknown fields, settings shadowed by others.
	Notes []string
}

// Parsed are the typed forms of Values' strings.
type Parsed struct {
	ClusterCIDRs []netip.Prefix    // clusterCIDR
	NodePorts    NodePortAddresses // nodePortAddresses
}

// mapped lists the JSON paths of the fields nftproxy uses; every other field with a
// non-default value is reported as having no effect.
var mapped = map[string]bool{
	"apiVersion": true, "kind": true,
	"clientConnection.kubeconfig": true, "clientConnection.qps": true,
	"clientConnection.burst": true, "clientConnection.contentType": true,
	"hostnameOverride": true, "clusterCIDR": true, "nodePortAddresses": true,
	"iptables.masqueradeAll": true, "iptables.masqueradeBit": true,
	"iptables.syncPeriod": true, "iptables.minSyncPeriod": true,
	"nftables.masqueradeAll": true, "nftables.masqueradeBit": true,
	"nftables.syncPeriod": true, "nftables.minSyncPeriod": true,
	"healthzBindAddress": true, "metricsBindAddress": true, "enableProfiling": true,
	"detectLocalMode": true, "detectLocal.bridgeInterface": true, "detectLocal.interfaceNamePrefix": true,
	"logging.verbosity": true, "logging.format": true,
	"featureGates." + GateAllowServiceExternalIPs: true,
}

// Load reads and parses the configuration file at path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config file: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return f, nil
}

func newCodecs(strict bool) serializer.CodecFactory {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err) // a static registration
	}
	mode := serializer.DisableStrict
	if strict {
		mode = serializer.EnableStrict
	}
	return serializer.NewCodecFactory(scheme, mode)
}

// Parse decodes a KubeProxyConfiguration (YAML or JSON), fills in kube-proxy's defaults
// and validates it. Unknown fields are tolerated, as kube-proxy does, and reported in
// Notes.
func Parse(data []byte) (*File, error) {
	var notes []string
	obj, gvk, err := newCodecs(true).UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		if !runtime.IsStrictDecodingError(err) {
			return nil, fmt.Errorf("decoding: %w", err)
		}
		strictErr := err
		obj, gvk, err = newCodecs(false).UniversalDeserializer().Decode(data, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding: %w", strictErr)
		}
		notes = append(notes, fmt.Sprintf("config file: ignoring what strict decoding refused: %v", strictErr))
	}
	cfg, ok := obj.(*v1alpha1.KubeProxyConfiguration)
	if !ok {
		return nil, fmt.Errorf("got %v, want kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration", gvk)
	}
	present, err := presentFields(data)
	if err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	SetDefaults(cfg)
	vals, parsed, more, err := resolve(cfg, present)
	if err != nil {
		return nil, err
	}
	notes = append(notes, more...)
	notes = append(notes, notApplicable(cfg)...)
	return &File{Config: cfg, Values: vals, Parsed: parsed, Notes: notes}, nil
}

// presentFields returns the dotted paths of every field the document sets, with the
// value the document gives.
func presentFields(data []byte) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	out := map[string]any{}
	flatten("", m, func(path string, v any) { out[path] = v })
	return out, nil
}

// flatten calls f for every leaf of a decoded JSON document (lists are leaves).
func flatten(prefix string, v any, f func(path string, v any)) {
	m, ok := v.(map[string]any)
	if !ok || (len(m) == 0 && prefix != "") {
		f(prefix, v)
		return
	}
	for k, sub := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		flatten(p, sub, f)
	}
}

// SetDefaults fills in kube-proxy's defaults for unset fields, as kube-proxy v1.37
// does for a v1alpha1 file.
func SetDefaults(c *v1alpha1.KubeProxyConfiguration) {
	if c.BindAddress == "" {
		c.BindAddress = "0.0.0.0"
	}
	healthzHost, metricsHost := "0.0.0.0", "127.0.0.1"
	if ip, err := netip.ParseAddr(c.BindAddress); err == nil && ip.Unmap().Is6() {
		healthzHost, metricsHost = "::", "::1"
	}
	c.HealthzBindAddress = defaultBindAddress(c.HealthzBindAddress, healthzHost, HealthzPort)
	c.MetricsBindAddress = defaultBindAddress(c.MetricsBindAddress, metricsHost, MetricsPort)
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptr(int32(-999))
	}
	for _, s := range []*struct{ sync, min *metav1.Duration }{
		{&c.IPTables.SyncPeriod, &c.IPTables.MinSyncPeriod},
		{&c.NFTables.SyncPeriod, &c.NFTables.MinSyncPeriod},
		{&c.IPVS.SyncPeriod, nil},
	} {
		if s.sync.Duration == 0 {
			s.sync.Duration = 30 * time.Second
		}
		if s.min != nil && s.min.Duration == 0 {
			s.min.Duration = time.Second
		}
	}
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = ptr(true)
	}
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = ptr(int32(14))
	}
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = ptr(int32(14))
	}
	if c.Conntrack.MaxPerCore == nil {
		c.Conntrack.MaxPerCore = ptr(int32(32 * 1024))
	}
	if c.Conntrack.Min == nil {
		c.Conntrack.Min = ptr(int32(128 * 1024))
	}
	if c.Conntrack.TCPEstablishedTimeout == nil {
		c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if c.Conntrack.TCPCloseWaitTimeout == nil {
		c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	if c.ConfigSyncPeriod.Duration == 0 {
		c.ConfigSyncPeriod.Duration = 15 * time.Minute
	}
	if c.ClientConnection.ContentType == "" {
		c.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if c.ClientConnection.QPS == 0 {
		c.ClientConnection.QPS = 5
	}
	if c.ClientConnection.Burst == 0 {
		c.ClientConnection.Burst = 10
	}
	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&c.Logging)
}

// Defaulted returns an empty configuration with kube-proxy's defaults.
func Defaulted() *v1alpha1.KubeProxyConfiguration {
	c := &v1alpha1.KubeProxyConfiguration{}
	c.APIVersion, c.Kind = v1alpha1.SchemeGroupVersion.String(), "KubeProxyConfiguration"
	SetDefaults(c)
	return c
}

func defaultBindAddress(addr, host string, port int) string {
	if addr == "" {
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	return AppendPortIfNeeded(addr, port)
}

// AppendPortIfNeeded adds port to a bare IP address (kube-proxy accepts "0.0.0.0" for
// "0.0.0.0:10256"); anything else is returned unchanged.
func AppendPortIfNeeded(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	ip, err := netip.ParseAddr(strings.Trim(addr, "[]"))
	if err != nil {
		return addr
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// resolve picks the values nftproxy uses, validating each and naming the field it came
// from in errors.
func resolve(c *v1alpha1.KubeProxyConfiguration, doc map[string]any) (Values, Parsed, []string, error) {
	present := func(path string) bool { _, ok := doc[path]; return ok }
	// unset: the document leaves the field out or gives it its zero, which is what
	// kube-proxy writes for the sections of modes it does not run
	unset := func(path string) bool { v, ok := doc[path]; return !ok || v == "0s" || v == false }
	var notes []string
	set := leaves(c)
	// pick returns the nftables.* field if the file sets it, else the iptables.* one.
	pick := func(name string) string {
		nft, ipt := "nftables."+name, "iptables."+name
		if present(nft) {
			if !unset(ipt) && !reflect.DeepEqual(set[nft], set[ipt]) {
				notes = append(notes, fmt.Sprintf("config file: %s is used; %s is ignored", nft, ipt))
			}
			return nft
		}
		if !unset(ipt) {
			return ipt
		}
		return nft
	}
	v := Values{
		Kubeconfig:          c.ClientConnection.Kubeconfig,
		KubeAPIQPS:          c.ClientConnection.QPS,
		KubeAPIBurst:        c.ClientConnection.Burst,
		KubeAPIContentType:  c.ClientConnection.ContentType,
		HostnameOverride:    c.HostnameOverride,
		ClusterCIDR:         c.ClusterCIDR,
		NodePortAddresses:   c.NodePortAddresses,
		HealthzBindAddress:  c.HealthzBindAddress,
		MetricsBindAddress:  c.MetricsBindAddress,
		EnableProfiling:     c.EnableProfiling,
		DetectLocalMode:     string(c.DetectLocalMode),
		BridgeInterface:     c.DetectLocal.BridgeInterface,
		InterfaceNamePrefix: c.DetectLocal.InterfaceNamePrefix,
		Verbosity:           int(c.Logging.Verbosity),
		LoggingFormat:       c.Logging.Format,
		Conntrack:           ConntrackFrom(c),
	}
	if len(c.FeatureGates) > 0 {
		v.FeatureGates = maps.Clone(c.FeatureGates)
	}
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}

	bitField, allField := pick("masqueradeBit"), pick("masqueradeAll")
	syncField, minField := pick("syncPeriod"), pick("minSyncPeriod")
	if strings.HasPrefix(bitField, "nftables") {
		v.MasqueradeBit = *c.NFTables.MasqueradeBit
	} else {
		v.MasqueradeBit = *c.IPTables.MasqueradeBit
	}
	v.IPTablesMasqueradeBit = *c.IPTables.MasqueradeBit
	v.MasqueradeAll = c.NFTables.MasqueradeAll
	if strings.HasPrefix(allField, "iptables") {
		v.MasqueradeAll = c.IPTables.MasqueradeAll
	}
	v.SyncPeriod, v.MinSyncPeriod = c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	if strings.HasPrefix(syncField, "iptables") {
		v.SyncPeriod = c.IPTables.SyncPeriod.Duration
	}
	if strings.HasPrefix(minField, "iptables") {
		v.MinSyncPeriod = c.IPTables.MinSyncPeriod.Duration
	}

	if err := CheckMasqueradeBit(v.MasqueradeBit); err != nil {
		fail(bitField, "%v", err)
	} else if err := CheckMasqueradeBit(v.IPTablesMasqueradeBit); err != nil {
		fail("iptables.masqueradeBit", "%v", err)
	}
	if v.SyncPeriod <= 0 {
		fail(syncField, "%v must be greater than 0", v.SyncPeriod)
	}
	if v.MinSyncPeriod < 0 {
		fail(minField, "%v must not be negative", v.MinSyncPeriod)
	} else if v.SyncPeriod > 0 && v.MinSyncPeriod > v.SyncPeriod {
		fail(minField, "%v must not exceed %s (%v)", v.MinSyncPeriod, syncField, v.SyncPeriod)
	}
	var parsed Parsed
	var err error
	if parsed.ClusterCIDRs, err = ParseClusterCIDRs(v.ClusterCIDR); err != nil {
		fail("clusterCIDR", "%v", err)
	}
	if parsed.NodePorts, err = ParseNodePortAddresses("nodePortAddresses", v.NodePortAddresses); err != nil {
		errs = append(errs, err)
	}
	if err := CheckBindAddress(v.HealthzBindAddress); err != nil {
		fail("healthzBindAddress", "%v", err)
	}
	if err := CheckBindAddress(v.MetricsBindAddress); err != nil {
		fail("metricsBindAddress", "%v", err)
	}
	if err := CheckDetectLocalMode(v.DetectLocalMode); err != nil {
		fail("detectLocalMode", "%v", err)
	}
	switch v.DetectLocalMode {
	case LocalModeBridgeInterface:
		if err := CheckInterfaceName(v.BridgeInterface); err != nil {
			fail("detectLocal.bridgeInterface", "%v (detectLocalMode is BridgeInterface)", err)
		}
	case LocalModeInterfaceNamePrefix:
		if err := CheckInterfaceName(v.InterfaceNamePrefix); err != nil {
			fail("detectLocal.interfaceNamePrefix", "%v (detectLocalMode is InterfaceNamePrefix)", err)
		}
	}
	if err := CheckLoggingFormat(v.LoggingFormat); err != nil {
		fail("logging.format", "%v", err)
	}
	if err := v.Conntrack.Check(func(f string) string { return "conntrack." + f }); err != nil {
		errs = append(errs, err)
	}
	if v.KubeAPIBurst < 0 {
		fail("clientConnection.burst", "%d must not be negative", v.KubeAPIBurst)
	}
	if v.KubeAPIQPS < 0 {
		fail("clientConnection.qps", "%v must not be negative", v.KubeAPIQPS)
	}
	return v, parsed, notes, errors.Join(errs...)
}

// notApplicable lists, one note each, the fields that differ from kube-proxy's
// defaults but mean nothing to nftproxy.
func notApplicable(c *v1alpha1.KubeProxyConfiguration) []string {
	got, def := leaves(c), leaves(Defaulted())
	var notes []string
	for path, val := range got {
		if mapped[path] || reflect.DeepEqual(val, def[path]) {
			continue
		}
		if path == "mode" && val == "nftables" {
			continue // what nftproxy does
		}
		js, _ := json.Marshal(val)
		notes = append(notes, fmt.Sprintf("config file: %s: %s has no effect in nftproxy", path, js))
	}
	sort.Strings(notes)
	return notes
}

func leaves(c *v1alpha1.KubeProxyConfiguration) map[string]any {
	data, err := json.Marshal(c)
	if err != nil {
		panic(err) // plain data
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		panic(err)
	}
	out := map[string]any{}
	flatten("", m, func(path string, v any) {
		if v != nil {
			out[path] = v
		}
	})
	return out
}

// Apply writes v into c as kube-proxy v1.37 in nftables mode writes its configuration
// (--write-config-to): mode nftables; the sync periods and masqueradeAll in the nftables
// section only (those of iptables and ipvs zero); the masquerade bits each in its own
// section; nodePortAddresses and detectLocalMode with their nftables-mode defaults. c
// read back (by nftproxy or by kube-proxy) yields v.
func (v Values) Apply(c *v1alpha1.KubeProxyConfiguration) {
	c.APIVersion, c.Kind = v1alpha1.SchemeGroupVersion.String(), "KubeProxyConfiguration"
	c.Mode = "nftables" // what nftproxy always does
	c.ClientConnection.Kubeconfig = v.Kubeconfig
	c.ClientConnection.QPS = v.KubeAPIQPS
	c.ClientConnection.Burst = v.KubeAPIBurst
	c.ClientConnection.ContentType = v.KubeAPIContentType
	c.HostnameOverride = v.HostnameOverride
	c.ClusterCIDR = v.ClusterCIDR
	c.NodePortAddresses = slices.Clone(v.NodePortAddresses)
	if len(c.NodePortAddresses) == 0 {
		c.NodePortAddresses = []string{NodePortPrimary}
	}
	c.NFTables.MasqueradeAll, c.IPTables.MasqueradeAll = v.MasqueradeAll, false
	c.NFTables.MasqueradeBit, c.IPTables.MasqueradeBit = ptr(v.MasqueradeBit), ptr(v.IPTablesMasqueradeBit)
	c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration = v.SyncPeriod, v.MinSyncPeriod
	c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration = 0, 0
	c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration = 0, 0
	c.HealthzBindAddress = v.HealthzBindAddress
	c.MetricsBindAddress = v.MetricsBindAddress
	c.EnableProfiling = v.EnableProfiling
	c.DetectLocalMode = v1alpha1.LocalMode(v.DetectLocalMode)
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = LocalModeClusterCIDR
	}
	c.DetectLocal.BridgeInterface = v.BridgeInterface
	c.DetectLocal.InterfaceNamePrefix = v.InterfaceNamePrefix
	c.Logging.Verbosity = logsapi.VerbosityLevel(v.Verbosity)
	c.Logging.Format = v.LoggingFormat
	v.Conntrack.ApplyTo(c)
	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}
	maps.Copy(c.FeatureGates, v.FeatureGates)
}

// Encode writes c as a YAML document.
func Encode(w io.Writer, c *v1alpha1.KubeProxyConfiguration) error {
	c.APIVersion, c.Kind = v1alpha1.SchemeGroupVersion.String(), "KubeProxyConfiguration"
	var buf bytes.Buffer
	s := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, nil, nil, kjson.SerializerOptions{Yaml: true})
	if err := s.Encode(c, &buf); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// WriteFile writes c to path (as --write-config-to).
func WriteFile(path string, c *v1alpha1.KubeProxyConfiguration) error {
	var buf bytes.Buffer
	if err := Encode(&buf, c); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func ptr[T any](v T) *T { return &v }
