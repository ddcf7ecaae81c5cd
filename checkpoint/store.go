package checkpoint

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pstrain/pstrain/internal/parallel"
)

// ErrNoCheckpoint is returned by Latest when the directory holds no valid
// checkpoint.
var ErrNoCheckpoint = errors.New("checkpoint: no valid checkpoint")

// ErrAllDamaged is wrapped, with ErrNoCheckpoint, by the error Latest
// returns when the directory holds checkpoints but none verifies: unlike
// an empty directory, that is no reason to start afresh.
var ErrAllDamaged = errors.New("every checkpoint is damaged")

// ErrRetention is wrapped by the error Commit returns when the checkpoint
// was committed but deleting old checkpoints failed; the new checkpoint is
// durable regardless.
var ErrRetention = errors.New("checkpoint: committed, but retention cleanup failed")

const (
	dirPrefix   = "ckpt-"
	tmpSuffix   = ".tmp"   // checkpoint being written
	trashSuffix = ".trash" // checkpoint being deleted
	// maxManifestSize bounds what is read of a MANIFEST.json.
	maxManifestSize = 256 << 20
)

// DirName returns the name of the directory of the checkpoint for step:
// "ckpt-" and the step zero-padded to 12 digits.
func DirName(step int64) string { return fmt.Sprintf("%s%012d", dirPrefix, step) }

type dirKind int

const (
	kindComplete dirKind = iota
	kindTmp
	kindTrash
)

// parseDirName parses "ckpt-<digits>[.tmp|.trash]".
func parseDirName(name string) (step int64, kind dirKind, ok bool) {
	rest, found := strings.CutPrefix(name, dirPrefix)
	if !found {
		return 0, 0, false
	}
	kind = kindComplete
	if r, found := strings.CutSuffix(rest, tmpSuffix); found {
		rest, kind = r, kindTmp
	} else if r, found := strings.CutSuffix(rest, trashSuffix); found {
		rest, kind = r, kindTrash
	}
	if len(rest) < 12 {
		return 0, 0, false
	}
	for i := 0; i < len(rest); i++ {
		if rest[i] < '0' || rest[i] > '9' {
			return 0, 0, false
		}
	}
	step, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || DirName(step) != dirPrefix+rest {
		return 0, 0, false
	}
	return step, kind, true
}

// Store writes, lists, verifies and loads the checkpoints kept in one
// directory. Its methods may be called concurrently, and several processes
// may write shards of the same checkpoint into the same directory; only one
// (the chief) may Commit.
type Store struct {
	fs   FS
	dir  string
	keep int
	log  *slog.Logger // nil: say nothing
	// dirMode and fileMode are the permissions of what it creates.
	dirMode, fileMode fs.FileMode
	// parallelHash: a shard file is hashed on a goroutine of its own,
	// from the tensors, while it is written (Go code may run on two
	// processors, GOMAXPROCS at NewStore); else from the bytes as they
	// are written.
	parallelHash bool
}

// NewStore returns a Store for the checkpoints in dir on fsys. After each
// commit it keeps the keep newest complete checkpoints (all if keep <= 0).
// The directory is created when the first shard is written.
func NewStore(fsys FS, dir string, keep int) *Store {
	return &Store{fs: fsys, dir: dir, keep: keep, dirMode: fs.FileMode(DefaultDirMode), fileMode: DefaultDirMode.fileMode(),
		parallelHash: runtime.GOMAXPROCS(0) > 1}
}

// DefaultDirMode is the permission of the directories a Store makes
// (its files get the same without the execute bits): only the owner,
// the run's user, may read the model.
const DefaultDirMode DirMode = 0o700

// DirMode is the permission bits of a Store's directories; its files get
// the same bits without execute (0750: directories 0750, files 0640).
// The process's umask applies on top, as for any file it creates.
type DirMode fs.FileMode

func (m DirMode) fileMode() fs.FileMode { return fs.FileMode(m).Perm() &^ 0o111 }

