package checkpoint

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MemFS is an in-memory FS that simulates what survives a machine crash.
// It keeps two views of the tree: the volatile one that operations see, and
// the durable one that Crash reverts to:
//
//   - file data becomes durable only at File.Sync (Create of an existing
//     file truncates its durable data at once, the pessimistic outcome);
//   - a directory's entries (files or directories created, renamed or
//     removed in it) become durable only at SyncDir of that directory;
//   - after Crash, the tree is exactly what is reachable from the root
//     through durable entries, each file holding its durable data, and
//     files opened before the crash can no longer be used.
//
// A MemFS is safe for concurrent use. Paths are slash- or
// separator-delimited; relative paths are taken from the root.
//
// SetCapacity makes it a small disk: a write that would take the files'
// data past the capacity writes what fits and fails with ENOSPC, as
// write(2) does on a full file system, and removing files frees space.
type MemFS struct {
	mu       sync.Mutex
	root     *memNode
	gen      uint64 // incremented by Crash; stale handles fail
	capacity int64  // bytes of file data the tree may hold (0: unlimited)
}

type memNode struct {
	dir  bool
	perm fs.FileMode // as created
	// directories
	children    map[string]*memNode
	durChildren map[string]*memNode
	// files
	data    []byte
	durData []byte
}

func newMemDir() *memNode {
	return &memNode{dir: true, children: map[string]*memNode{}, durChildren: map[string]*memNode{}}
}

// NewMemFS returns an empty MemFS whose root directory exists durably.
func NewMemFS() *MemFS { return &MemFS{root: newMemDir()} }

// SetCapacity limits the file data the tree holds to bytes (0: no
// limit). Directories take no space.
func (m *MemFS) SetCapacity(bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.capacity = bytes
}

// Used returns the bytes of file data in the tree (what SetCapacity
// limits).
func (m *MemFS) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used()
}

// used sums the data of every file reachable from the root. Caller holds
// mu.
func (m *MemFS) used() int64 {
	var sum func(n *memNode) int64
	sum = func(n *memNode) int64 {
		if !n.dir {
			return int64(len(n.data))
		}
		total := int64(0)
		for _, c := range n.children {
			total += sum(c)
		}
		return total
	}
	return sum(m.root)
}

var _ FS = (*MemFS)(nil)

var (
	errNotDir   = errors.New("not a directory")
	errIsDir    = errors.New("is a directory")
	errNotEmpty = errors.New("directory not empty")
	errClosed   = errors.New("file closed or lost in a crash")
	errReadOnly = errors.New("file opened read-only")
)

func memClean(name string) string {
	return path.Clean("/" + filepath.ToSlash(name))
}

func memSplit(p string) []string {
	if p == "/" {
		return nil
	}
	return strings.Split(p[1:], "/")
}

// lookup returns the node at cleaned path p. Caller holds mu.
func (m *MemFS) lookup(op, name string) (*memNode, error) {
	n := m.root
	for _, c := range memSplit(memClean(name)) {
		if !n.dir {
			return nil, &fs.PathError{Op: op, Path: name, Err: errNotDir}
		}
		next, ok := n.children[c]
		if !ok {
			return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
		}
		n = next
	}
	return n, nil
}

// lookupParent returns the directory that holds name and name's base.
// Caller holds mu.
func (m *MemFS) lookupParent(op, name string) (*memNode, string, error) {
	p := memClean(name)
	if p == "/" {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	dir, base := path.Split(p)
	parent, err := m.lookup(op, dir)
	if err != nil {
		return nil, "", err
	}
	if !parent.dir {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: errNotDir}
	}
	return parent, base, nil
}

// Create implements FS.
func (m *MemFS) Create(name string, perm fs.FileMode) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, err := m.lookupParent("create", name)
	if err != nil {
		return nil, err
	}
	n, ok := parent.children[base]
	switch {
	case ok && n.dir:
		return nil, &fs.PathError{Op: "create", Path: name, Err: errIsDir}
	case ok:
		n.data, n.durData = nil, nil
	default:
		n = &memNode{perm: perm.Perm()}
		parent.children[base] = n
	}
	return &memFile{fs: m, node: n, name: name, gen: m.gen, writable: true}, nil
}

// Open implements FS.
func (m *MemFS) Open(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("open", name)
	if err != nil {
		return nil, err
	}
	return &memFile{fs: m, node: n, name: name, gen: m.gen}, nil
}

// Rename implements FS. Like rename(2), it replaces a file or an empty
// directory at newname.
func (m *MemFS) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	op, op2 := memClean(oldname), memClean(newname)
	if op == op2 {
		return nil
	}
	if strings.HasPrefix(op2, op+"/") {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrInvalid}
	}
	oldParent, oldBase, err := m.lookupParent("rename", oldname)
	if err != nil {
		return err
	}
	n, ok := oldParent.children[oldBase]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	newParent, newBase, err := m.lookupParent("rename", newname)
	if err != nil {
		return err
	}
	if dst, ok := newParent.children[newBase]; ok {
		switch {
		case dst.dir && !n.dir:
			return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errIsDir}
		case !dst.dir && n.dir:
			return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errNotDir}
		case dst.dir && len(dst.children) > 0:
			return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errNotEmpty}
		}
	}
	delete(oldParent.children, oldBase)
	newParent.children[newBase] = n
	return nil
}

