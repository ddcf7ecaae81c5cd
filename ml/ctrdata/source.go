package ctrdata

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// CriteoPrefix introduces a Criteo data set: criteo:PATH (the last
// CriteoTestFraction of its lines are the test set) or
// criteo:TRAIN,TEST.
const CriteoPrefix = "criteo:"

// Set is a data set's training and test splits; Meta is the synthetic
// set's description (nil for Criteo files).
type Set struct {
	Train, Test Source
	Meta        *Meta
	closers     []*File
}

// Close closes the set's files.
func (s *Set) Close() error {
	var errs []error
	for _, f := range s.closers {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// IsName says whether name is a CTR data set's name (--dataset).
func IsName(name string) bool {
	return name == SynthName || strings.HasPrefix(name, CriteoPrefix)
}

// Open opens the CTR data set called name: "synth-ctr" (dir/synth-ctr,
// written by `pstrain data synth-ctr`), "criteo:PATH" or
// "criteo:TRAIN,TEST" (relative paths taken in dir).
func Open(dir, name string) (*Set, error) {
	switch {
	case name == SynthName:
		return OpenSynth(filepath.Join(dir, SynthName))
	case strings.HasPrefix(name, CriteoPrefix):
		return openCriteo(dir, strings.TrimPrefix(name, CriteoPrefix))
	}
	return nil, fmt.Errorf("ctrdata: unknown data set %q: want %s or %sPATH", name, SynthName, CriteoPrefix)
}

// OpenSynth opens the synthetic set written into dir.
func OpenSynth(dir string) (*Set, error) {
	m, err := ReadMeta(dir)
	if err != nil {
		return nil, err
	}
	train, err := OpenFile(filepath.Join(dir, TrainFile))
	if err != nil {
		return nil, err
	}
	test, err := OpenFile(filepath.Join(dir, TestFile))
	if err != nil {
		train.Close()
		return nil, err
	}
	if train.Len() != m.Config.Train || test.Len() != m.Config.Test {
		train.Close()
		test.Close()
		return nil, fmt.Errorf("ctrdata: %s: %d and %d samples, its %s says %d and %d: %w", dir, train.Len(), test.Len(), MetaFile, m.Config.Train, m.Config.Test, ErrFormat)
	}
	return &Set{Train: train, Test: test, Meta: m, closers: []*File{train, test}}, nil
}

func openCriteo(dir, spec string) (*Set, error) {
	paths := strings.Split(spec, ",")
	if len(paths) > 2 || anyEmpty(paths) {
		return nil, fmt.Errorf("ctrdata: %s%s: want %sPATH or %sTRAIN,TEST", CriteoPrefix, spec, CriteoPrefix, CriteoPrefix)
	}
	files := make([]*CriteoFile, len(paths))
	for i, p := range paths {
		if dir != "" && !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		f, err := OpenCriteo(p)
		if err != nil {
			return nil, err
		}
		files[i] = f
	}
	if len(files) == 2 {
		return &Set{Train: files[0], Test: files[1]}, nil
	}
	if files[0].Len() < 2 {
		return nil, fmt.Errorf("ctrdata: %s: %d lines: too few to hold some out as the test set", paths[0], files[0].Len())
	}
	train, test := files[0].Split(CriteoTestFraction)
	return &Set{Train: train, Test: test}, nil
}

func anyEmpty(paths []string) bool {
	for _, p := range paths {
		if strings.TrimSpace(p) == "" {
			return true
		}
	}
	return false
}