// WithMode returns a copy of s that makes its directories with mode
// (see DirMode; 0: DefaultDirMode).
func (s *Store) WithMode(mode DirMode) *Store {
	c := *s
	if mode == 0 {
		mode = DefaultDirMode
	}
	c.dirMode, c.fileMode = fs.FileMode(mode).Perm(), mode.fileMode()
	return &c
}

// DirMode is the permission of the directories the store makes.
func (s *Store) DirMode() fs.FileMode { return s.dirMode }

// WithLog returns a copy of s that logs, as warnings, what it deletes to
// make room on a full disk.
func (s *Store) WithLog(l *slog.Logger) *Store {
	c := *s
	c.log = l
	return &c
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Path returns the path of the (complete) checkpoint for step.
func (s *Store) Path(step int64) string { return filepath.Join(s.dir, DirName(step)) }

func (s *Store) tmpPath(step int64) string {
	return filepath.Join(s.dir, DirName(step)+tmpSuffix)
}

// tempName returns a unique temporary name for a file to be renamed to
// final, so that concurrent writers never share a temporary file.
func tempName(final string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "." + final + ".tmp-" + hex.EncodeToString(b[:])
}

// ensureDir creates dir if missing and makes each created entry durable.
func (s *Store) ensureDir(dir string) error {
	if _, err := s.fs.Stat(dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := s.ensureDir(parent); err != nil {
			return err
		}
	}
	if err := s.fs.MkdirAll(dir, s.dirMode); err != nil {
		return err
	}
	if parent == dir {
		return nil
	}
	return s.fs.SyncDir(parent)
}

// hashSafetensors returns the SHA-256 of the bytes that
// writeWithHeader(w, header, tensors, native) writes, without writing them.
func hashSafetensors(header []byte, tensors []Tensor, native bool) []byte {
	h := sha256.New()
	_, _ = writeWithHeader(h, header, tensors, native) // hash.Hash never fails
	return h.Sum(nil)
}

// writeHashed writes a shard file's bytes to f, fsyncs it and returns
// the bytes' SHA-256 and count. With parallelHash the same bytes are
// hashed from memory on another goroutine while the file is written and
// fsynced (SHA-256 costs about as much as the fsynced write; Commit
// re-reads the file to check the hash). Without, on one processor, that
// goroutine would only take turns with the write and gather the tensors
// a second time (a PS's table rows, read in key order: half a CTR
// checkpoint's CPU), so the bytes are hashed as they are written.
func (s *Store) writeHashed(f File, header []byte, tensors []Tensor) ([]byte, int64, error) {
	native := hostLittleEndian()
	if !s.parallelHash {
		h := sha256.New()
		n, err := writeWithHeader(io.MultiWriter(f, h), header, tensors, native)
		if err == nil {
			err = f.Sync()
		}
		return h.Sum(nil), n, err
	}
	sumc := make(chan []byte, 1)
	go func() { sumc <- hashSafetensors(header, tensors, native) }()
	n, err := writeWithHeader(f, header, tensors, native)
	if err == nil {
		err = f.Sync()
	}
	return <-sumc, n, err // always wait: tensors must not be read after we return
}

// WriteShard writes shard `shard` of numShards of the checkpoint for step
// and makes it durable: it creates DIR/ckpt-<step>.tmp/ if needed (fsyncing
// DIR), writes the safetensors file under a unique temporary name while
// computing its SHA-256 (writeHashed), fsyncs
// it, renames it to ShardFileName(shard, numShards) and fsyncs the
// directory. The returned ShardInfo is what the chief puts in the manifest.
// Several processes may write different shards of the same step
// concurrently. tensors must not be modified until WriteShard returns.
func (s *Store) WriteShard(step int64, shard, numShards int, tensors []Tensor, meta map[string]string) (ShardInfo, error) {
	if step < 0 {
		return ShardInfo{}, fmt.Errorf("checkpoint: negative step %d", step)
	}
	if numShards < 1 || shard < 0 || shard >= numShards {
		return ShardInfo{}, fmt.Errorf("checkpoint: shard %d of %d out of range", shard, numShards)
	}
	header, err := buildHeader(tensors, meta)
	if err != nil {
		return ShardInfo{}, err
	}
	var info ShardInfo
	err = s.retryOnFullDisk(step, func() (err error) {
		info, err = s.writeShard(step, shard, numShards, header, tensors)
		return err
	})
	if err != nil {
		return ShardInfo{}, fmt.Errorf("checkpoint: writing shard %d of %d of step %d: %w", shard, numShards, step, err)
	}
	return info, nil
}

func (s *Store) writeShard(step int64, shard, numShards int, header []byte, tensors []Tensor) (ShardInfo, error) {
	if err := s.ensureDir(s.dir); err != nil {
		return ShardInfo{}, err
	}
	if _, err := s.fs.Stat(s.Path(step)); err == nil {
		return ShardInfo{}, fmt.Errorf("step %d already committed: %w", step, fs.ErrExist)
	}
	tmpDir := s.tmpPath(step)
	if err := s.fs.MkdirAll(tmpDir, s.dirMode); err != nil {
		return ShardInfo{}, err
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return ShardInfo{}, err
	}
	name := ShardFileName(shard, numShards)
	tmp := filepath.Join(tmpDir, tempName(name))
	f, err := s.fs.Create(tmp, s.fileMode)
	if err != nil {
		return ShardInfo{}, err
	}
	sum, n, err := s.writeHashed(f, header, tensors)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.fs.Rename(tmp, filepath.Join(tmpDir, name))
	}
	if err != nil {
		_ = s.fs.Remove(tmp) // best effort
		return ShardInfo{}, err
	}
	if err := s.fs.SyncDir(tmpDir); err != nil {
		return ShardInfo{}, err
	}
	names := make([]string, len(tensors))
	for i, t := range tensors {
		names[i] = t.Name
	}
	return ShardInfo{
		Index:   shard,
		File:    name,
		SHA256:  hex.EncodeToString(sum),
		Bytes:   n,
		Tensors: names,
	}, nil
}

