package main

import "github.com/go-logr/logr"

// logV2Elsewhere logs one V(2) line from this file, for the --vmodule test: a pattern for
// logging_test only must not show it.
func logV2Elsewhere(log logr.Logger) { log.V(2).Info("V(2) from another file") }
