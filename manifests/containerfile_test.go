package manifests

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const repoRoot = ".."

// instruction is one Containerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, …
	args string
	line int
}

type stage struct {
	from, name string
	instrs     []instruction
}

func parseContainerfile(t *testing.T, text string) []stage {
	t.Helper()
	var stages []stage
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(text, "\n") {
		l := strings.TrimSpace(raw)
		if cur.Len() == 0 && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasPrefix(l, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(l, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("line %d: %s before FROM", start, in.cmd)
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
	}
	return stages
}

// shellWords splits a simple shell command line: words, 'single' and "double" quotes.
func shellWords(s string) ([]string, error) {
	var out []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t':
			if inWord {
				out, inWord = append(out, w.String()), false
				w.Reset()
			}
		case '\'', '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unterminated quote in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case '&', '|', ';', '$', '`', '>', '<':
			return nil, fmt.Errorf("shell syntax %q not supported in %q", c, s)
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, w.String())
	}
	return out, nil
}

// buildCommand finds the build stage's `go build` RUN and splits it into environment
// assignments and the go command's arguments, with the stage's ARGs expanded: their
// defaults, overridden by buildArgs (as `--build-arg`).
func buildCommand(t *testing.T, st stage, buildArgs map[string]string) (env, goArgs []string, out string) {
	t.Helper()
	args := map[string]string{}
	for _, in := range st.instrs {
		if in.cmd == "ARG" {
			name, def, _ := strings.Cut(in.args, "=")
			args[name] = def
			if v, ok := buildArgs[name]; ok {
				args[name] = v
			}
			continue
		}
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		words, err := shellWords(os.Expand(in.args, func(k string) string { return args[k] }))
		if err != nil {
			t.Fatalf("line %d: %v", in.line, err)
		}
		for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
			env, words = append(env, words[0]), words[1:]
		}
		if len(words) < 2 || words[0] != "go" || words[1] != "build" {
			t.Fatalf("line %d: not a plain `go build`: %q", in.line, in.args)
		}
		goArgs = words[1:]
		if i := slices.Index(goArgs, "-o"); i >= 0 && i+1 < len(goArgs) {
			out = goArgs[i+1]
		}
		return env, goArgs, out
	}
	t.Fatalf("stage %s has no RUN go build", st.name)
	return nil, nil, ""
}

func TestContainerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseContainerfile(t, string(data))
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, have %d stage(s)", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	if build.name == "" || !strings.Contains(build.from, "golang") {
		t.Errorf("build stage: FROM %s AS %q, want a named golang stage", build.from, build.name)
	}
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s, want gcr.io/distroless/static…", final.from)
	}

	// The builder's Go is at least the go.mod's version.
	gomod, _ := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if m := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod)); m != nil {
		tag := build.from[strings.LastIndex(build.from, ":")+1:]
		if !strings.HasPrefix(tag, m[1]+"."+m[2]) {
			t.Errorf("builder %s, go.mod wants go %s.%s", build.from, m[1], m[2])
		}
	}

	const version, commit = "v9.8.7-containerfile-test", "0123456789abcdef"
	env, args, out := buildCommand(t, build, map[string]string{"VERSION": version, "GIT_COMMIT": commit})
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Errorf("go build without CGO_ENABLED=0: env %q", env)
	}
	if out == "" || args[len(args)-1] != "./cmd/nftproxy" {
		t.Errorf("go build args %q: want -o <file> … ./cmd/nftproxy", args)
	}

	// The final stage holds the built binary, runs as root (as the DaemonSet expects:
	// runAsUser 0 with CAP_NET_ADMIN) and starts it.
	var copied, user string
	var entrypoint []string
	for _, in := range final.instrs {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+build.name && f[1] == out {
				copied = f[2]
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entrypoint); err != nil {
				t.Errorf("ENTRYPOINT %s: not the exec (JSON) form: %v", in.args, err)
			}
		case "RUN":
			t.Errorf("line %d: RUN in the final stage (a static base has no shell)", in.line)
		}
	}
	if copied == "" {
		t.Errorf("final stage does not COPY --from=%s %s", build.name, out)
	}
	if user == "" {
		t.Error("final stage has no USER")
	} else if uid, _, _ := strings.Cut(user, ":"); uid != "0" && uid != "root" {
		t.Errorf("USER %s: the DaemonSet runs nftproxy as uid 0 with only CAP_NET_ADMIN", user)
	}
	if len(entrypoint) == 0 || entrypoint[0] != copied || path.Base(entrypoint[0]) != "nftproxy" {
		t.Errorf("ENTRYPOINT %q, want the copied binary %s", entrypoint, copied)
	}

	// Every package the binary is built from is in a directory the build stage copies.
	var copiedDirs []string
	for _, in := range build.instrs {
		if in.cmd == "COPY" {
			f := strings.Fields(in.args)
			for _, src := range f[:len(f)-1] {
				copiedDirs = append(copiedDirs, strings.TrimPrefix(path.Clean(src), "./"))
			}
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not found: build stage not run")
	}
	list := exec.Command(goTool, "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd/nftproxy")
	list.Dir = repoRoot
	dirs, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, _ := filepath.Abs(repoRoot)
	for _, d := range strings.Fields(string(dirs)) {
		rel, _ := filepath.Rel(root, d)
		top := strings.Split(filepath.ToSlash(rel), "/")[0]
		if !slices.Contains(copiedDirs, top) {
			t.Errorf("package %s is built into nftproxy but %s/ is not copied into the build stage (copied: %q)", rel, top, copiedDirs)
		}
	}

	// The build stage's command works, and makes a static binary.
	bin := filepath.Join(t.TempDir(), "nftproxy")
	a := slices.Clone(args)
	a[slices.Index(a, "-o")+1] = bin
	cmd := exec.Command(goTool, a...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	if outp, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(a, " "), err, outp)
	}
	checkStatic(t, bin)

	// The build arguments stamp the version (make image passes git's).
	if got, err := exec.Command(bin, "--version=raw").Output(); err != nil {
		t.Errorf("%s --version=raw: %v", bin, err)
	} else if !strings.Contains(string(got), `GitVersion:"`+version+`"`) || !strings.Contains(string(got), `GitCommit:"`+commit+`"`) {
		t.Errorf("built with VERSION=%s GIT_COMMIT=%s, --version=raw says %s", version, commit, got)
	}
}

func checkStatic(t *testing.T, bin string) {
	t.Helper()
	problems, err := staticProblems(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s is not static: %s", bin, p)
	}
}

// staticProblems lists why an ELF binary is dynamically linked: a PT_INTERP program
// header (an interpreter, ld.so) or DT_NEEDED entries (shared libraries).
func staticProblems(bin string) ([]string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			out = append(out, "PT_INTERP program header")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}
	if len(libs) != 0 {
		out = append(out, fmt.Sprintf("DT_NEEDED %q", libs))
	}
	return out, nil
}

// The static check can fail: a dynamically linked system binary does not pass it.
func TestStaticCheckDetectsDynamicBinary(t *testing.T) {
	for _, p := range []string{"/bin/sh", "/usr/bin/env", "/bin/ls"} {
		problems, err := staticProblems(p)
		if err != nil || len(problems) == 0 {
			continue // missing, or static on this system
		}
		if len(problems) != 2 {
			t.Errorf("%s: %q, want both PT_INTERP and DT_NEEDED", p, problems)
		}
		return
	}
	t.Skip("no dynamically linked binary found to try")
}

func TestParseContainerfile(t *testing.T) {
	st := parseContainerfile(t, "# c\nFROM a AS b\nRUN X=1 go build \\\n  -o /o ./cmd/nftproxy\nFROM c\nUSER 0\n")
	if len(st) != 2 || st[0].name != "b" || st[1].from != "c" || st[0].instrs[0].args != "X=1 go build  -o /o ./cmd/nftproxy" {
		t.Fatalf("%+v", st)
	}
	w, err := shellWords(`A=0 go build -ldflags='-s -w' -o "/x y" .`)
	if err != nil || !slices.Equal(w, []string{"A=0", "go", "build", "-ldflags=-s -w", "-o", "/x y", "."}) {
		t.Errorf("%q %v", w, err)
	}
	if _, err := shellWords("go build && rm -rf /"); err == nil {
		t.Error("shell operators accepted")
	}
}
