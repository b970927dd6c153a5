package monitor

// ReadGate holds the monitor's reads until gate is closed, so that a test can make the
// kernel overflow the socket for certain (a reader that keeps up loses nothing).
func ReadGate(gate <-chan struct{}) Option {
	return func(m *Monitor) { m.beforeRead = func() { <-gate } }
}
