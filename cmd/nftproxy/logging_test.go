package main

import (
	"bytes"
	"encoding/json"
	"errors"
	stdlog "log"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/options"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testLogger sets logging up as main does, from the command line args, writing to a
// buffer. The process-wide logging state (component-base's, klog's) is restored when the
// test ends, so each test can set it up again.
func testLogger(t *testing.T, args ...string) (logr.Logger, *syncBuffer) {
	t.Helper()
	var stderr bytes.Buffer
	fs, o := options.NewFlagSet()
	if code, exit := configure(fs, o, args, &stderr); exit {
		t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
	}
	state := klog.CaptureState()
	buf := &syncBuffer{}
	log, err := newLogger(buf, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		flushLogs()
		if err := logsapi.ResetForTest(nil); err != nil {
			t.Error(err)
		}
		state.Restore()
		stdlog.SetOutput(os.Stderr)
		stdlog.SetFlags(stdlog.LstdFlags)
	})
	return log, buf
}

// klogLine is klog's text header: severity, MMDD, time with microseconds, thread id,
// file:line, "] ", then the message.
var klogLine = regexp.MustCompile(`^([IWEF])(\d{4}) (\d{2}:\d{2}:\d{2}\.\d{6}) +(\d+) ([^ :\]]+):(\d+)\] (.*)$`)

func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }

func TestLogTextFormat(t *testing.T) {
	log, buf := testLogger(t, "-v=2")
	_, _, line, _ := runtime.Caller(0)
	log.Info("Starting nftproxy", "node", "n1", "took", 8*time.Millisecond)
	log.Error(errors.New("boom"), "Sync failed", "family", "ip")
	log.WithName("healthcheck").V(2).Info("Serving", "port", 30001)
	klog.V(2).InfoS("Reflector list", "resource", "services") // client-go's calls
	klog.Warningf("client-go %s", "warning")
	stdlog.Printf("from the standard library's log")
	want := []struct {
		severity, file, body string
	}{
		{"I", "logging_test.go", `"Starting nftproxy" node="n1" took="8ms"`},
		{"E", "logging_test.go", `"Sync failed" err="boom" family="ip"`},
		{"I", "logging_test.go", `"Serving" logger="healthcheck" port=30001`},
		{"I", "logging_test.go", `"Reflector list" resource="services"`},
		{"W", "logging_test.go", `client-go warning`},
		{"I", "", `"from the standard library's log"`}, // file: as kube-proxy's, "???"
	}
	got := lines(buf.String())
	if len(got) != len(want) {
		t.Fatalf("want %d lines, got:\n%s", len(want), buf.String())
	}
	now := time.Now()
	for i, w := range want {
		m := klogLine.FindStringSubmatch(got[i])
		if m == nil {
			t.Errorf("line %d is not klog's text layout: %q", i, got[i])
			continue
		}
		if m[1] != w.severity || (w.file != "" && m[5] != w.file) || m[7] != w.body {
			t.Errorf("line %d: severity %s file %s body %s; want %s %s %s", i, m[1], m[5], m[7], w.severity, w.file, w.body)
		}
		if m[2] != now.Format("0102") && m[2] != now.Add(-time.Minute).Format("0102") {
			t.Errorf("line %d: date %s, today is %s", i, m[2], now.Format("0102"))
		}
		if n, _ := strconv.Atoi(m[6]); i < 4 && n != line+1+i {
			t.Errorf("line %d: caller line %d, want %d (the log call)", i, n, line+1+i)
		}
	}
}

func TestLogJSONFormat(t *testing.T) {
	log, buf := testLogger(t, "--logging-format=json", "-v=2")
	before := float64(time.Now().UnixMilli())
	log.V(2).Info("Synced", "services", 3, "took", 1500*time.Millisecond)
	log.Error(errors.New("boom"), "Sync failed")
	log.V(3).Info("hidden")
	klog.V(2).InfoS("Reflector list", "resource", "services") // client-go's calls
	klog.Infof("client-go %s", "printf")
	got := lines(buf.String())
	if len(got) != 4 {
		t.Fatalf("want 4 lines, got:\n%s", buf.String())
	}
	parsed := make([]map[string]any, len(got))
	for i, l := range got {
		if err := json.Unmarshal([]byte(l), &parsed[i]); err != nil {
			t.Fatalf("line %d is not JSON: %s: %v", i, l, err)
		}
		if ts, ok := parsed[i]["ts"].(float64); !ok || ts < before || ts > before+60_000 {
			t.Errorf("line %d: ts %v is not epoch milliseconds near %v", i, parsed[i]["ts"], before)
		}
		if c, _ := parsed[i]["caller"].(string); !strings.HasPrefix(c, "nftproxy/logging_test.go:") {
			t.Errorf("line %d: caller %q", i, parsed[i]["caller"])
		}
	}
	if m := parsed[0]; m["msg"] != "Synced" || m["v"] != 2.0 || m["services"] != 3.0 || m["took"] != "1.5s" {
		t.Errorf("info line: %v", m)
	}
	if m := parsed[1]; m["msg"] != "Sync failed" || m["err"] != "boom" || m["v"] != nil {
		t.Errorf("error line: %v", m)
	}
	if m := parsed[2]; m["msg"] != "Reflector list" || m["v"] != 2.0 || m["resource"] != "services" {
		t.Errorf("klog structured line: %v", m)
	}
	if m := parsed[3]; m["msg"] != "client-go printf" || m["v"] != 0.0 {
		t.Errorf("klog printf line: %v", m)
	}
}

