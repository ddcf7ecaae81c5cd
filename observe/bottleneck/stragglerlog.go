package bottleneck

import (
	"slices"
	"sync"
	"time"
)

// Defaults of the straggler log's windows (docs/observability.md,
// "Stragglers").
const (
	// StragglerWindow is how much of the recent past each window the log
	// is given should cover: long enough for a few hundred steps of the
	// default model, short enough to name a slowed worker within seconds.
	StragglerWindow = 5 * time.Second
	// StragglerPersist is how many consecutive windows must name a worker
	// before the log counts it as a straggler of the run.
	StragglerPersist = 2
)

// RunStraggler is a worker a run counted as a straggler: an entry of the
// report's stragglers.
type RunStraggler struct {
	Task string `json:"task"`
	// Slowdown is the median of its slowdowns over the windows that
	// named it.
	Slowdown float64 `json:"slowdown"`
	// DetectedAtSeconds is when it was counted (the end of the
	// StragglerPersist-th consecutive window naming it) and
	// LastSeenSeconds the end of the last window naming it, in seconds
	// since the run started.
	DetectedAtSeconds float64 `json:"detected_at_seconds"`
	LastSeenSeconds   float64 `json:"last_seen_seconds"`
}

// StragglerLog follows the stragglers named by a run's successive windows
// (sliding windows of about StragglerWindow, one a second) and counts a
// worker as a straggler of the run once StragglerPersist consecutive
// windows name it. It is safe for concurrent use.
type StragglerLog struct {
	mu      sync.Mutex
	streak  map[string][]float64 // task -> slowdowns of its current streak
	counted map[string]*counted
	order   []string // counted tasks, in the order counted
}

type counted struct {
	first, last float64
	slowdowns   []float64
}

// NewStragglerLog returns an empty log.
func NewStragglerLog() *StragglerLog {
	return &StragglerLog{streak: map[string][]float64{}, counted: map[string]*counted{}}
}

// Observe adds a window ending at seconds since the run started, with the
// stragglers it names; it returns those counted now for the first time.
func (l *StragglerLog) Observe(at float64, named []Straggler) []Straggler {
	l.mu.Lock()
	defer l.mu.Unlock()
	var fresh []Straggler
	seen := map[string]bool{}
	for _, s := range named {
		seen[s.Task] = true
		if c, ok := l.counted[s.Task]; ok {
			c.last = at
			c.slowdowns = append(c.slowdowns, s.Slowdown)
			continue
		}
		l.streak[s.Task] = append(l.streak[s.Task], s.Slowdown)
		if len(l.streak[s.Task]) >= StragglerPersist {
			l.counted[s.Task] = &counted{first: at, last: at, slowdowns: slices.Clone(l.streak[s.Task])}
			l.order = append(l.order, s.Task)
			fresh = append(fresh, s)
		}
	}
	for task := range l.streak {
		if !seen[task] {
			delete(l.streak, task)
		}
	}
	return fresh
}

// Stragglers are the workers counted so far, in the order counted; an
// empty list (not nil) when none.
func (l *StragglerLog) Stragglers() []RunStraggler {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []RunStraggler{}
	for _, task := range l.order {
		c := l.counted[task]
		out = append(out, RunStraggler{Task: task, Slowdown: median(slices.Clone(c.slowdowns)), DetectedAtSeconds: c.first, LastSeenSeconds: c.last})
	}
	return out
}