// Remove implements FS.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, err := m.lookupParent("remove", name)
	if err != nil {
		return err
	}
	n, ok := parent.children[base]
	if !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	if n.dir && len(n.children) > 0 {
		return &fs.PathError{Op: "remove", Path: name, Err: errNotEmpty}
	}
	delete(parent.children, base)
	return nil
}

// RemoveAll implements FS.
func (m *MemFS) RemoveAll(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, err := m.lookupParent("removeall", name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	delete(parent.children, base)
	return nil
}

// MkdirAll implements FS.
func (m *MemFS) MkdirAll(dir string, perm fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.root
	for _, c := range memSplit(memClean(dir)) {
		next, ok := n.children[c]
		if !ok {
			next = newMemDir()
			next.perm = perm.Perm()
			n.children[c] = next
		} else if !next.dir {
			return &fs.PathError{Op: "mkdir", Path: dir, Err: errNotDir}
		}
		n = next
	}
	return nil
}

// ReadDir implements FS.
func (m *MemFS) ReadDir(dir string) ([]fs.DirEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("readdir", dir)
	if err != nil {
		return nil, err
	}
	if !n.dir {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: errNotDir}
	}
	names := slices.Sorted(maps.Keys(n.children))
	out := make([]fs.DirEntry, len(names))
	for i, name := range names {
		out[i] = fs.FileInfoToDirEntry(n.children[name].info(name))
	}
	return out, nil
}

// Stat implements FS.
func (m *MemFS) Stat(name string) (fs.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("stat", name)
	if err != nil {
		return nil, err
	}
	return n.info(path.Base(memClean(name))), nil
}

// SyncDir implements FS.
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("syncdir", dir)
	if err != nil {
		return err
	}
	if !n.dir {
		return &fs.PathError{Op: "syncdir", Path: dir, Err: errNotDir}
	}
	n.durChildren = maps.Clone(n.children)
	return nil
}

// Crash simulates a machine crash and restart: everything not durable is
// lost, and files open before the crash become unusable.
func (m *MemFS) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	var restore func(n *memNode)
	restore = func(n *memNode) {
		if !n.dir {
			n.data = bytes.Clone(n.durData)
			return
		}
		n.children = maps.Clone(n.durChildren)
		for _, c := range n.children {
			restore(c)
		}
	}
	restore(m.root)
}

func (n *memNode) info(name string) fs.FileInfo {
	fi := memInfo{name: name, dir: n.dir, perm: n.perm}
	if !n.dir {
		fi.size = int64(len(n.data))
	}
	return fi
}

type memInfo struct {
	name string
	size int64
	dir  bool
	perm fs.FileMode
}

func (fi memInfo) Name() string       { return fi.name }
func (fi memInfo) Size() int64        { return fi.size }
func (fi memInfo) ModTime() time.Time { return time.Time{} }
func (fi memInfo) IsDir() bool        { return fi.dir }
func (fi memInfo) Sys() any           { return nil }
func (fi memInfo) Mode() fs.FileMode {
	if fi.dir {
		return fs.ModeDir | fi.perm
	}
	return fi.perm
}

type memFile struct {
	fs       *MemFS
	node     *memNode
	name     string
	gen      uint64
	writable bool
	closed   bool
}

// check validates the handle. Caller holds fs.mu.
func (f *memFile) check(op string) error {
	if f.closed || f.gen != f.fs.gen {
		return &fs.PathError{Op: op, Path: f.name, Err: errClosed}
	}
	return nil
}

func (f *memFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write"); err != nil {
		return 0, err
	}
	if !f.writable {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: errReadOnly}
	}
	if c := f.fs.capacity; c > 0 {
		if free := max(0, c-f.fs.used()); int64(len(p)) > free {
			f.node.data = append(f.node.data, p[:free]...)
			return int(free), &fs.PathError{Op: "write", Path: f.name, Err: syscall.ENOSPC}
		}
	}
	f.node.data = append(f.node.data, p...)
	return len(p), nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	if f.node.dir {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: errIsDir}
	}
	if off >= int64(len(f.node.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.node.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("sync"); err != nil {
		return err
	}
	if !f.node.dir {
		f.node.durData = bytes.Clone(f.node.data)
	}
	return nil
}

func (f *memFile) Stat() (fs.FileInfo, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("stat"); err != nil {
		return nil, err
	}
	return f.node.info(path.Base(memClean(f.name))), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("close"); err != nil {
		return err
	}
	f.closed = true
	return nil
}