func TestLogVerbosity(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		for _, v := range []int{0, 2, 4} {
			t.Run(format+"/"+strconv.Itoa(v), func(t *testing.T) {
				log, buf := testLogger(t, "--logging-format="+format, "-v="+strconv.Itoa(v))
				log.Info("Starting nftproxy")
				log.V(2).Info("Synced")
				log.V(4).Info("Detail")
				log.Error(errors.New("boom"), "Sync failed")
				klog.V(2).InfoS("client-go v2 line")
				klog.V(5).InfoS("client-go v5 line")
				out := buf.String()
				for line, shown := range map[string]bool{
					"Starting nftproxy": true,
					"Synced":            v >= 2,
					"Detail":            v >= 4,
					"Sync failed":       true,
					"client-go v2 line": v >= 2,
					"client-go v5 line": false,
				} {
					if strings.Contains(out, line) != shown {
						t.Errorf("%q shown=%v, want %v; output:\n%s", line, !shown, shown, out)
					}
				}
			})
		}
	}
}

func TestLogVModule(t *testing.T) {
	log, buf := testLogger(t, "-v=0", "--vmodule=logging_test=2")
	log.V(2).Info("V(2) from logging_test.go")
	log.V(3).Info("V(3) from logging_test.go")
	logV2Elsewhere(log)
	klog.V(2).InfoS("klog V(2) from logging_test.go")
	log.Info("V(0)")
	out := buf.String()
	for line, shown := range map[string]bool{
		"V(2) from logging_test.go":      true,
		"V(3) from logging_test.go":      false,
		"V(2) from another file":         false,
		"klog V(2) from logging_test.go": true,
		"V(0)":                           true,
	} {
		if strings.Contains(out, line) != shown {
			t.Errorf("%q shown=%v, want %v; output:\n%s", line, !shown, shown, out)
		}
	}
}

// The config file's logging section (format, verbosity) is applied; a flag wins over it.
func TestLogFromConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging: {format: json, verbosity: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("file", func(t *testing.T) {
		log, buf := testLogger(t, "--config", path)
		log.V(2).Info("Synced")
		var m map[string]any
		if err := json.Unmarshal([]byte(strings.TrimSpace(buf.String())), &m); err != nil || m["msg"] != "Synced" {
			t.Errorf("want the V(2) line in JSON: %q (%v)", buf.String(), err)
		}
	})
	t.Run("flags win", func(t *testing.T) {
		log, buf := testLogger(t, "--config", path, "-v=0", "--logging-format=text")
		log.V(2).Info("Synced")
		log.Info("Started")
		if out := buf.String(); strings.Contains(out, "Synced") || !klogLine.MatchString(strings.TrimSpace(out)) {
			t.Errorf("want only the V(0) line in text: %q", out)
		}
	})
}

func TestLogFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--logging-format=json", "--vmodule=controller=4"}, "--vmodule works with --logging-format=text only"},
		{[]string{"--vmodule=controller"}, "--vmodule"},
		{[]string{"--vmodule=controller=x"}, "--vmodule"},
		{[]string{"--logging-format=xml"}, "--logging-format"},
		{[]string{"-v=-1"}, "-v"},
	} {
		var stderr bytes.Buffer
		fs, o := options.NewFlagSet()
		if code, exit := configure(fs, o, tc.args, &stderr); code != 2 || !exit || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: code %d exit %v: %q, want 2 and %q", tc.args, code, exit, stderr.String(), tc.want)
		}
	}
}

// The nftproxy process itself logs in the format asked for, up to its last line on an
// exit with an error (here: no API server configuration).
func TestLogProcess(t *testing.T) {
	code, _, stderr := runMain(t, "--logging-format=json", "-v=2", "--hostname-override=n1")
	got := lines(stderr)
	if code != 1 || len(got) < 2 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr)
	}
	for _, l := range got {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["msg"] == nil {
			t.Errorf("not a JSON log line: %q (%v)", l, err)
		}
	}
	var last map[string]any
	_ = json.Unmarshal([]byte(got[len(got)-1]), &last)
	if last["msg"] != "nftproxy failed" || !strings.Contains(last["err"].(string), "API client config") {
		t.Errorf("last line: %v", last)
	}
	if !strings.Contains(got[0], `"msg":"nftproxy version"`) {
		t.Errorf("first line: %s", got[0])
	}

	code, _, stderr = runMain(t, "--hostname-override=n1")
	got = lines(stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr)
	}
	for _, l := range got {
		if !klogLine.MatchString(l) {
			t.Errorf("not klog's text layout: %q", l)
		}
	}
	if l := got[len(got)-1]; !strings.HasPrefix(l, "E") || !strings.Contains(l, `] "nftproxy failed" err="building API client config`) {
		t.Errorf("last line: %s", l)
	}
}
