package runner

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user and system) the process has used so far, for
// MeasureCPU; −1 if the kernel does not say.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