// writeFileAtomic writes data to dir/name through a temporary file:
// create, write, fsync, close, rename, fsync dir.
func (s *Store) writeFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, tempName(name))
	f, err := s.fs.Create(tmp, s.fileMode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.fs.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		_ = s.fs.Remove(tmp) // best effort
		return err
	}
	return s.fs.SyncDir(dir)
}

// Commit makes the checkpoint described by m complete. The chief calls it
// once every shard listed in m.Shards has been written with WriteShard.
// Commit verifies that each shard file exists with the listed size and
// SHA-256, removes any other file from the checkpoint's temporary
// directory, writes MANIFEST.json (temporary file, fsync, rename, fsync),
// renames DIR/ckpt-<step>.tmp to DIR/ckpt-<step> and fsyncs DIR. Once that
// rename is durable the checkpoint is committed; only then are the
// complete checkpoints beyond the keep newest deleted, along with
// temporary directories of earlier steps. An error wrapping ErrRetention
// means the commit succeeded but that cleanup did not.
//
// Zero fields are filled in: FormatVersion, NumShards (len(m.Shards)) and
// Created (now). Shards may be given in any order.
func (s *Store) Commit(m Manifest) error { return s.CommitKeeping(m, -1) }

// CommitKeeping is Commit whose retention, with keep >= 2, gives the
// last of the keep slots to the newest valid checkpoint at or before
// step good (-1: none) unless a newer kept one is: the one a rollback to
// a model known good would restore, which must not be deleted while newer
// checkpoints, possibly of a diverged model, fill the slots.
func (s *Store) CommitKeeping(m Manifest, good int64) error {
	_, err := s.commitKeeping(m, good, nil)
	return err
}

// ShardRead is a shard file's tensors and safetensors metadata, as
// Checkpoint.ReadShardSome returns them.
type ShardRead struct {
	Tensors []Tensor
	Meta    map[string]string
}

