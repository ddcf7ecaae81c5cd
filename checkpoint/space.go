package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// IsDiskFull reports whether err is a full disk or an exhausted quota
// (ENOSPC, EDQUOT).
func IsDiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// retryOnFullDisk runs op, a write for the checkpoint of step. If it
// fails because the disk is full, it frees space (freeSpace) and runs op
// once more, whether or not this process deleted anything: another shard
// writer may have freed the space meanwhile. A second failure says what
// was deleted.
func (s *Store) retryOnFullDisk(step int64, op func() error) error {
	err := op()
	if !IsDiskFull(err) {
		return err
	}
	deleted, ferr := s.freeSpace(step)
	if ferr != nil {
		return fmt.Errorf("%w (and freeing space failed: %v)", err, ferr)
	}
	if len(deleted) > 0 && s.log != nil {
		s.log.Warn("checkpoint disk full: deleted older checkpoints and leftovers to make room, retrying",
			"step", step, "deleted", strings.Join(deleted, ","))
	}
	if err := op(); err != nil {
		what := "nothing older than the newest valid checkpoint was left to delete"
		if len(deleted) > 0 {
			what = "after deleting " + strings.Join(deleted, ", ")
		}
		return fmt.Errorf("%w (retried once, %s)", err, what)
	}
	return nil
}

// freeSpace deletes what a full disk can spare while the checkpoint of
// step is written: temporary directories of other steps (the chief has
// one checkpoint in flight at a time, so they are leftovers of failed or
// crashed attempts), interrupted deletions, and every complete checkpoint
// older than the newest one that verifies fully. It never deletes that
// newest valid checkpoint, anything newer (a damaged checkpoint newer
// than it stays for inspection), nor step's own temporary directory
// (other shards may be writing into it). With no valid checkpoint, no
// complete checkpoint is deleted. Several processes may free space at
// once: one that finds a checkpoint gone goes on. It returns the names
// deleted.
func (s *Store) freeSpace(step int64) ([]string, error) {
	l, err := s.list()
	if err != nil {
		return nil, err
	}
	junk := l.leftovers(func(e dirEntry) bool { return e.kind == kindTrash || e.step != step })
	complete, present := l.complete, l.present
	valid := -1
	for i, c := range complete {
		if s.Verify(filepath.Join(s.dir, c.name)) == nil {
			valid = i
			break
		}
	}
	deleted := slices.Clone(junk)
	remove := junk
	if valid >= 0 {
		for _, c := range complete[valid+1:] {
			trash, err := s.trash(c.name, present)
			if err != nil {
				return deleted, err
			}
			remove = append(remove, trash)
			deleted = append(deleted, c.name)
		}
	}
	if err := s.removeAll(remove); err != nil {
		return deleted, err
	}
	sort.Strings(deleted)
	return deleted, nil
}

// RemoveTemporaries deletes the temporary directories (ckpt-<step>.tmp)
// and interrupted deletions (ckpt-<step>.trash) in the store's directory:
// what failed or crashed checkpoint attempts left behind. Call it only
// while no checkpoint is being written (the chief does, before and after
// each attempt). A missing directory holds nothing. It returns the names
// removed.
func (s *Store) RemoveTemporaries() ([]string, error) {
	l, err := s.list()
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: listing %s: %w", s.dir, err)
	}
	junk := l.leftovers(func(dirEntry) bool { return true })
	if err := s.removeAll(junk); err != nil {
		return nil, fmt.Errorf("checkpoint: removing leftovers in %s: %w", s.dir, err)
	}
	return junk, nil
}
