package main

import (
	"io"

	"github.com/go-logr/logr"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as kube-proxy
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/options"
)

// newLogger sets up logging the way kube-proxy does, with component-base's logs API,
// writing to w (kube-proxy writes to standard error):
//
//   - --logging-format=text (the default) is klog's text layout, one line per entry:
//     `I1124 12:00:00.000000  1234 controller.go:219] "Synced" services=42 took="8ms"`;
//   - --logging-format=json is component-base's JSON logger (zap): ts (Unix
//     milliseconds), caller, msg, v (the verbosity of an info line), err, then the
//     key/value pairs.
//
// -v shows a logr V(n) line when n <= -v; --vmodule sets it per source file (text only).
// client-go's own log lines (klog) and the standard library's log package go to the
// same stream, through the same logger. It returns klog's logger; logs.FlushLogs
// (flushLogs) writes out anything buffered and must run on every exit path after this.
//
// Logging can be set up once per process (component-base refuses a second time).
func newLogger(w io.Writer, o *options.Options) (logr.Logger, error) {
	c := loggingConfiguration(o)
	logs.InitLogs() // the standard library's log package goes to klog
	if err := logsapi.ValidateAndApplyWithOptions(c, &logsapi.LoggingOptions{ErrorStream: w, InfoStream: w}, nil); err != nil {
		return logr.Logger{}, err
	}
	return klog.Background(), nil
}

// loggingConfiguration is the component-base logging configuration for the options:
// format, verbosity and vmodule; the rest as kube-proxy's defaults.
func loggingConfiguration(o *options.Options) *logsapi.LoggingConfiguration {
	c := logsapi.NewLoggingConfiguration()
	if o.LoggingFormat != "" {
		c.Format = o.LoggingFormat
	}
	c.Verbosity = logsapi.VerbosityLevel(max(o.Verbosity, 0))
	c.VModule = o.VModule
	return c
}

// flushLogs writes out what the logger buffers; main calls it before it exits.
func flushLogs() { logs.FlushLogs() }
