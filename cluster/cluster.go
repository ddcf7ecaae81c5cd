// Package cluster reads the cluster description: which addresses the
// chief, the parameter servers and the workers listen on, and which task
// this process is. The format is TensorFlow's, so the same binary runs from
// a file, from scripts, or under Kubernetes/Kubeflow, where the operator
// sets TF_CONFIG:
//
//	{"cluster": {"chief": ["h:p"], "ps": ["h:p", ...], "worker": ["h:p", ...]},
//	 "task": {"type": "ps", "index": 0}}
//
// A cluster with hot-standby shards (--ps-replicas 1, docs/replication.md)
// also lists "standby": one address per ps address, standby/N being the
// second process of shard N.
//
// A cluster file holds either that whole object or just its "cluster" part.
// "master", the chief's name in older TFJobs, is read as "chief".
package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Roles.
const (
	Chief  = "chief"
	PS     = "ps"
	Worker = "worker"
	// Standby is the second process of a shard with a hot standby: which
	// of ps/N and standby/N is the shard's primary is the chief's call.
	Standby = "standby"
)

// Spec lists every task's address.
type Spec struct {
	Chief  []string `json:"chief"`
	PS     []string `json:"ps"`
	Worker []string `json:"worker"`
	// Standby is empty, or has one address per PS (hot standbys).
	Standby []string `json:"standby,omitempty"`
}

// Task identifies one process.
type Task struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

// String renders "ps/0", "worker/3" or "chief".
func (t Task) String() string {
	if t.Type == Chief {
		return Chief
	}
	return fmt.Sprintf("%s/%d", t.Type, t.Index)
}

// ParseTask parses "ps/0", "standby/0", "worker/3" or "chief".
func ParseTask(s string) (Task, error) {
	if s == Chief || s == "chief/0" {
		return Task{Type: Chief}, nil
	}
	typ, idx, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(idx)
	if !ok || err != nil || n < 0 || (typ != PS && typ != Worker && typ != Standby) {
		return Task{}, fmt.Errorf("task %q: want chief, ps/N, standby/N or worker/N", s)
	}
	return Task{Type: typ, Index: n}, nil
}

// Master is the chief's name in the TF_CONFIG of older TFJobs (and
// TensorFlow 1's estimators): Parse reads it as Chief.
const Master = "master"

type tfConfig struct {
	Cluster *specJSON `json:"cluster"`
	Task    *Task     `json:"task"`
}

// specJSON is a Spec as written: the chief may be called master.
type specJSON struct {
	Chief   []string `json:"chief"`
	Master  []string `json:"master"`
	PS      []string `json:"ps"`
	Worker  []string `json:"worker"`
	Standby []string `json:"standby"`
}

func (j specJSON) spec() (Spec, error) {
	s := Spec{Chief: j.Chief, PS: j.PS, Worker: j.Worker, Standby: j.Standby}
	if len(j.Master) > 0 {
		if len(j.Chief) > 0 {
			return Spec{}, errors.New("cluster: both chief and master given (master is an older name of the chief: give one)")
		}
		s.Chief = j.Master
	}
	return s, nil
}

// Parse decodes a cluster file or TF_CONFIG value. The task is nil when the
// input has none. A master (in the cluster or as the task's type) is the
// chief.
func Parse(b []byte) (Spec, *Task, error) {
	var tf tfConfig
	if err := json.Unmarshal(b, &tf); err != nil {
		return Spec{}, nil, fmt.Errorf("cluster: %w", err)
	}
	var sj specJSON
	if tf.Cluster != nil {
		sj = *tf.Cluster
	} else if err := json.Unmarshal(b, &sj); err != nil {
		return Spec{}, nil, fmt.Errorf("cluster: %w", err)
	}
	s, err := sj.spec()
	if err != nil {
		return Spec{}, nil, err
	}
	if err := s.Validate(); err != nil {
		return Spec{}, nil, err
	}
	if tf.Task != nil {
		if tf.Task.Type == Master {
			tf.Task.Type = Chief
		}
		if _, err := s.Addr(*tf.Task); err != nil {
			return Spec{}, nil, err
		}
	}
	return s, tf.Task, nil
}

