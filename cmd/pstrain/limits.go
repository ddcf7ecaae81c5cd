package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/pstrain/pstrain/preflight"
	"github.com/pstrain/pstrain/task"
	"github.com/pstrain/pstrain/transport/dataplane"
)

// limitFlags are a task's resource limits (docs/security.md, "Limits").
type limitFlags struct {
	maxConns      *int
	maxBufferedMB *int
	idleTimeout   *time.Duration
}

func bindLimitFlags(fs *flag.FlagSet) limitFlags {
	return limitFlags{
		maxConns: fs.Int("max-connections", 0,
			"connections each listener (gRPC; a PS's data plane) serves at once; more are closed at once (0 = 2 per chief and PS and 6 per worker of the cluster, + 64)"),
		maxBufferedMB: fs.Int("max-buffered-mb", dataplane.DefaultMaxBuffered>>20,
			"ps: MiB of push payloads the data plane buffers at once over all connections, at least (workers + 1) pushes of the shard"),
		idleTimeout: fs.Duration("idle-timeout", dataplane.DefaultIdleTimeout,
			"close a connection with no request for this long (clients reconnect by themselves)"),
	}
}

func (l limitFlags) validate() error {
	switch {
	case *l.maxConns < 0:
		return fmt.Errorf("--max-connections must be >= 0 (0: the default), got %d", *l.maxConns)
	case *l.maxBufferedMB <= 0:
		return fmt.Errorf("--max-buffered-mb must be > 0, got %d", *l.maxBufferedMB)
	}
	return preflight.Positive("--idle-timeout", *l.idleTimeout)
}

func (l limitFlags) apply(o *task.Options) {
	o.MaxConnections = *l.maxConns
	o.MaxBufferedBytes = int64(*l.maxBufferedMB) << 20
	o.IdleTimeout = *l.idleTimeout
}
