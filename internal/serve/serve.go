// Package serve runs the health (/healthz, /livez) and metrics (/metrics) HTTP servers
// from the controller's sync status.
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftproxy/nftproxy/internal/controller"
)

// StatusFunc returns the controller's current status.
type StatusFunc func() controller.Status

// Healthy applies kube-proxy's rule: unhealthy when a change has waited for more than
// twice the sync period without being programmed.
func Healthy(st controller.Status, syncPeriod time.Duration, now time.Time) bool {
	return st.OldestPending.IsZero() || now.Sub(st.OldestPending) <= 2*syncPeriod
}

// HealthHandler answers /healthz and /livez with kube-proxy's JSON body.
func HealthHandler(status StatusFunc, syncPeriod time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, now := status(), time.Now()
		code := http.StatusOK
		if !Healthy(st, syncPeriod, now) {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"lastUpdated":  st.LastSync,
			"currentTime":  now,
			"nodeEligible": true,
			"syncs":        st.Syncs,
			"failures":     st.Failures,
		})
	})
}

// MetricsHandler exposes the sync metrics in Prometheus text format, with kube-proxy's
// metric names where one exists.
func MetricsHandler(status StatusFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := status()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		var last float64
		if !st.LastSync.IsZero() {
			last = float64(st.LastSync.UnixNano()) / 1e9
		}
		fmt.Fprintf(w, "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced.\n# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\nkubeproxy_sync_proxy_rules_last_timestamp_seconds %g\n", last)
		fmt.Fprintf(w, "# HELP nftproxy_sync_last_duration_seconds Duration of the last successful sync.\n# TYPE nftproxy_sync_last_duration_seconds gauge\nnftproxy_sync_last_duration_seconds %g\n", st.LastDuration.Seconds())
		fmt.Fprintf(w, "# HELP nftproxy_sync_last_kernel_seconds Time the kernel took for the last successful transaction.\n# TYPE nftproxy_sync_last_kernel_seconds gauge\nnftproxy_sync_last_kernel_seconds %g\n", st.LastKernel.Seconds())
		fmt.Fprintf(w, "# HELP nftproxy_syncs_total Successful syncs.\n# TYPE nftproxy_syncs_total counter\nnftproxy_syncs_total %d\n", st.Syncs)
		fmt.Fprintf(w, "# HELP kubeproxy_sync_proxy_rules_iptables_restore_failures_total Failed syncs (transactions the kernel refused).\n# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter\nkubeproxy_sync_proxy_rules_iptables_restore_failures_total %d\n", st.Failures)
		fmt.Fprintf(w, "# HELP nftproxy_service_ports Service ports in the last synced snapshot.\n# TYPE nftproxy_service_ports gauge\nnftproxy_service_ports %d\n", st.Services)
	})
}

// Start serves h on addr until ctx ends; an empty addr disables the server.
func Start(ctx context.Context, log logr.Logger, name, addr string, h http.Handler) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s server on %s: %w", name, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Server stopped", "server", name)
		}
	}()
	log.Info("Serving", "server", name, "address", ln.Addr().String())
	return nil
}