// Load reads the cluster from file, or from the TF_CONFIG value env when
// file is empty.
func Load(file, env string) (Spec, *Task, error) {
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return Spec{}, nil, fmt.Errorf("cluster file: %w", err)
		}
		s, t, err := Parse(b)
		if err != nil {
			return Spec{}, nil, fmt.Errorf("%s: %w", file, err)
		}
		return s, t, nil
	case env != "":
		s, t, err := Parse([]byte(env))
		if err != nil {
			return Spec{}, nil, fmt.Errorf("TF_CONFIG: %w", err)
		}
		return s, t, nil
	}
	return Spec{}, nil, errors.New("no cluster: pass --cluster FILE or set TF_CONFIG")
}

// Validate checks counts and addresses.
func (s Spec) Validate() error {
	if len(s.Chief) != 1 {
		return fmt.Errorf("cluster: need exactly one chief address, got %d", len(s.Chief))
	}
	if len(s.PS) < 1 {
		return errors.New("cluster: need at least one ps address")
	}
	if len(s.Worker) < 1 {
		return errors.New("cluster: need at least one worker address")
	}
	if len(s.Standby) > 0 && len(s.Standby) != len(s.PS) {
		return fmt.Errorf("cluster: %d standby addresses for %d ps: a hot standby needs one per shard, or none", len(s.Standby), len(s.PS))
	}
	seen := map[string]string{}
	for _, t := range s.Tasks() {
		a, _ := s.Addr(t)
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("cluster: %s address %q: %w", t, a, err)
		}
		if other, dup := seen[a]; dup {
			return fmt.Errorf("cluster: %s and %s share the address %s", other, t, a)
		}
		seen[a] = t.String()
	}
	return nil
}

// Tasks lists every task: chief, ps/0.., standby/0.., worker/0...
func (s Spec) Tasks() []Task {
	ts := []Task{{Type: Chief}}
	for i := range s.PS {
		ts = append(ts, Task{Type: PS, Index: i})
	}
	for i := range s.Standby {
		ts = append(ts, Task{Type: Standby, Index: i})
	}
	for i := range s.Worker {
		ts = append(ts, Task{Type: Worker, Index: i})
	}
	return ts
}

// Addr is the task's address.
func (s Spec) Addr(t Task) (string, error) {
	var list []string
	switch t.Type {
	case Chief:
		list = s.Chief
	case PS:
		list = s.PS
	case Worker:
		list = s.Worker
	case Standby:
		list = s.Standby
	default:
		return "", fmt.Errorf("cluster: unknown task type %q (want chief, ps, standby or worker)", t.Type)
	}
	if t.Index < 0 || t.Index >= len(list) {
		return "", fmt.Errorf("cluster: no %s with index %d (the cluster has %d)", t.Type, t.Index, len(list))
	}
	return list[t.Index], nil
}

// FirstOnHost reports whether t is the first task of the cluster (in the
// order of Tasks: chief, ps/0.., standby/0.., worker/0..) whose address has t's host:
// the one task per host that reports what all of them share, such as the
// host's load. Hosts are compared as written, so two names (or a name and
// an address) of one machine count as two hosts.
func (s Spec) FirstOnHost(t Task) bool {
	addr, err := s.Addr(t)
	if err != nil {
		return false
	}
	host, _, _ := net.SplitHostPort(addr)
	for _, u := range s.Tasks() {
		a, _ := s.Addr(u)
		if h, _, _ := net.SplitHostPort(a); h == host {
			return u == t
		}
	}
	return false
}

// JSON encodes the spec as a cluster file.
func (s Spec) JSON() []byte {
	b, _ := json.MarshalIndent(s, "", "  ") // strings only: cannot fail
	return append(b, '\n')
}
