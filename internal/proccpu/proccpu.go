// Package proccpu reads the CPU time the process has used, for the
// benchmarks that report CPU per operation (cpu-ns/op): on a shared
// machine the CPU a step takes moves much less with the load than its
// wall time does.
package proccpu

import "time"

// Self is the user and system CPU time the process has used so far.
func Self() (time.Duration, error) { return self() }
