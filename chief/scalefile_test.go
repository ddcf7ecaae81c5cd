package chief

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A scale request is read once per change of the file, and a file older
// than the chief is an earlier run's.
func TestScaleWatch(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	path := filepath.Join(t.TempDir(), "scale-request.json")
	write := func(s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	w := scaleWatch{since: start}
	write(`{"workers": 5, "seq": 1}`, start.Add(-time.Hour))
	if n, ok := w.poll(path, log); ok {
		t.Fatalf("an earlier run's request read: %+v", n)
	}
	write(`{"workers": 3, "seq": 2}`, start.Add(time.Second))
	if n, ok := w.poll(path, log); !ok || n.Workers != 3 || n.PS != 0 {
		t.Fatalf("poll = %+v, %t; want 3 workers", n, ok)
	}
	if _, ok := w.poll(path, log); ok {
		t.Fatal("the same request read twice")
	}
	write(`{"workers": 3, "seq": 2}`, start.Add(2*time.Second)) // rewritten, same request
	if _, ok := w.poll(path, log); ok {
		t.Fatal("a rewritten request of the same seq read again")
	}
	write(`not json`, start.Add(3*time.Second))
	if _, ok := w.poll(path, log); ok {
		t.Fatal("a broken file read")
	}
	write(`{"workers": 1, "seq": 3}`, start.Add(4*time.Second))
	if n, ok := w.poll(path, log); !ok || n.Workers != 1 {
		t.Fatalf("poll = %+v, %t; want 1 worker", n, ok)
	}
	write(`{"workers": 1, "ps": 3, "seq": 4}`, start.Add(5*time.Second))
	if n, ok := w.poll(path, log); !ok || n.Workers != 1 || n.PS != 3 {
		t.Fatalf("poll = %+v, %t; want 1 worker and 3 PS", n, ok)
	}
	if _, ok := w.poll("", log); ok {
		t.Fatal("no file: a request")
	}
}
