// Package status holds the proxy's sync state: the controller keeps it, the health
// servers (internal/serve) read it. A plain data type, so that neither imports the
// other.
package status

import "time"

// Sync is the proxy's sync state, for health checks. (Metrics go to the metrics
// recorder.)
type Sync struct {
	LastSync      time.Time // end of the last successful sync
	OldestPending time.Time // first change not yet synced; zero if none
	Syncs         int
	Failures      int
	LastError     string
}
