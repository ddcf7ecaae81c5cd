package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
)

// resolveTask says which task this process is. role is the command's
// ("" for `pstrain task`: the cluster's task names it); index is --index
// (-1: the cluster's task gives it); t is the task TF_CONFIG or the
// cluster file names, nil if none. The chief is always index 0.
func resolveTask(role string, index int, t *cluster.Task) (cluster.Task, error) {
	if role == "" {
		if t == nil {
			return cluster.Task{}, usagef("TF_CONFIG (or the cluster file) names no task: set its \"task\", or run pstrain chief, ps, standby or worker")
		}
		role = t.Type
	}
	switch {
	case role == cluster.Chief:
		return cluster.Task{Type: cluster.Chief}, nil
	case index >= 0:
		return cluster.Task{Type: role, Index: index}, nil
	case t == nil || t.Type != role:
		return cluster.Task{}, usagef("pass --index (TF_CONFIG names no %s task)", role)
	}
	return *t, nil
}

// shapeFromCluster takes --ps and --workers from the cluster when they
// were not given (psSet, workersSet); given, they must agree with it.
func shapeFromCluster(r *config.Run, spec cluster.Spec, psSet, workersSet bool) error {
	if !psSet {
		r.PS = len(spec.PS)
	}
	if !workersSet {
		r.Workers = len(spec.Worker)
	}
	var given []string
	// Likewise PS slots, up to an explicit --max-ps (docs/elastic.md,
	// "Parameter servers").
	if r.PS != len(spec.PS) && (r.MaxPS == 0 || r.PS > len(spec.PS) || len(spec.PS) > r.MaxPS) {
		given = append(given, fmt.Sprintf("--ps=%d", r.PS))
	}
	// An elastic cluster may list more workers than it starts with, up
	// to an explicit --max-workers: the slots it can scale into
	// (docs/elastic.md).
	if r.Workers != len(spec.Worker) && (r.MaxWorkers == 0 || r.Workers > len(spec.Worker) || len(spec.Worker) > r.MaxWorkers) {
		given = append(given, fmt.Sprintf("--workers=%d", r.Workers))
	}
	if len(given) > 0 {
		return usagef("the cluster has %d ps and %d workers but %s; make them agree (or leave the flags out: they come from the cluster)",
			len(spec.PS), len(spec.Worker), strings.Join(given, " "))
	}
	return nil
}

// replicasFromCluster takes --ps-replicas from the cluster when it was
// not given (set): 1 when the cluster lists standby addresses, else 0.
// Given, it must agree: a cluster with standbys needs --ps-replicas 1 and
// one without them --ps-replicas 0, so that every task, the chief
// included, agrees on whether each shard has a second process.
func replicasFromCluster(r *config.Run, spec cluster.Spec, set bool) error {
	has := 0
	if len(spec.Standby) > 0 {
		has = 1
	}
	if !set {
		r.PSReplicas = has
		return nil
	}
	switch {
	case r.PSReplicas == has:
		return nil
	case has == 1:
		return usagef("the cluster lists %d standby addresses (hot standbys) but --ps-replicas=%d; make them agree: --ps-replicas 1 (or leave the flag out: it comes from the cluster)", len(spec.Standby), r.PSReplicas)
	}
	return usagef("--ps-replicas=%d but the cluster lists no standby addresses; add a \"standby\" job with one address per ps (or leave the flag out: it comes from the cluster)", r.PSReplicas)
}

// hostMetricsOn reads --host-metrics: on, off, or auto (the cluster's
// first task on t's host exports the host's metrics, the others not: every
// process on a host would export the same series).
func hostMetricsOn(flag string, spec cluster.Spec, t cluster.Task) (bool, error) {
	switch flag {
	case "on":
		return true, nil
	case "off":
		return false, nil
	case "auto":
		return spec.FirstOnHost(t), nil
	}
	return false, usagef("--host-metrics must be auto, on or off, got %q", flag)
}

// loadCluster is cluster.Load with the exit status rule: a cluster that
// does not parse or validate (garbage JSON, an unknown task type, an
// index out of range, a bad port, a duplicate address), or none given,
// is the user's bad value (a usage error, status 2); a cluster file that
// cannot be read is a failure (status 1), as for any file.
func loadCluster(file, env string) (cluster.Spec, *cluster.Task, error) {
	spec, t, err := cluster.Load(file, env)
	var pe *fs.PathError
	if err != nil && !errors.As(err, &pe) {
		err = asUsage(err)
	}
	return spec, t, err
}
