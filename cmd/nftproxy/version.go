package main

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"

	"github.com/nftproxy/nftproxy/internal/version"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// stdout is where --version prints; tests replace it.
var stdout io.Writer = os.Stdout

// versionFlag is --version as kube-proxy's: --version (or =true) prints
// "nftproxy <version>", --version=raw the whole version record, and exits 0.
type versionFlag string

func (v *versionFlag) String() string   { return string(*v) }
func (v *versionFlag) Type() string     { return "version" }
func (v *versionFlag) IsBoolFlag() bool { return true }
func (v *versionFlag) Set(s string) error {
	if s == "raw" {
		*v = "raw"
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		// kube-proxy also takes --version=vX.Y.Z to report another version; nftproxy
		// has no emulated versions.
		return fmt.Errorf("%q: want true, false or raw", s)
	}
	*v = versionFlag(strconv.FormatBool(b))
	return nil
}

// addVersionFlag adds --version to fs.
func addVersionFlag(fs *pflag.FlagSet) *versionFlag {
	v := versionFlag("false")
	fs.Var(&v, "version", "--version, --version=raw prints version information and quits.")
	fs.Lookup("version").NoOptDefVal = "true"
	return &v
}

// printVersion prints what --version asked for; it reports whether it printed.
func printVersion(v *versionFlag, w io.Writer) bool {
	switch *v {
	case "raw":
		fmt.Fprintln(w, version.Raw())
	case "true":
		fmt.Fprintln(w, version.String())
	default:
		return false
	}
	return true
}

// kernelCheckSkipEnv are the environment variables that skip the kernel release check
// (for a distribution kernel with the features backported): nftproxy's, and
// kube-proxy's name for the same, so a kube-proxy DaemonSet's env works unchanged.
var kernelCheckSkipEnv = []string{"NFTPROXY_SKIP_KERNEL_VERSION_CHECK", "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK"}

// logVersion logs, at -v=0, which nftproxy this is and the kernel it runs on, with the
// nf_tables features nftproxy uses that this kernel release has.
func logVersion(log logr.Logger, release func() (kernel.Release, error)) {
	info := version.Get()
	kv := []any{"version", info.GitVersion, "gitCommit", info.GitCommit, "goVersion", info.GoVersion, "platform", info.Platform}
	r, err := release()
	if err != nil {
		log.Info("nftproxy version", append(kv, "kernel", "unknown: "+err.Error())...)
		return
	}
	log.Info("nftproxy version", append(kv, "kernel", r.Raw, "nftablesFeatures", kernel.Available(r))...)
}

// checkKernel refuses a kernel older than the oldest whose nf_tables has every feature
// nftproxy's ruleset uses; it warns for one older than kube-proxy's floor.
func checkKernel(log logr.Logger, release func() (kernel.Release, error)) error {
	for _, env := range kernelCheckSkipEnv {
		if os.Getenv(env) != "" {
			log.Info("Kernel version check skipped", "env", env)
			return nil
		}
	}
	r, err := release()
	if err != nil {
		return fmt.Errorf("cannot check the kernel version (set %s=1 to skip the check): %w", kernelCheckSkipEnv[0], err)
	}
	warning, err := kernel.CheckRelease(r)
	if err != nil {
		return fmt.Errorf("%w (if this distribution kernel has the features backported, set %s=1 to skip the check)", err, kernelCheckSkipEnv[0])
	}
	if warning != "" {
		log.Info("Warning: " + warning)
	}
	return nil
}
