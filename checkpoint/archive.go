package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const (
	archivePrefix = "archive-"
	// archiveLayout is the time in an archive's name, in UTC: names sort
	// in time order.
	archiveLayout = "20060102T150405.000"
)

// ArchiveName returns the name of the archive made at t:
// "archive-20060102T150405.000" (UTC, to the millisecond).
func ArchiveName(t time.Time) string { return archivePrefix + t.UTC().Format(archiveLayout) }

// isArchive reports whether name is one ArchiveName makes.
func isArchive(name string) bool {
	stamp, ok := strings.CutPrefix(name, archivePrefix)
	if !ok {
		return false
	}
	_, err := time.Parse(archiveLayout, stamp)
	return err == nil
}

// Archive moves every complete checkpoint of the store (damaged ones
// too) into DIR/ArchiveName(t)/, so that a new run never mixes its
// checkpoints with an earlier run's. It returns the archive's path and
// how many checkpoints went there; with none, no archive is made.
func (s *Store) Archive(t time.Time) (string, int, error) {
	infos, err := s.List()
	if err != nil || len(infos) == 0 {
		return "", 0, err
	}
	dir := filepath.Join(s.dir, ArchiveName(t))
	if err := s.fs.MkdirAll(dir, s.dirMode); err != nil {
		return "", 0, fmt.Errorf("checkpoint: archiving: %w", err)
	}
	for _, in := range infos {
		if err := s.fs.Rename(in.Path, filepath.Join(dir, filepath.Base(in.Path))); err != nil {
			return "", 0, fmt.Errorf("checkpoint: archiving: %w", err)
		}
	}
	for _, d := range []string{dir, s.dir} {
		if err := s.fs.SyncDir(d); err != nil {
			return "", 0, fmt.Errorf("checkpoint: archiving: %w", err)
		}
	}
	return dir, len(infos), nil
}

// Archives lists the archives Archive made in the store's directory,
// oldest first.
func (s *Store) Archives() ([]string, error) {
	entries, err := s.fs.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: listing %s: %w", s.dir, err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && isArchive(e.Name()) {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out) // the names sort in time order
	return out, nil
}

// PruneArchives deletes the oldest archives beyond the keep newest (keep
// 0 deletes them all; keep < 0 none). Only directories named as Archive
// names them are touched. It returns the names deleted.
func (s *Store) PruneArchives(keep int) ([]string, error) {
	if keep < 0 {
		return nil, nil
	}
	names, err := s.Archives()
	if err != nil || len(names) <= keep {
		return nil, err
	}
	old := names[:len(names)-keep]
	if err := s.removeAll(old); err != nil {
		return nil, fmt.Errorf("checkpoint: deleting old archives: %w", err)
	}
	return old, nil
}
