package pipeline

import (
	"fmt"
	"net"
	"path"
	"slices"

	"github.com/nftproxy/nftproxy/internal/compile"
)

// fastPathDevices resolves --fast-path-interfaces into the interfaces the machine has
// now (compile.FastPath); without patterns, the fast path is cfg.Compile.FastPath. Pod interfaces come and go between syncs: they are matched
// on every compile, which costs one listing of the interfaces, and the flowtable
// follows (the kernel drops a deleted interface from it by itself).
func fastPathDevices(cfg Config) (compile.FastPath, error) {
	if len(cfg.FastPathInterfaces) == 0 {
		return cfg.Compile.FastPath, nil
	}
	list := cfg.Interfaces
	if list == nil {
		list = interfaceNames
	}
	names, err := list()
	if err != nil {
		return compile.FastPath{}, fmt.Errorf("listing the interfaces for --fast-path-interfaces: %w", err)
	}
	var devs []string
	for _, name := range names {
		for _, p := range cfg.FastPathInterfaces {
			if ok, _ := path.Match(p, name); ok && len(name) <= 15 {
				devs = append(devs, name)
				break
			}
		}
	}
	slices.Sort(devs)
	return compile.FastPath{Devices: slices.Compact(devs)}, nil
}

// interfaceNames lists the names of the machine's interfaces.
func interfaceNames() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ifs))
	for i, ifc := range ifs {
		out[i] = ifc.Name
	}
	return out, nil
}
