package worker

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/scenariotest"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
)

// TestScenarios replays testdata/*.txt against the Core
// (internal/scenariotest; -rewrite rewrites the expected output: read the
// diff before committing it). After "----" a block shows the actions the
// core gives, then what it logged. The events:
//
//	config [shards=N] [mode=M] [overlap] [early] [in-place=S,...]
//	       [fault=STEP:SCALE|every:SCALE]
//	                                a new core: N shards (2) of the MLP
//	                                784-800-10, mode sync, async or ssp;
//	                                overlap: the next step's pulls go with
//	                                a step's pushes; early: early pushes
//	                                and steps started ahead (earlyPlan);
//	                                in-place: those shards are read in place
//	start t=S                       the first pulls
//	pulled ps=I v=V [gen=G] [pos=P] [done] [placed] t=S
//	                                a pull's answer (placed: the net reads it
//	                                where the pull left it)
//	stalled ps=I t=S                a bounded pull's bound passed
//	pull-failed ps=I err=MSG t=S    a pull failed (or was cancelled)
//	head-started n=N t=S            a HeadStart computed N blocks
//	rows-final row=R loss=F         the net says rows R and up are final
//	rows-final first                (first: the first announced block's row)
//	computed loss=F [err=MSG] t=S   the passes are done
//	pushed ps=I [dropped] [refused] [err=MSG] t=S
//	                                a push's answer
//	state                           the core's state, steps, data position,
//	                                the version every shard must reach and
//	                                what each shard last answered
//
// Times are seconds since t=0; the core reads no other clock.
func TestScenarios(t *testing.T) {
	scenariotest.Run(t, 10, func() scenariotest.Directive {
		s := &scenario{t0: time.Unix(1_000_000, 0)}
		return s.do
	})
}

type scenario struct {
	t0   time.Time
	core *Core
	logs bytes.Buffer
	rows []int // the early rows, for rows-final first
}

func (s *scenario) do(d *datadriven.TestData) (string, error) {
	a := scenariotest.ArgsOf(d)
	if d.Cmd == "config" {
		return "", s.config(a)
	}
	if s.core == nil {
		return "", errors.New("no config yet")
	}
	if d.Cmd == "state" {
		return s.state(), nil
	}
	acts, err := s.event(d.Cmd, a)
	if err != nil {
		return "", err
	}
	var lines []string
	for _, x := range acts {
		lines = append(lines, x.String())
	}
	if len(lines) == 0 {
		lines = append(lines, "(nothing)")
	}
	if s.logs.Len() > 0 {
		lines = append(lines, strings.TrimRight(s.logs.String(), "\n"))
		s.logs.Reset()
	}
	return strings.Join(lines, "\n"), nil
}

// event feeds the core one event.
func (s *scenario) event(cmd string, a scenariotest.Args) ([]Action, error) {
	c, now := s.core, a.At(s.t0)
	switch cmd {
	case "start":
		return c.Start(now), nil
	case "pulled":
		return c.Pulled(now, PullAnswer{Shard: int(a.Num("ps")), Version: a.Num("v"), Generation: a.Num("gen"),
			Position: a.Num("pos"), Done: a.Has("done"), Placed: a.Has("placed")}), nil
	case "stalled":
		return c.Pulled(now, PullAnswer{Shard: int(a.Num("ps")), Stalled: true}), nil
	case "pull-failed":
		return c.Pulled(now, PullAnswer{Shard: int(a.Num("ps")), Err: a.Err()}), nil
	case "head-started":
		return c.HeadStarted(now, int(a.Num("n"))), nil
	case "rows-final":
		row := int(a.Num("row"))
		if a.Has("first") && len(s.rows) > 0 {
			row = s.rows[len(s.rows)-1]
		}
		loss, _ := strconv.ParseFloat(a["loss"], 32)
		return c.RowsFinal(row, float32(loss)), nil
	case "computed":
		loss, _ := strconv.ParseFloat(a["loss"], 32)
		return c.Computed(now, float32(loss), a.Err()), nil
	case "pushed":
		out := PushOutcome{Shard: int(a.Num("ps")), Err: a.Err()}
		switch {
		case a.Has("dropped"):
			out.Result = PushDropped
		case a.Has("refused"):
			out.Result = PushRefused
		}
		return c.Pushed(now, out), nil
	}
	return nil, fmt.Errorf("unknown event %q", cmd)
}

// config makes a new core.
func (s *scenario) config(a scenariotest.Args) error {
	p := CoreParams{Shards: 2, Mode: config.Sync}
	if n, ok := a["shards"]; ok {
		p.Shards, _ = strconv.Atoi(n)
	}
	if m, ok := a["mode"]; ok {
		p.Mode = config.Mode(m)
	}
	p.Overlap = a.Has("overlap")
	if a.Has("early") {
		plan, err := partition.New(model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}, p.Shards)
		if err != nil {
			return err
		}
		p.EarlyRows, p.EarlyReady = earlyPlan(plan)
		p.HeadStart = headStartPlan(plan, p.EarlyRows)
		s.rows = p.EarlyRows
	}
	if v, ok := a["in-place"]; ok {
		p.InPlace = make([]bool, p.Shards)
		for _, f := range strings.Split(v, ",") {
			i, _ := strconv.Atoi(f)
			p.InPlace[i] = true
		}
	}
	if v, ok := a["fault"]; ok {
		f, err := parseGradientFault("worker/0@"+v, 1)
		if err != nil {
			return err
		}
		p.Faults = []GradientFault{f}
	}
	s.logs.Reset()
	log := slog.New(slog.NewTextHandler(&s.logs, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, at slog.Attr) slog.Attr {
			if at.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return at
		}}))
	s.core = NewCore(p, log)
	return nil
}

// state prints where the core is.
func (s *scenario) state() string {
	c := s.core
	var views []string
	for i, v := range c.views {
		x := fmt.Sprintf("ps/%d@%d:g%d pos=%d", i, v.Version, v.Generation, c.positions[i])
		if v.Stalled {
			x += " stalled"
		}
		views = append(views, x)
	}
	min := strconv.FormatInt(c.minVersion, 10)
	if c.minVersion == math.MaxInt64 {
		min = "max"
	}
	return fmt.Sprintf("state=%s steps=%d next-batch=%d min-version=%s early-pushes=%d started-ahead=%d\n%s",
		c.state, c.steps, c.next, min, c.early.count, c.head.count, strings.Join(views, "\n"))
}
