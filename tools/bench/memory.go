package bench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/report"
)

// memoryAllowance is the fixed part of the PS memory goal: peak RSS at
// most 3x (parameters + optimizer state) + 40 MiB.
const memoryAllowance = 40 << 20

// OptimizerStateCopies is how many float32 values of state an optimizer
// keeps per parameter: sgd 0, momentum 1 (velocity), adam 2 (m and v).
func OptimizerStateCopies(name string) (int, error) {
	switch name {
	case "sgd":
		return 0, nil
	case "momentum":
		return 1, nil
	case "adam":
		return 2, nil
	}
	return 0, fmt.Errorf("bench: unknown optimizer %q (want sgd, momentum or adam)", name)
}

// StateBytes is the bytes of parameters plus optimizer state shard s of
// plan holds.
func StateBytes(plan partition.Plan, s int, optimizer string) (int64, error) {
	if s < 0 || s >= len(plan.Shards) {
		return 0, fmt.Errorf("bench: shard %d out of range (plan has %d)", s, len(plan.Shards))
	}
	k, err := OptimizerStateCopies(optimizer)
	if err != nil {
		return 0, err
	}
	return 4 * int64(plan.Shards[s].Size) * int64(1+k), nil
}

// MemoryShard is one PS's figures.
type MemoryShard struct {
	Task         string  `json:"task"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	StateBytes   int64   `json:"state_bytes"`
	RSSOverState float64 `json:"rss_over_state"`
	GoalBytes    int64   `json:"goal_bytes"` // 3 * state + 40 MiB
	MeetsGoal    bool    `json:"meets_goal"`
}

// MemoryResult is the memory section. PSRSSOverState is the largest of
// the shards' ratios; MeetsGoal is the shards' goal. Roles are each
// role's peak RSS in the same run, TotalPeakRSSBytes the sum over every
// task.
type MemoryResult struct {
	Model             string        `json:"model"`
	Optimizer         string        `json:"optimizer"`
	PSRSSOverState    float64       `json:"ps_rss_over_state"`
	MeetsGoal         bool          `json:"meets_goal"`
	Shards            []MemoryShard `json:"shards"`
	Roles             MemoryRoles   `json:"roles"`
	TotalPeakRSSBytes int64         `json:"total_peak_rss_bytes"`
	// Goal says the PS goal when it is not 3 x state + 40 MiB (a CTR
	// model's: ctrMemory).
	Goal string `json:"goal,omitempty"`
}

// MemoryRoles are the figures of each role (memory.roles.{worker,chief,ps}
// in the JSON, an architecture contract).
type MemoryRoles struct {
	Worker MemoryRole `json:"worker"`
	Chief  MemoryRole `json:"chief"`
	PS     MemoryRole `json:"ps"`
}

// RoleGoalBytes is the goal for a worker's and the chief's peak RSS in
// the default run: a worker holds its data
// shard as stored, the chief the test set.
const RoleGoalBytes = 120 << 20

// MemoryRole is one role's figures: how many of its tasks the run had,
// the largest peak RSS among them, and the goal for that peak (0 for the
// PS, whose goal is per shard: see Shards).
type MemoryRole struct {
	Tasks        int   `json:"tasks"`
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	GoalBytes    int64 `json:"goal_bytes,omitempty"`
	MeetsGoal    bool  `json:"meets_goal"`
}

// Memory sets each PS's peak RSS in rep against its state, from the
// report's model, shard count and optimizer, and gives every role's peak
// RSS.
func Memory(rep *report.Report) (*MemoryResult, error) {
	spec, err := ParseModel(rep.Model)
	if err != nil {
		return nil, err
	}
	return memoryGoals{role: RoleGoalBytes, ps: func(st int64) int64 { return 3*st + memoryAllowance }}.of(rep, spec)
}

// memoryGoals are a model's memory goals: each role's but the PS's
// (role), a PS's given the bytes of its state (ps) and the latter's
// wording (text, "" for the default); extra, when set, is the state a
// shard holds beyond its slice of the dense model and that slice's
// optimizer state (a CTR shard's table rows).
type memoryGoals struct {
	role  int64
	ps    func(stateBytes int64) int64
	text  string
	extra func(shard int) int64
}

// of measures rep's peak RSS per role against g, for rep's shard count
// and optimizer over spec.
func (g memoryGoals) of(rep *report.Report, spec model.Spec) (*MemoryResult, error) {
	plan, err := partition.New(spec, rep.PS)
	if err != nil {
		return nil, err
	}
	res := &MemoryResult{Model: rep.Model, Optimizer: rep.Optimizer, MeetsGoal: true, Goal: g.text}
	if res.Roles.Worker, err = roleMemory(rep, "worker", rep.Workers, g.role); err != nil {
		return nil, err
	}
	if res.Roles.Chief, err = roleMemory(rep, "chief", 1, g.role); err != nil {
		return nil, err
	}
	for _, t := range rep.Tasks {
		res.TotalPeakRSSBytes += t.PeakRSSBytes
	}
	for s := range rep.PS {
		name := fmt.Sprintf("ps/%d", s)
		t, ok := rep.Tasks[name]
		if !ok {
			return nil, fmt.Errorf("bench: report has no %s task", name)
		}
		st, err := StateBytes(plan, s, rep.Optimizer)
		if err != nil {
			return nil, err
		}
		if g.extra != nil {
			st += g.extra(s)
		}
		m := MemoryShard{Task: name, PeakRSSBytes: t.PeakRSSBytes, StateBytes: st,
			RSSOverState: ratio(float64(t.PeakRSSBytes), float64(st)), GoalBytes: g.ps(st)}
		m.MeetsGoal = m.PeakRSSBytes > 0 && m.PeakRSSBytes <= m.GoalBytes
		res.MeetsGoal = res.MeetsGoal && m.MeetsGoal
		res.PSRSSOverState = max(res.PSRSSOverState, m.RSSOverState)
		res.Shards = append(res.Shards, m)
		res.Roles.PS.Tasks++
		res.Roles.PS.PeakRSSBytes = max(res.Roles.PS.PeakRSSBytes, m.PeakRSSBytes)
	}
	res.Roles.PS.MeetsGoal = res.MeetsGoal
	return res, nil
}

// roleMemory is the figures of role's n tasks in rep ("chief" is one
// task, the others ROLE/i), each of which must be there.
func roleMemory(rep *report.Report, role string, n int, goal int64) (MemoryRole, error) {
	r := MemoryRole{Tasks: n, GoalBytes: goal}
	for i := range n {
		name := role
		if role != "chief" {
			name = fmt.Sprintf("%s/%d", role, i)
		}
		t, ok := rep.Tasks[name]
		if !ok {
			return r, fmt.Errorf("bench: report has no %s task", name)
		}
		r.PeakRSSBytes = max(r.PeakRSSBytes, t.PeakRSSBytes)
	}
	r.MeetsGoal = r.PeakRSSBytes > 0 && r.PeakRSSBytes <= goal
	return r, nil
}

// ParseModel reads a spec written by model.Spec.String ("784-800-10").
func ParseModel(s string) (model.Spec, error) {
	parts := strings.Split(s, "-")
	if len(parts) < 2 {
		return model.Spec{}, fmt.Errorf("bench: model %q is not INPUT-HIDDEN...-CLASSES", s)
	}
	dims := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return model.Spec{}, fmt.Errorf("bench: model %q: %q is not a layer size", s, p)
		}
		dims[i] = n
	}
	spec := model.Spec{Input: dims[0], Hidden: dims[1 : len(dims)-1], Classes: dims[len(dims)-1]}
	return spec, spec.Validate()
}
