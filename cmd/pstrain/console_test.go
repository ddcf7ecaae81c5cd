package main

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// recorder records each Write as one chunk, as a terminal shows it.
type recorder struct {
	mu     sync.Mutex
	chunks []string
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunks = append(r.chunks, string(p))
	return len(p), nil
}

// Two writers sharing a terminal, each writing its lines in pieces (as a
// pipe's reads split them), from several goroutines: every write reaching
// the terminal is whole lines of one writer.
func TestConsoleKeepsLinesWhole(t *testing.T) {
	term := &recorder{}
	var c console
	out, errw := c.lines(term), c.lines(term)
	var wg sync.WaitGroup
	for name, w := range map[string]*lineWriter{"progress": out, "log": errw} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				line := fmt.Sprintf("%s line %d with some words in it\n", name, i)
				for len(line) > 0 { // in pieces of 7 bytes
					n := min(7, len(line))
					if _, err := w.Write([]byte(line[:n])); err != nil {
						t.Error(err)
					}
					line = line[n:]
				}
			}
		}()
	}
	wg.Wait()
	n := 0
	for _, chunk := range term.chunks {
		if !strings.HasSuffix(chunk, "\n") {
			t.Fatalf("a write ends mid-line: %q", chunk)
		}
		for _, l := range strings.Split(strings.TrimSuffix(chunk, "\n"), "\n") {
			var name string
			var i int
			if _, err := fmt.Sscanf(l, "%s line %d with some words in it", &name, &i); err != nil || (name != "progress" && name != "log") {
				t.Fatalf("garbled line %q", l)
			}
			n++
		}
	}
	if n != 400 {
		t.Errorf("%d lines reached the terminal, want 400", n)
	}
}

func TestConsoleFlush(t *testing.T) {
	var b bytes.Buffer
	var c console
	w := c.lines(&b)
	fmt.Fprint(w, "done\nno newline")
	if b.String() != "done\n" {
		t.Fatalf("before Flush: %q", b.String())
	}
	if err := w.Flush(); err != nil || b.String() != "done\nno newline" {
		t.Fatalf("after Flush: %q, %v", b.String(), err)
	}
}
