package dataplane

import (
	"time"
)

// Limits bound what a data-plane server holds, whatever its clients send
// (docs/security.md, "Limits"). The zero value of each field takes its
// default.
type Limits struct {
	// MaxConns is the most connections served at once; one more is
	// closed as soon as it is accepted (DefaultMaxConns).
	MaxConns int
	// MaxBuffered is the most bytes of push payloads buffered at once
	// across every connection (DefaultMaxBuffered). Once the shard's push
	// size is known (SetPushSize) it is raised, if need be, to
	// MinBufferedPushes pushes of that size.
	MaxBuffered int64
	// MinBufferedPushes is how many pushes of the shard's size the
	// budget always holds (1): the task sets the number of workers + 1,
	// so that a whole sync step's pushes never wait for one another.
	MinBufferedPushes int
	// BufferWait is how long a push waits for room in the budget before
	// it is refused as Unavailable, which workers retry
	// (DefaultBufferWait).
	BufferWait time.Duration
	// IdleTimeout closes a connection on which no request has started
	// for this long (DefaultIdleTimeout). A healthy worker is never idle
	// that long (a pull blocked at a sync barrier is a request under
	// way, not idleness), and a client whose connection was closed while
	// idle reconnects and resends by itself.
	IdleTimeout time.Duration
	// FrameGrace and MinRate bound a frame once it has started: its
	// header must arrive within FrameGrace, its payload within FrameGrace
	// + length/MinRate, and a response must be written within the same
	// (DefaultFrameGrace, DefaultMinRate bytes per second).
	FrameGrace time.Duration
	MinRate    int64
	// LogEvery is the interval of the refusal log: one line per reason
	// per interval, with the number since the previous line
	// (DefaultLogEvery).
	LogEvery time.Duration
	// KeepBuffers is how long a released push buffer is kept for reuse
	// (DefaultKeepBuffers); then it goes back to the garbage collector,
	// so a PS's memory comes down again after a burst.
	KeepBuffers time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxConns    = 256
	DefaultMaxBuffered = 64 << 20
	DefaultBufferWait  = 10 * time.Second
	DefaultIdleTimeout = 5 * time.Minute
	DefaultFrameGrace  = 10 * time.Second
	DefaultMinRate     = 1 << 20
	DefaultLogEvery    = 5 * time.Second
	DefaultKeepBuffers = time.Minute
)

// handshakeTimeout bounds a TLS handshake, like gRPC's.
const handshakeTimeout = 5 * time.Second

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxBuffered == 0 {
		l.MaxBuffered = DefaultMaxBuffered
	}
	if l.MinBufferedPushes == 0 {
		l.MinBufferedPushes = 1
	}
	if l.MinRate == 0 {
		l.MinRate = DefaultMinRate
	}
	def(&l.BufferWait, DefaultBufferWait)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	def(&l.FrameGrace, DefaultFrameGrace)
	def(&l.LogEvery, DefaultLogEvery)
	def(&l.KeepBuffers, DefaultKeepBuffers)
	return l
}

// frameTime is how long a frame, or a response, of n payload bytes may
// take once started.
func (l Limits) frameTime(n int) time.Duration {
	return l.FrameGrace + time.Duration(float64(n)/float64(l.MinRate)*float64(time.Second))
}