// CommitReading is CommitKeeping whose check of the shard files reads
// them (Checkpoint.ReadShardSome with keep): it returns each shard's
// tensors, in the manifest's order, that keep accepts. A caller that
// reads the checkpoint right after committing it (the chief's PS count
// change, which reshards the dense state during its pause) reads and
// hashes every byte once instead of twice. The check is Commit's and
// more: a file that does not parse as safetensors, or whose tensors are
// not the manifest's, is refused too. keep may be called on several
// goroutines at once. With ErrRetention (committed, old checkpoints not
// all deleted) the tensors are returned too.
func (s *Store) CommitReading(m Manifest, good int64, keep func(name string) bool) ([]ShardRead, error) {
	if keep == nil {
		keep = func(string) bool { return true }
	}
	return s.commitKeeping(m, good, keep)
}

// commitKeeping is CommitKeeping, reading the shards' tensors keep
// accepts as it checks them (nil: hashing only).
func (s *Store) commitKeeping(m Manifest, good int64, keep func(name string) bool) ([]ShardRead, error) {
	if m.FormatVersion == 0 {
		m.FormatVersion = FormatVersion
	}
	if m.NumShards == 0 {
		m.NumShards = len(m.Shards)
	}
	if m.Created.IsZero() {
		m.Created = time.Now().UTC().Truncate(time.Second)
	}
	m.Shards = slices.Clone(m.Shards)
	sort.SliceStable(m.Shards, func(a, b int) bool { return m.Shards[a].Index < m.Shards[b].Index })
	data, err := EncodeManifest(m)
	if err != nil {
		return nil, err
	}
	var read []ShardRead
	if err := s.retryOnFullDisk(m.Step, func() (err error) {
		read, err = s.commit(m, data, keep)
		return err
	}); err != nil {
		return nil, fmt.Errorf("checkpoint: committing step %d: %w", m.Step, err)
	}
	if err := s.prune(m.Step, good); err != nil {
		return read, fmt.Errorf("%w: step %d: %w", ErrRetention, m.Step, err)
	}
	return read, nil
}

// MarkFinal marks the committed checkpoint of step as the final one when
// it already holds the state training ended with: versions[i] is shard
// i's version at the end, and every shard of the checkpoint must have
// been snapshotted at it. It rewrites only MANIFEST.json, atomically, so
// a crash leaves the old manifest or the new one, both valid. It reports
// whether the checkpoint held that state; if not, nothing changed and
// the caller writes a new final checkpoint.
func (s *Store) MarkFinal(step int64, versions []int64) (bool, error) {
	dir := s.Path(step)
	m, err := check(s.fs, dir, false)
	if err != nil {
		return false, fmt.Errorf("checkpoint: marking step %d final: %w", step, err)
	}
	if len(m.Shards) != len(versions) {
		return false, nil
	}
	for i, sh := range m.Shards {
		if sh.Version != versions[i] {
			return false, nil
		}
	}
	if m.Final {
		return true, nil
	}
	m.Final = true
	data, err := EncodeManifest(*m)
	if err != nil {
		return false, err
	}
	if err := s.retryOnFullDisk(step, func() error { return s.writeFileAtomic(dir, ManifestName, data) }); err != nil {
		return false, fmt.Errorf("checkpoint: marking step %d final: %w", step, err)
	}
	return true, nil
}

