package embed

import (
	"context"
	"fmt"
	"sync"
)

// Rows is where a trainer reads and trains embedding rows: tables in its
// own process (Local), or the rows' shards on the parameter servers. keys
// are unique within a call; out and grads hold len(keys) rows of the
// table's dimension. step is the trainer's step, the rows' last sighting.
type Rows interface {
	Pull(ctx context.Context, step int64, table string, keys []uint64, out []float32) error
	Push(ctx context.Context, step int64, table string, keys []uint64, grads []float32) error
}

// TableRows is one table's share of a call over several tables: its
// unique keys and len(Keys) rows of the table's dimension (pulled into,
// or gradients pushed).
type TableRows struct {
	Table string
	Keys  []uint64
	Rows  []float32
}

// MultiRows is Rows that also serves several tables in one call (the
// parameter servers: a request per shard for them all, not one per
// table and shard). A trainer uses it when its Rows has it.
type MultiRows interface {
	Rows
	PullTables(ctx context.Context, step int64, tables []TableRows) error
	PushTables(ctx context.Context, step int64, tables []TableRows) error
}

// Local is a set of tables held in one process, safe for concurrent use
// (one lock for all: it serves a single-process trainer and tests).
type Local struct {
	mu     sync.Mutex
	tables map[string]*Table
}

// NewLocal returns the tables of cfgs, empty.
func NewLocal(cfgs []TableConfig) (*Local, error) {
	l := &Local{tables: make(map[string]*Table, len(cfgs))}
	for _, c := range cfgs {
		if _, dup := l.tables[c.Name]; dup {
			return nil, fmt.Errorf("embed: table %s named twice", c.Name)
		}
		t, err := NewTable(c)
		if err != nil {
			return nil, err
		}
		l.tables[c.Name] = t
	}
	return l, nil
}

func (l *Local) table(name string) (*Table, error) {
	t, ok := l.tables[name]
	if !ok {
		return nil, fmt.Errorf("embed: no table %q", name)
	}
	return t, nil
}

// Pull implements Rows.
func (l *Local) Pull(_ context.Context, step int64, table string, keys []uint64, out []float32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, err := l.table(table)
	if err != nil {
		return err
	}
	return t.Pull(step, keys, out)
}

// Peek reads rows without creating any (Table.Peek): for evaluation.
func (l *Local) Peek(table string, keys []uint64, out []float32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, err := l.table(table)
	if err != nil {
		return err
	}
	return t.Peek(keys, out)
}

// Push implements Rows.
func (l *Local) Push(_ context.Context, step int64, table string, keys []uint64, grads []float32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, err := l.table(table)
	if err != nil {
		return err
	}
	return t.Push(step, keys, grads)
}

// Stats returns each table's counters, by name.
func (l *Local) Stats() map[string]TableStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := make(map[string]TableStats, len(l.tables))
	for n, t := range l.tables {
		s[n] = t.Stats()
	}
	return s
}
