package checkpoint

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// runWrite performs the full write sequence of one checkpoint: both shards
// (in a fixed order, so that operation numbers are deterministic) and the
// commit.
func runWrite(s *Store, step int64) error {
	infos, err := writeShardsSeq(s, step, 2)
	if err != nil {
		return err
	}
	return s.Commit(testManifest(step, infos))
}

// TestCrashConsistency crashes the machine at every operation of a
// checkpoint write made on top of an existing valid checkpoint, drops
// everything that was not durable, and checks that the store then holds
// either the old or the new checkpoint, valid, with no visible half-state;
// and that writing can resume.
func TestCrashConsistency(t *testing.T) {
	const oldStep, newStep, nextStep = 100, 200, 300
	for _, keep := range []int{1, 2} {
		t.Run(fmt.Sprintf("keep=%d", keep), func(t *testing.T) {
			setup := func() *MemFS {
				m := NewMemFS()
				if err := runWrite(NewStore(m, testDir, keep), oldStep); err != nil {
					t.Fatal(err)
				}
				return m
			}

			// Dry run: count the operations and find the commit point,
			// the fsync of DIR that makes the final rename durable.
			dry := NewFaultFS(setup(), -1, true)
			if err := runWrite(NewStore(dry, testDir, keep), newStep); err != nil {
				t.Fatal(err)
			}
			ops := dry.Ops()
			commitPoint := -1
			renameOp := "rename " + NewStore(nil, testDir, keep).tmpPath(newStep) + " -> " + NewStore(nil, testDir, keep).Path(newStep)
			for i, op := range ops {
				if op == renameOp && i+1 < len(ops) && ops[i+1] == "syncdir "+testDir {
					commitPoint = i + 1
				}
			}
			if commitPoint < 0 {
				t.Fatalf("no commit point in\n%s", strings.Join(ops, "\n"))
			}
			t.Logf("%d operations, commit durable after op %d", len(ops), commitPoint)

			for k := 0; k <= len(ops); k++ {
				m := setup()
				f := NewFaultFS(m, k, true)
				werr := runWrite(NewStore(f, testDir, keep), newStep)
				m.Crash()
				what := "completed"
				if k < len(ops) {
					what = fmt.Sprintf("crash at op %d (%s)", k, ops[k])
				}

				s := NewStore(m, testDir, keep)
				latest, skipped, err := s.Latest()
				if err != nil {
					t.Fatalf("%s: Latest: %v (skipped %+v)", what, err, skipped)
				}
				if len(skipped) != 0 {
					t.Fatalf("%s: invalid checkpoints visible: %+v", what, skipped)
				}
				want := int64(oldStep)
				if k > commitPoint {
					want = newStep
				}
				if latest.Step != want {
					t.Fatalf("%s: Latest = %d, want %d (write err %v)", what, latest.Step, want, werr)
				}
				if werr == nil && latest.Step != newStep {
					t.Fatalf("%s: write succeeded but Latest = %d", what, latest.Step)
				}
				if err := s.Verify(latest.Path); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				checkLoads(t, s, latest.Path, latest.Step)
				// Every complete checkpoint listed is valid.
				infos, err := s.List()
				if err != nil {
					t.Fatal(err)
				}
				for _, in := range infos {
					if in.Err != nil {
						t.Fatalf("%s: listed checkpoint %d invalid: %v", what, in.Step, in.Err)
					}
				}
				if keep == 2 || latest.Step == oldStep {
					if len(infos) == 0 || infos[len(infos)-1].Step != oldStep {
						t.Fatalf("%s: old checkpoint gone: %+v", what, infos)
					}
				}

				// Recovery: redo the interrupted write if it was lost,
				// then write one more; leftovers must be cleaned up.
				if latest.Step == oldStep {
					if err := runWrite(s, newStep); err != nil {
						t.Fatalf("%s: rewriting: %v", what, err)
					}
				}
				if err := runWrite(s, nextStep); err != nil {
					t.Fatalf("%s: next write: %v", what, err)
				}
				got := strings.Join(listSteps(t, m, testDir), " ")
				wantDirs := DirName(nextStep)
				if keep == 2 {
					wantDirs = DirName(newStep) + " " + wantDirs
				}
				if got != wantDirs {
					t.Fatalf("%s: after recovery directory holds %q, want %q", what, got, wantDirs)
				}
				if l, _, err := s.Latest(); err != nil || l.Step != nextStep {
					t.Fatalf("%s: after recovery Latest = %+v, %v", what, l, err)
				}
			}
		})
	}
}

// A crash during the concurrent shard writes of several processes: the
// faults hit whichever process reaches the k-th operation first. The
// checks are those of TestCrashConsistency, for the crash points that
// exist in every interleaving.
func TestCrashDuringConcurrentShardWrites(t *testing.T) {
	for k := 0; k < 40; k++ {
		m := NewMemFS()
		if err := runWrite(NewStore(m, testDir, 2), 100); err != nil {
			t.Fatal(err)
		}
		f := NewFaultFS(m, k, true)
		s := NewStore(f, testDir, 2)
		infos, err := writeShards(s, 200, 4)
		if err == nil {
			err = s.Commit(testManifest(200, infos))
		}
		if !errors.Is(err, ErrInjected) {
			t.Fatalf("crash at op %d: err = %v, want ErrInjected", k, err)
		}
		m.Crash()
		latest, _, err := NewStore(m, testDir, 2).Latest()
		if err != nil || latest.Step != 100 {
			t.Fatalf("crash at op %d: Latest = %+v, %v", k, latest, err)
		}
	}
}