func (s *Store) commit(m Manifest, manifest []byte, keep func(name string) bool) ([]ShardRead, error) {
	final, tmpDir := s.Path(m.Step), s.tmpPath(m.Step)
	if _, err := s.fs.Stat(final); err == nil {
		return nil, fmt.Errorf("%s: %w", final, fs.ErrExist)
	}
	read, err := s.checkShards(tmpDir, m.Shards, keep)
	if err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	for _, sh := range m.Shards {
		listed[sh.File] = true
	}
	entries, err := s.fs.ReadDir(tmpDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !listed[e.Name()] && e.Name() != ManifestName {
			if err := s.fs.RemoveAll(filepath.Join(tmpDir, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	if err := s.writeFileAtomic(tmpDir, ManifestName, manifest); err != nil {
		return nil, err
	}
	if err := s.fs.Rename(tmpDir, final); err != nil {
		return nil, err
	}
	return read, s.fs.SyncDir(s.dir)
}

// checkShards checks every shard file of a commit in full (checkShard),
// as many at once as there are processors when the store hashes in
// parallel: during a PS count change's pause the commit is on the
// critical path, and the processes that wrote the files are idle. With
// keep, each file is read as it is checked (Checkpoint.readShard, which
// also checks its tensors' names) and the tensors keep accepts are
// returned. The error is the first shard's, in the manifest's order.
func (s *Store) checkShards(dir string, shards []ShardInfo, keep func(name string) bool) ([]ShardRead, error) {
	errs := make([]error, len(shards))
	var read []ShardRead
	check := func(i int) { errs[i] = checkShard(s.fs, dir, shards[i], true) }
	if keep != nil {
		read = make([]ShardRead, len(shards))
		ck := &Checkpoint{Path: dir, fs: s.fs}
		check = func(i int) {
			r := &read[i]
			if r.Tensors, r.Meta, errs[i] = ck.readShard(shards[i], keep); errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", dir, errs[i])
			}
		}
	}
	workers := 1
	if s.parallelHash {
		workers = runtime.GOMAXPROCS(0)
	}
	parallel.For(len(shards), workers, check)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return read, nil
}

// checkShard checks that dir/sh.File has sh.Bytes bytes and, if full, the
// SHA-256 sh.SHA256.
func checkShard(fsys FS, dir string, sh ShardInfo, full bool) error {
	name := filepath.Join(dir, sh.File)
	if !full {
		fi, err := fsys.Stat(name)
		if err != nil {
			return err
		}
		if fi.Size() != sh.Bytes {
			return fmt.Errorf("%w: %s has %d bytes, manifest says %d", ErrCorrupt, name, fi.Size(), sh.Bytes)
		}
		return nil
	}
	f, err := fsys.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != sh.Bytes {
		return fmt.Errorf("%w: %s has %d bytes, manifest says %d", ErrCorrupt, name, fi.Size(), sh.Bytes)
	}
	sum, err := hashReaderAt(f, fi.Size())
	if err != nil {
		return fmt.Errorf("hashing %s: %w", name, err)
	}
	if sum != sh.SHA256 {
		return fmt.Errorf("%w: %s has SHA-256 %s, manifest says %s", ErrCorrupt, name, sum, sh.SHA256)
	}
	return nil
}

// hashReaderAt returns the hex SHA-256 of the first size bytes of r.
func hashReaderAt(r io.ReaderAt, size int64) (string, error) {
	h := sha256.New()
	n, err := io.CopyBuffer(h, io.NewSectionReader(r, 0, size), make([]byte, 1<<20))
	if err != nil {
		return "", err
	}
	if n != size {
		return "", fmt.Errorf("%w: read %d of %d bytes", ErrCorrupt, n, size)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readManifest reads and decodes dir/MANIFEST.json.
func readManifest(fsys FS, dir string) (Manifest, error) {
	name := filepath.Join(dir, ManifestName)
	f, err := fsys.Open(name)
	if err != nil {
		return Manifest{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Manifest{}, err
	}
	if fi.Size() > maxManifestSize {
		return Manifest{}, fmt.Errorf("%w: %s is %d bytes", ErrCorrupt, name, fi.Size())
	}
	data := make([]byte, fi.Size())
	if err := readFullAt(f, data, 0); err != nil {
		return Manifest{}, fmt.Errorf("%s: %w", name, err)
	}
	m, err := DecodeManifest(data)
	if err != nil {
		return Manifest{}, fmt.Errorf("%s: %w", name, err)
	}
	return m, nil
}

// check validates the checkpoint in dir: its manifest (checksum, step
// matching the directory name) and the size (and, if full, the SHA-256)
// of each shard. It returns the manifest if it could be decoded.
func check(fsys FS, dir string, full bool) (*Manifest, error) {
	m, err := readManifest(fsys, dir)
	if err != nil {
		return nil, err
	}
	if step, kind, ok := parseDirName(filepath.Base(dir)); ok && kind == kindComplete && step != m.Step {
		return &m, fmt.Errorf("%w: %s holds the manifest of step %d", ErrCorrupt, dir, m.Step)
	}
	for _, sh := range m.Shards {
		if err := checkShard(fsys, dir, sh, full); err != nil {
			return &m, err
		}
	}
	return &m, nil
}

// Info describes a complete checkpoint directory found by List.
type Info struct {
	Step int64
	Path string
	// Manifest is the decoded manifest, nil if it is missing or damaged.
	Manifest *Manifest
	// Err is why the checkpoint is invalid, nil if it passed the checks
	// that were made.
	Err error
}

// List returns every complete checkpoint directory (ckpt-<step>, with no
// suffix) in the store, newest first. Each is checked cheaply: its
// manifest must exist and verify, and each shard file must exist with the
// size the manifest lists; Info.Err says what failed. Use Verify for a full
// check of the shards' contents. Temporary and half-deleted directories are
// not listed. A missing store directory lists as empty.
func (s *Store) List() ([]Info, error) {
	entries, err := s.fs.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: listing %s: %w", s.dir, err)
	}
	var out []Info
	for _, e := range entries {
		step, kind, ok := parseDirName(e.Name())
		if !ok || kind != kindComplete || !e.IsDir() {
			continue
		}
		info := Info{Step: step, Path: filepath.Join(s.dir, e.Name())}
		info.Manifest, info.Err = check(s.fs, info.Path, false)
		out = append(out, info)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Step > out[b].Step })
	return out, nil
}

// Verify fully checks the checkpoint at path: manifest checksum, and every
// shard's presence, size and SHA-256 (reading all of its data).
func (s *Store) Verify(path string) error {
	_, err := check(s.fs, path, true)
	return err
}

// Latest returns the newest checkpoint that verifies fully (as Verify),
// and the newer checkpoints it skipped because they did not, each with
// Err set (for logging). It returns an error wrapping ErrNoCheckpoint if
// no checkpoint verifies.
func (s *Store) Latest() (Info, []Info, error) {
	infos, err := s.List()
	if err != nil {
		return Info{}, nil, err
	}
	var skipped []Info
	for _, in := range infos {
		if in.Err == nil {
			in.Err = s.Verify(in.Path)
		}
		if in.Err == nil {
			return in, skipped, nil
		}
		skipped = append(skipped, in)
	}
	if len(skipped) > 0 {
		return Info{}, skipped, allDamaged(s.dir, skipped)
	}
	return Info{}, nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, s.dir)
}

// allDamaged is Latest's error when every checkpoint is damaged: it names
// each, newest first, with why.
func allDamaged(dir string, damaged []Info) error {
	why := make([]string, len(damaged))
	for i, d := range damaged {
		why[i] = fmt.Sprintf("%s (%v)", filepath.Base(d.Path), d.Err)
	}
	return fmt.Errorf("%w: %w: %d in %s: %s", ErrNoCheckpoint, ErrAllDamaged, len(damaged), dir, strings.Join(why, "; "))
}

// dirEntry is a checkpoint directory entry: ckpt-<step>, .tmp or .trash.
type dirEntry struct {
	step int64
	name string
	kind dirKind
}

// listing is the store's directory: its complete checkpoints newest
// first, its leftovers (temporary directories, interrupted deletions) and
// every name it holds.
type listing struct {
	complete []dirEntry
	leftover []dirEntry
	present  map[string]bool
}

// list reads the store's directory (the error is ReadDir's, unwrapped).
func (s *Store) list() (listing, error) {
	entries, err := s.fs.ReadDir(s.dir)
	if err != nil {
		return listing{}, err
	}
	l := listing{present: make(map[string]bool, len(entries))}
	for _, e := range entries {
		l.present[e.Name()] = true
		st, kind, ok := parseDirName(e.Name())
		switch {
		case !ok:
		case kind == kindComplete:
			l.complete = append(l.complete, dirEntry{st, e.Name(), kind})
		default:
			l.leftover = append(l.leftover, dirEntry{st, e.Name(), kind})
		}
	}
	sort.Slice(l.complete, func(a, b int) bool { return l.complete[a].step > l.complete[b].step })
	return l, nil
}

// leftovers are the names of the leftovers that match.
func (l listing) leftovers(match func(dirEntry) bool) []string {
	var out []string
	for _, e := range l.leftover {
		if match(e) {
			out = append(out, e.name)
		}
	}
	return out
}

// prune deletes, after step was committed, the complete checkpoints older
// than step that are not among the keep newest valid ones, temporary
// directories of steps before step, and leftovers of interrupted
// deletions. A checkpoint is deleted by renaming it to ckpt-<step>.trash
// first, so that an interrupted deletion never leaves a half-deleted
// checkpoint that looks complete. With good >= 0 and keep >= 2, one of
// the keep is the newest valid checkpoint at or before good.
func (s *Store) prune(step, good int64) error {
	l, err := s.list()
	if err != nil {
		return err
	}
	remove := l.leftovers(func(e dirEntry) bool { return e.kind == kindTrash || e.step < step })
	complete, present := l.complete, l.present
	if s.keep > 0 {
		// With keep >= 2 and a known good step, the last slot is the
		// newest valid checkpoint at or before good (if no newer kept one
		// is): the disk never holds more than keep.
		kept, goodKept := 0, good < 0 || s.keep < 2
		for _, c := range complete {
			wantGood := !goodKept && c.step <= good
			if kept < s.keep-1 || (kept < s.keep && (goodKept || wantGood)) {
				if _, err := check(s.fs, filepath.Join(s.dir, c.name), false); err == nil {
					kept++
					goodKept = goodKept || c.step <= good
					continue
				}
			}
			if c.step >= step {
				continue
			}
			trash, err := s.trash(c.name, present)
			if err != nil {
				return err
			}
			remove = append(remove, trash)
		}
	}
	return s.removeAll(remove)
}

// RemoveAfter deletes the complete checkpoints of steps after step (a
// run handing back an earlier model of its own: they are superseded),
// each renamed to .trash first as prune does. It returns how many.
func (s *Store) RemoveAfter(step int64) (int, error) {
	l, err := s.list()
	if err != nil {
		return 0, err
	}
	var remove []string
	for _, c := range l.complete {
		if c.step <= step {
			continue
		}
		trash, err := s.trash(c.name, l.present)
		if err != nil {
			return 0, err
		}
		remove = append(remove, trash)
	}
	return len(remove), s.removeAll(remove)
}

// trash renames the complete checkpoint name to name.trash (removing a
// leftover of that name first), so that a deletion interrupted midway
// never leaves a checkpoint that looks complete. present says which
// names the directory held. A checkpoint already gone (another process
// freeing space deleted it) is not an error.
func (s *Store) trash(name string, present map[string]bool) (string, error) {
	trash := name + trashSuffix
	if present[trash] {
		if err := s.fs.RemoveAll(filepath.Join(s.dir, trash)); err != nil {
			return "", err
		}
	}
	err := s.fs.Rename(filepath.Join(s.dir, name), filepath.Join(s.dir, trash))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return trash, nil
}

// removeAll deletes the named entries of the store's directory: it first
// makes the renames to .trash that led there durable, then deletes, then
// makes the deletions durable.
func (s *Store) removeAll(names []string) error {
	if len(names) == 0 {
		return nil
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return err
	}
	for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
		if err := s.fs.RemoveAll(filepath.Join(s.dir, name)); err != nil {
			return err
		}
	}
	return s.fs.SyncDir(s.dir)
}

// Checkpoint is a checkpoint opened by Load.
type Checkpoint struct {
	Path     string
	Manifest Manifest
	fs       FS
}

// Load opens the checkpoint at path (a directory from Info.Path or
// Store.Path), checking its manifest and the shards' sizes. Each shard's
// SHA-256 is verified when it is read by ReadShard.
func (s *Store) Load(path string) (*Checkpoint, error) {
	m, err := check(s.fs, path, false)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: loading %s: %w", path, err)
	}
	return &Checkpoint{Path: path, Manifest: *m, fs: s.fs}, nil
}

// hashingReaderAt hashes what is read through it as long as the reads are
// sequential from offset 0.
type hashingReaderAt struct {
	r   io.ReaderAt
	h   hash.Hash
	pos int64
	seq bool
}

func (hr *hashingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := hr.r.ReadAt(p, off)
	if hr.seq && off == hr.pos {
		hr.h.Write(p[:n])
		hr.pos += int64(n)
	} else {
		hr.seq = false
	}
	return n, err
}

// ReadShard reads shard i, verifying its size and SHA-256 against the
// manifest (in the same pass as the read) and its tensor names against the
// manifest's list. It returns the shard's tensors in file order and its
// safetensors metadata.
func (c *Checkpoint) ReadShard(i int) ([]Tensor, map[string]string, error) {
	return c.ReadShardSome(i, nil)
}

// ReadShardSome is ReadShard keeping the data of the tensors keep
// accepts only (nil: all): the others come with their names, shapes and
// types and no data. Every byte of the file is still read and hashed.
func (c *Checkpoint) ReadShardSome(i int, keep func(name string) bool) ([]Tensor, map[string]string, error) {
	if i < 0 || i >= len(c.Manifest.Shards) {
		return nil, nil, fmt.Errorf("checkpoint: shard %d of %d out of range", i, len(c.Manifest.Shards))
	}
	sh := c.Manifest.Shards[i]
	tensors, meta, err := c.readShard(sh, keep)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: reading shard %d of %s: %w", i, c.Path, err)
	}
	return tensors, meta, nil
}

