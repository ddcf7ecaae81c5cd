package main

import (
	"bytes"
	"io"
	"sync"
)

// console keeps whole lines whole on a terminal that several writers
// share: `pstrain run`'s log lines (stderr), the chief's progress copied
// from its pipe and the bottleneck lines (stdout). Each writer from
// lines passes on only complete lines, under the console's one lock, so
// a log line never lands inside a progress line however the pipe splits
// its reads; a partial line waits for its end (or for Flush).
type console struct {
	mu sync.Mutex
}

// lines returns a writer to w that writes whole lines only.
func (c *console) lines(w io.Writer) *lineWriter { return &lineWriter{c: c, w: w} }

// lineWriter is one of a console's writers.
type lineWriter struct {
	c   *console
	w   io.Writer
	buf []byte // the line begun and not yet ended; guarded by c.mu
}

// Write buffers p and writes every complete line it ends. It always
// accepts all of p; an error is the underlying writer's.
func (l *lineWriter) Write(p []byte) (int, error) {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	l.buf = append(l.buf, p...)
	end := bytes.LastIndexByte(l.buf, '\n')
	if end < 0 {
		return len(p), nil
	}
	_, err := l.w.Write(l.buf[:end+1])
	l.buf = append(l.buf[:0], l.buf[end+1:]...)
	return len(p), err
}

// Flush writes a pending partial line.
func (l *lineWriter) Flush() error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if len(l.buf) == 0 {
		return nil
	}
	_, err := l.w.Write(l.buf)
	l.buf = l.buf[:0]
	return err
}
