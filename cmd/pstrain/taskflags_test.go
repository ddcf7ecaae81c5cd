package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
)

func TestResolveTask(t *testing.T) {
	ps1 := &cluster.Task{Type: cluster.PS, Index: 1}
	for _, c := range []struct {
		role  string
		index int
		tf    *cluster.Task
		want  cluster.Task
		err   string
	}{
		{cluster.PS, -1, ps1, *ps1, ""},                                                                             // index from TF_CONFIG
		{cluster.PS, 0, ps1, cluster.Task{Type: cluster.PS}, ""},                                                    // --index wins
		{cluster.Worker, -1, ps1, cluster.Task{}, "TF_CONFIG names no worker"},                                      // TF_CONFIG is another role's
		{cluster.Worker, -1, nil, cluster.Task{}, "pass --index"},                                                   // nothing says
		{"", -1, &cluster.Task{Type: cluster.Standby, Index: 1}, cluster.Task{Type: cluster.Standby, Index: 1}, ""}, // pstrain task as standby/1
		{cluster.Standby, -1, ps1, cluster.Task{}, "TF_CONFIG names no standby"},
		{cluster.Chief, -1, nil, cluster.Task{Type: cluster.Chief}, ""}, // the chief is chief
		{"", -1, ps1, *ps1, ""}, // pstrain task: role and index
		{"", -1, &cluster.Task{Type: cluster.Chief}, cluster.Task{Type: cluster.Chief}, ""},
		{"", 0, ps1, cluster.Task{Type: cluster.PS}, ""}, // pstrain task --index 0
		{"", -1, nil, cluster.Task{}, "names no task"},
	} {
		got, err := resolveTask(c.role, c.index, c.tf)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, errUsage) {
				t.Errorf("%q --index %d, TF_CONFIG %v: %v, %v; want a usage error %q", c.role, c.index, c.tf, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q --index %d, TF_CONFIG %v: %v, %v; want %v", c.role, c.index, c.tf, got, err, c.want)
		}
	}
}

// --ps and --workers come from the cluster unless given; given, they must
// agree with it.
func TestShapeFromCluster(t *testing.T) {
	spec := cluster.Spec{Chief: []string{"c:1"}, PS: []string{"p:2"}, Worker: []string{"w:3", "w:4", "w:5"}}
	for _, c := range []struct {
		ps, workers       int
		psSet, workersSet bool
		err               string
	}{
		{2, 2, false, false, ""},
		{1, 3, true, true, ""},
		{1, 2, true, false, ""},
		{2, 2, true, false, "the cluster has 1 ps and 3 workers but --ps=2; make them agree"},
		{2, 2, false, true, "but --workers=2;"},
		{2, 2, true, true, "but --ps=2 --workers=2;"},
	} {
		r := config.Default()
		r.PS, r.Workers = c.ps, c.workers
		err := shapeFromCluster(&r, spec, c.psSet, c.workersSet)
		switch {
		case c.err == "" && (err != nil || r.PS != 1 || r.Workers != 3):
			t.Errorf("%+v: --ps=%d --workers=%d, %v; want 1 and 3", c, r.PS, r.Workers, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, errUsage)):
			t.Errorf("%+v: %v; want a usage error %q", c, err, c.err)
		}
	}
	// An elastic run's cluster lists a slot for every worker it may
	// scale to (--max-workers), more than --workers.
	r := config.Default()
	r.PS, r.Workers, r.MaxWorkers = 1, 2, 3
	if err := shapeFromCluster(&r, spec, true, true); err != nil || r.Workers != 2 {
		t.Errorf("--workers 2 --max-workers 3 of a cluster of 3 workers: %v, workers %d", err, r.Workers)
	}
	r.MaxWorkers = 2
	if err := shapeFromCluster(&r, spec, true, true); !errors.Is(err, errUsage) {
		t.Errorf("--max-workers 2 of a cluster of 3 workers: %v, want a usage error", err)
	}
}

// --host-metrics auto: only the cluster's first task on each host exports
// the host's metrics (pstrain run's tasks are all on 127.0.0.1: the chief).
// --ps-replicas comes from the cluster (its standby job) when not given,
// so TF_CONFIG alone is enough; given, it must agree with the cluster.
func TestReplicasFromCluster(t *testing.T) {
	plain := cluster.Spec{Chief: []string{"c:1"}, PS: []string{"p:2", "p:3"}, Worker: []string{"w:4"}}
	hot := plain
	hot.Standby = []string{"s:5", "s:6"}
	for _, c := range []struct {
		spec cluster.Spec
		flag int
		set  bool
		want int
		err  string
	}{
		{plain, 0, false, 0, ""},
		{hot, 0, false, 1, ""},
		{hot, 1, true, 1, ""},
		{plain, 0, true, 0, ""},
		{hot, 0, true, 0, "the cluster lists 2 standby addresses (hot standbys) but --ps-replicas=0"},
		{plain, 1, true, 0, "--ps-replicas=1 but the cluster lists no standby addresses"},
	} {
		r := config.Default()
		r.PSReplicas = c.flag
		err := replicasFromCluster(&r, c.spec, c.set)
		switch {
		case c.err == "" && (err != nil || r.PSReplicas != c.want):
			t.Errorf("standbys %d, --ps-replicas %d (given %v): %d, %v; want %d", len(c.spec.Standby), c.flag, c.set, r.PSReplicas, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, errUsage)):
			t.Errorf("standbys %d, --ps-replicas %d: %v; want a usage error with %q", len(c.spec.Standby), c.flag, err, c.err)
		}
	}
}

func TestHostMetricsOn(t *testing.T) {
	spec := cluster.Spec{Chief: []string{"127.0.0.1:1"}, PS: []string{"127.0.0.1:2"}, Worker: []string{"10.0.0.2:3", "10.0.0.2:4"}}
	for _, c := range []struct {
		flag string
		task cluster.Task
		want bool
	}{
		{"auto", cluster.Task{Type: cluster.Chief}, true},
		{"auto", cluster.Task{Type: cluster.PS}, false},
		{"auto", cluster.Task{Type: cluster.Worker}, true},
		{"auto", cluster.Task{Type: cluster.Worker, Index: 1}, false},
		{"on", cluster.Task{Type: cluster.PS}, true},
		{"off", cluster.Task{Type: cluster.Chief}, false},
	} {
		if got, err := hostMetricsOn(c.flag, spec, c.task); err != nil || got != c.want {
			t.Errorf("--host-metrics %s for %s: %v, %v; want %v", c.flag, c.task, got, err, c.want)
		}
	}
	if _, err := hostMetricsOn("yes", spec, cluster.Task{Type: cluster.Chief}); !errors.Is(err, errUsage) {
		t.Errorf("--host-metrics yes: %v, want a usage error", err)
	}
}