func (c *Checkpoint) readShard(sh ShardInfo, keep func(name string) bool) ([]Tensor, map[string]string, error) {
	f, err := c.fs.Open(filepath.Join(c.Path, sh.File))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if fi.Size() != sh.Bytes {
		return nil, nil, fmt.Errorf("%w: %s has %d bytes, manifest says %d", ErrCorrupt, sh.File, fi.Size(), sh.Bytes)
	}
	hr := &hashingReaderAt{r: f, h: sha256.New(), seq: true}
	tensors, meta, rerr := readSafetensors(hr, sh.Bytes, hostLittleEndian(), keep)
	// Check the hash even if parsing failed: a mismatch is the better
	// diagnosis.
	var sum string
	if hr.seq && hr.pos == sh.Bytes {
		sum = hex.EncodeToString(hr.h.Sum(nil))
	} else if rerr == nil {
		if sum, err = hashReaderAt(f, sh.Bytes); err != nil {
			return nil, nil, err
		}
	}
	if sum != "" && sum != sh.SHA256 {
		return nil, nil, fmt.Errorf("%w: %s has SHA-256 %s, manifest says %s", ErrCorrupt, sh.File, sum, sh.SHA256)
	}
	if rerr != nil {
		return nil, nil, rerr
	}
	if sh.Tensors != nil {
		if len(sh.Tensors) != len(tensors) {
			return nil, nil, fmt.Errorf("%w: %s holds %d tensors, manifest lists %d", ErrCorrupt, sh.File, len(tensors), len(sh.Tensors))
		}
		for j, t := range tensors {
			if t.Name != sh.Tensors[j] {
				return nil, nil, fmt.Errorf("%w: %s tensor %d is %q, manifest lists %q", ErrCorrupt, sh.File, j, t.Name, sh.Tensors[j])
			}
		}
	}
	return tensors, meta, nil
}
