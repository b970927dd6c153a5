package pipeline

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/nft"
)

// fill sets every field of v (a settable struct), down to its nested structs, to a
// value that is not zero, and fails for a field it cannot set.
func fill(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Interface().(type) {
	case netip.Addr:
		v.Set(reflect.ValueOf(netip.MustParseAddr("192.0.2.77")))
		return
	case netip.Prefix:
		v.Set(reflect.ValueOf(netip.MustParsePrefix("198.51.100.0/24")))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				t.Fatalf("%s.%s is unexported: a setting must be an exported field", path, f.Name)
			}
			fill(t, v.Field(i), path+"."+f.Name)
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.String:
		v.SetString("x")
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(t, s.Index(0), path+"[0]")
		v.Set(s)
	default:
		t.Fatalf("%s: no value for a %s in this test", path, v.Kind())
	}
	if v.IsZero() {
		t.Fatalf("%s is still zero", path)
	}
}

// Every setting of the proxy's configuration reaches each family's compiler as it was
// given: the compiler configuration is the pipeline's Compile with only the family set
// (and node ports on every local address, which Compile already asks for here).
func TestEverySettingReachesTheCompiler(t *testing.T) {
	var cfg Config
	fill(t, reflect.ValueOf(&cfg.Compile).Elem(), "Compile")
	cfg.LocalAddrs = func() ([]netip.Addr, error) { return nil, nil }
	pl := New()
	if _, _, _, err := pl.Full(cfg, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, fam := range Families {
		want := cfg.Compile
		want.Family = fam
		got := pl.compilers[fam].cfg
		if reflect.DeepEqual(got, want) {
			continue
		}
		gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
		for i := range gv.NumField() {
			if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
				t.Errorf("%s: compile.Config.%s is %v, want %v", fam, gv.Type().Field(i).Name, gv.Field(i).Interface(), wv.Field(i).Interface())
			}
		}
	}
}

// CompileConfig sets the family, and node ports on every local address when the
// family's --nodeport-addresses resolve so.
func TestCompileConfig(t *testing.T) {
	cfg := Config{Compile: compile.Config{MasqueradeBit: 14}}
	got := cfg.CompileConfig(nft.IPv6, true)
	if want := (compile.Config{Family: nft.IPv6, MasqueradeBit: 14, NodePortAllLocal: true}); !reflect.DeepEqual(got, want) {
		t.Errorf("CompileConfig(IPv6, true) = %+v, want %+v", got, want)
	}
	if got := cfg.CompileConfig(nft.IPv4, false); got.NodePortAllLocal || got.Family != nft.IPv4 {
		t.Errorf("CompileConfig(IPv4, false) = %+v", got)
	}
}
