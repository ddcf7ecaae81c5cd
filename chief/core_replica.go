package chief

import (
	"fmt"
	"strings"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/observe/report"
)

// Hot standbys (--ps-replicas 1, docs/replication.md): every shard has
// two processes, ps/N and standby/N. One of them is the shard's primary
// (it serves the workers, the chief's Init, Checkpoint, Stop, membership
// and evaluation pulls); the other holds a copy of its state, updated
// before any push is answered. Which one is primary, and the shard's
// replication epoch (raised by every change of primary or standby), are
// the core's to decide. At every poll, per shard:
//
//  1. the primary is gone, the other process is a standby at the shard's
//     epoch and the primary last said it was attached: Promote it. No
//     generation change, nothing rolled back: training goes on from the
//     version the dead primary had acknowledged.
//  2. the standby does not answer: SetStandby "" (the primary goes on
//     alone at once).
//  3. the other process answers as "" (back empty) or "deposed" (an old
//     primary): SetStandby its address on the primary.
//  4. both gone, or the primary gone with its standby not attached: the
//     restore from the newest checkpoint (orderRestore), into whichever
//     process answers.

// The roles a PS process reports in Status.
const (
	rolePrimary = "primary"
	roleStandby = "standby"
	roleDeposed = "deposed"
)

// attachGrace is how long a primary may take to attach the standby it
// was told of before the chief tells it again.
const attachGrace = 5 * time.Second

// stuckLag is how long a standby may leave an update unacknowledged
// before the chief attaches it again (a push waits 20 s for it).
const stuckLag = 10.0 // seconds

// Replica is which process of a shard is its primary, and the shard's
// replication epoch.
type Replica struct {
	Primary string `json:"primary"` // the primary's task type: "ps" or "standby"
	Epoch   int64  `json:"epoch"`
}

// replicaRun is what the core knows of a shard's two processes between
// polls (not saved: a restarted chief learns it again from the polls).
type replicaRun struct {
	attached bool  // the primary's last good Status said its standby is attached
	seen     int64 // the primary's version at its last good Status
	// told is the standby address the primary was last told (toldKnown:
	// known at all; after an Init the primary's Status says it), toldAt
	// when; failedAt is when a SetStandby last failed.
	told      string
	toldKnown bool
	toldAt    time.Time
	failedAt  time.Time
	lost      string    // the dead task a restore under way answers ("": the primary)
	promote   *failover // the Promote ordered
	// standbyUp: the other process was last seen as the primary's
	// attached standby; standbyDown is when it was then first seen dead
	// or empty (zero: it was not), until it is attached again.
	standbyUp   bool
	standbyDown time.Time
}

// failover is a Promote under way.
type failover struct {
	dead, to string
	detected time.Time
	seen     int64 // the dead primary's last version
	epoch    int64
}

// replicated says the shards have hot standbys.
func (c *Core) replicated() bool { return c.rep != nil }

// Replica is shard s's primary and epoch (the zero Epoch and "ps"
// without hot standbys): where the driver sends what is meant for the
// shard.
func (c *Core) Replica(s int) Replica {
	if !c.replicated() || s < 0 || s >= len(c.st.Replicas) {
		return Replica{Primary: cluster.PS}
	}
	return c.st.Replicas[s]
}

// task names shard s's process of type typ.
func task(typ string, s int) string { return fmt.Sprintf("%s/%d", typ, s) }

// other is the other process type of a shard.
func other(typ string) string {
	if typ == cluster.Standby {
		return cluster.PS
	}
	return cluster.Standby
}

// addrOf is the address of shard s's process of type typ.
func (c *Core) addrOf(typ string, s int) string {
	addrs := c.p.PSAddrs
	if typ == cluster.Standby {
		addrs = c.p.StandbyAddrs
	}
	if s < len(addrs) {
		return addrs[s]
	}
	return ""
}

// primaryTask names the process a failure of shard s is recorded under:
// the dead task a rule-4 restore answers, else the primary.
func (c *Core) primaryTask(s int) string {
	if !c.replicated() {
		return task(cluster.PS, s)
	}
	if c.rep[s].lost != "" {
		return c.rep[s].lost
	}
	return task(c.st.Replicas[s].Primary, s)
}

// initEpochs raises the epoch of the shards about to be initialised
// again (a restore, a rollback, a reinit): every Init starts a new
// epoch, and what the primary was told of its standby is read again from
// its Status.
func (c *Core) initEpochs(shards []int) {
	if !c.replicated() {
		return
	}
	for _, s := range shards {
		c.st.Replicas[s].Epoch++
		c.rep[s].toldKnown, c.rep[s].attached = false, false
	}
}

func allShards(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// tickReplicas applies the rules to every shard. It returns each shard's
// status as the rest of the core sees it (its primary's; a failed
// primary as down while its standby is promoted, or as empty when the
// shard must be restored) and the actions of the rules.
func (c *Core) tickReplicas(now time.Time, ps, standby []ShardStatus) ([]ShardStatus, []Action) {
	eff := make([]ShardStatus, len(ps))
	var acts []Action
	for s := range ps {
		p, o := ps[s], ShardStatus{Err: fmt.Errorf("%s not polled", task(cluster.Standby, s))}
		if s < len(standby) {
			o = standby[s]
		}
		if c.st.Replicas[s].Primary == cluster.Standby {
			p, o = o, p
		}
		x, a := c.replicaRules(now, s, p, o)
		eff[s] = x
		if a != nil {
			acts = append(acts, a...)
		}
	}
	return eff, acts
}

// replicaRules decides for shard s from its primary's (p) and the other
// process's (o) answers.
func (c *Core) replicaRules(now time.Time, s int, p, o ShardStatus) (ShardStatus, []Action) {
	r, st := &c.rep[s], &c.st.Replicas[s]
	if servesNewer(o, p, st.Epoch) {
		// The other process serves at a newer epoch: a Promote whose
		// answer was lost, or one a previous chief ordered.
		return o, c.follow(now, s, p, o)
	}
	if p.Err != nil || !p.Serving || p.Role == roleStandby || p.Role == roleDeposed {
		return c.primaryLost(now, s, p, o)
	}
	if p.StandbyAttached && !r.attached {
		// (From here on a failure of the primary is a failover.)
		c.log.Info("standby attached", "shard", s, "primary", task(st.Primary, s), "standby", task(other(st.Primary), s),
			"epoch", p.Epoch, "version", p.Version)
	}
	r.attached, r.seen = p.StandbyAttached, p.Version
	// (A SetStandby whose answer was lost moved the epoch on.)
	st.Epoch = max(st.Epoch, p.Epoch)
	if !r.toldKnown {
		r.told, r.toldKnown, r.toldAt = p.StandbyAddr, true, now
	}
	return p, c.standbyRule(now, s, p, o)
}

// servesNewer says the other process o serves as a primary at an epoch
// newer than the shard's (epoch) and than its primary p's.
func servesNewer(o, p ShardStatus, epoch int64) bool {
	if o.Err != nil || o.Role != rolePrimary || o.Epoch <= epoch {
		return false
	}
	return p.Err != nil || p.Role != rolePrimary || p.Epoch < o.Epoch
}

// lostWhy says why a primary that does not serve is lost: its error, or
// the role it answered with, or "empty".
func lostWhy(p ShardStatus) string {
	switch {
	case p.Err != nil:
		return p.Err.Error()
	case p.Role != "":
		return p.Role
	}
	return "empty"
}

// primaryLost is rules 1 and 4 for shard s, whose primary (p) does not
// serve: promote an attached standby, or restore the shard into
// whichever process is up.
func (c *Core) primaryLost(now time.Time, s int, p, o ShardStatus) (ShardStatus, []Action) {
	r, st := &c.rep[s], &c.st.Replicas[s]
	pName, oName := task(st.Primary, s), task(other(st.Primary), s)
	why := lostWhy(p)
	switch {
	case o.Err == nil && o.Role == roleStandby && o.Epoch == st.Epoch && r.attached:
		// Rule 1.
		if r.promote == nil {
			detected := c.down[s]
			if detected.IsZero() {
				detected = p.lostAt(now)
			}
			r.promote = &failover{dead: pName, to: oName, detected: detected, seen: r.seen, epoch: st.Epoch + 1}
			c.log.Warn("shard primary lost: promoting its standby", "task", pName, "why", why, "standby", oName, "shard", s)
		}
		return ShardStatus{Err: fmt.Errorf("%s: %s (promoting %s)", pName, why, oName)},
			[]Action{Promote{Shard: s, Task: oName, Epoch: r.promote.epoch}}
	case o.Err == nil && p.Err != nil:
		// Rule 4, the other process up: it becomes the primary and is
		// restored from the newest checkpoint.
		c.log.Warn("shard primary lost with no attached standby: restoring the shard into the other process",
			"task", pName, "why", why, "into", oName, "shard", s)
		if r.lost == "" {
			r.lost = pName
		}
		st.Primary = other(st.Primary)
		return ShardStatus{}, nil
	case p.Err != nil:
		return p, nil // both down: wait for one
	}
	return ShardStatus{}, nil // the primary back empty: restore it
}

// standbyRule is rules 2 and 3 for a shard whose primary serves: the
// primary is told of its standby's death or return.
func (c *Core) standbyRule(now time.Time, s int, p, o ShardStatus) []Action {
	r, st := &c.rep[s], &c.st.Replicas[s]
	c.noteStandby(now, s, p, o)
	want := ""
	if o.Err == nil {
		want = c.addrOf(other(st.Primary), s)
	}
	switch {
	case !r.failedAt.IsZero() && now.Sub(r.failedAt) < time.Second:
		return nil // the last attempt just failed: not at every poll
	case want != r.told:
	case want == "":
		return nil
	case o.Role == roleStandby && o.Epoch >= st.Epoch && p.ReplicationLagSeconds < stuckLag:
		return nil // attached, or about to be
	case o.Role == roleStandby && o.Epoch >= st.Epoch:
		// It answers but acknowledges nothing: pushes wait for it. Attach
		// it afresh (a snapshot at a new epoch).
		c.log.Warn("standby acknowledges nothing: attaching it again", "shard", s,
			"lag_seconds", fmt.Sprintf("%.1f", p.ReplicationLagSeconds))
	case p.StandbyAttached && (o.Role == "" || o.Role == roleDeposed):
		// The standby lost its state since it was attached (restarted
		// between two polls): attach it again.
	case now.Sub(r.toldAt) < attachGrace:
		return nil // attaching
	}
	return []Action{SetStandby{Shard: s, Epoch: max(st.Epoch, p.Epoch) + 1, Addr: want}}
}

// noteStandby records a standby's death and return as a restart of its
// task: it lost nothing (its primary went on), and it is back when its
// primary says it is attached again.
func (c *Core) noteStandby(now time.Time, s int, p, o ShardStatus) {
	r := &c.rep[s]
	attached := o.Err == nil && o.Role == roleStandby && p.StandbyAttached
	switch {
	case attached && !r.standbyDown.IsZero():
		name := task(other(c.st.Replicas[s].Primary), s)
		c.st.Restarts = append(c.st.Restarts, report.Restart{Task: name, KilledAtSeconds: c.seconds(r.standbyDown),
			BackAtSeconds: ptr(c.seconds(now)), RestoredStep: p.Version})
		c.m.TaskRestarts.WithLabelValues(name).Inc()
		c.log.Warn("standby back and attached", "task", name, "shard", s, "version", p.Version,
			"down_seconds", fmt.Sprintf("%.2f", now.Sub(r.standbyDown).Seconds()))
		r.standbyDown = time.Time{}
	case r.standbyUp && !attached && (o.Err != nil || o.Role == "") && r.standbyDown.IsZero():
		r.standbyDown = now
	}
	r.standbyUp = attached
}

// Promoted says the Promote of shard's standby is done: it serves from
// version.
func (c *Core) Promoted(now time.Time, shard int, version int64) []Action {
	if !c.replicated() || shard < 0 || shard >= len(c.rep) || c.rep[shard].promote == nil {
		return nil
	}
	f := c.rep[shard].promote
	c.rep[shard].promote = nil
	c.switchPrimary(now, shard, f.to, f.epoch, version)
	c.recordFailover(now, shard, f, version)
	return []Action{c.save()}
}

// PromoteFailed says the Promote of shard's standby failed: the next
// poll restores the shard from the newest checkpoint instead (rule 4),
// or follows the standby if it did become the primary.
func (c *Core) PromoteFailed(now time.Time, shard int, err error) []Action {
	if !c.replicated() || shard < 0 || shard >= len(c.rep) || c.rep[shard].promote == nil {
		return nil
	}
	f := c.rep[shard].promote
	c.rep[shard].promote, c.rep[shard].attached = nil, false
	c.log.Error("could not promote the standby; the shard will be restored from the newest checkpoint",
		"task", f.to, "shard", shard, "epoch", f.epoch, "err", err)
	return nil
}

// StandbySet says shard's primary was told its standby is addr ("":
// none) at epoch.
func (c *Core) StandbySet(now time.Time, shard int, epoch int64, addr string) []Action {
	if !c.replicated() || shard < 0 || shard >= len(c.rep) {
		return nil
	}
	r := &c.rep[shard]
	r.told, r.toldKnown, r.toldAt, r.failedAt = addr, true, now, time.Time{}
	r.attached = false // a new link (or none): attached again only when its primary says so
	c.st.Replicas[shard].Epoch = max(c.st.Replicas[shard].Epoch, epoch)
	standby := task(other(c.st.Replicas[shard].Primary), shard)
	if addr == "" {
		r.attached = false
		c.log.Warn("standby lost: its primary goes on alone", "standby", standby, "shard", shard, "epoch", epoch)
	} else {
		c.log.Info("standby being attached to its primary", "standby", standby, "addr", addr, "shard", shard, "epoch", epoch)
	}
	return []Action{c.save()}
}

// StandbyFailed says a SetStandby failed; the next polls decide again
// (at most once a second).
func (c *Core) StandbyFailed(now time.Time, shard int, err error) []Action {
	if !c.replicated() || shard < 0 || shard >= len(c.rep) {
		return nil
	}
	c.rep[shard].failedAt = now
	c.rep[shard].attached = false // the primary may have dropped its link before failing
	c.log.Warn("could not tell a primary of its standby", "shard", shard, "err", err)
	return nil
}

// follow makes the other process, which serves as primary at a newer
// epoch, the shard's primary; if the primary the core knew is gone it
// is a failover.
func (c *Core) follow(now time.Time, s int, p, o ShardStatus) []Action {
	r, st := &c.rep[s], &c.st.Replicas[s]
	f := r.promote
	if f == nil {
		detected := c.down[s]
		if detected.IsZero() {
			detected = p.lostAt(now)
		}
		f = &failover{dead: task(st.Primary, s), to: task(other(st.Primary), s), detected: detected, seen: r.seen}
	}
	r.promote = nil
	c.switchPrimary(now, s, f.to, o.Epoch, o.Version)
	if p.Err != nil || !p.Serving {
		c.recordFailover(now, s, f, o.Version)
	} else {
		c.log.Warn("following the shard's newer primary", "primary", f.to, "shard", s, "epoch", o.Epoch)
	}
	return []Action{c.save()}
}

// switchPrimary makes to shard s's primary, alone, at epoch.
func (c *Core) switchPrimary(now time.Time, s int, to string, epoch, version int64) {
	typ, _, _ := strings.Cut(to, "/")
	c.st.Replicas[s] = Replica{Primary: typ, Epoch: max(epoch, c.st.Replicas[s].Epoch)}
	r := &c.rep[s]
	r.attached, r.seen, r.lost = false, version, ""
	r.told, r.toldKnown, r.toldAt = "", true, now
	r.standbyUp, r.standbyDown = false, time.Time{} // the dead primary's record is the failover's
	c.down[s] = time.Time{}
}

// recordFailover counts and reports a promotion.
func (c *Core) recordFailover(now time.Time, s int, f *failover, version int64) {
	lost := max(0, f.seen-version)
	took := now.Sub(f.detected)
	c.st.Restarts = append(c.st.Restarts, report.Restart{Task: f.dead, KilledAtSeconds: c.seconds(f.detected),
		BackAtSeconds: ptr(c.seconds(now)), RestoredStep: version, StepsLost: lost, TookOver: f.to,
		FailoverSeconds: took.Seconds()})
	c.m.Failovers.WithLabelValues(fmt.Sprint(s)).Inc()
	c.m.TaskRestarts.WithLabelValues(f.dead).Inc()
	c.m.Recovery.Observe(took.Seconds())
	c.m.StepsLost.Add(float64(lost))
	c.log.Warn("standby promoted", "task", f.dead, "standby", f.to, "shard", s, "version", version,
		"steps_lost", lost, "failover_seconds", fmt.Sprintf("%.3f", took.Seconds()), "epoch", c.st.Replicas[s].Epoch)
}

// adoptionOf is what a restarted chief finds in its processes' answers
// (ps[s] from ps/s, standby[s] from standby/s; standby nil without hot
// standbys) and its saved state: each shard's primary (the process that
// says it is, the newest epoch first; else the saved one), and the
// generation and lowest version among the serving primaries. ok is
// false when there is nothing to adopt: no primary serves this run, or
// one serves another run (the tasks register afresh).
func adoptionOf(ps, standby []ShardStatus, saved *State) (a Adoption, ok bool) {
	a.Saved = saved
	prims := ps
	if len(standby) > 0 {
		prims = nil
		for s := range ps {
			rp, prim := adoptedReplica(s, ps[s], standby[s], saved)
			a.Replicas = append(a.Replicas, rp)
			prims = append(prims, prim)
		}
	}
	a.Step = -1
	lo := int64(-1)
	for _, st := range prims {
		if st.Err != nil || !st.Serving {
			if st.Err == nil && st.otherRun {
				return Adoption{}, false
			}
			continue
		}
		if a.Step < 0 {
			a.Step, lo = st.Version, st.Generation
		}
		a.Generation, lo = max(a.Generation, st.Generation), min(lo, st.Generation)
		a.Step = min(a.Step, st.Version)
	}
	if a.Step < 0 {
		return Adoption{}, false
	}
	a.Split = lo != a.Generation
	return a, true
}

// adoptedReplica is shard s's replica as its processes' answers (x from
// ps/s, y from standby/s) and the saved state say: the process that says
// it is the primary (the newer epoch first; else the saved one) and the
// newest epoch (at least 1). prim is the primary's answer.
func adoptedReplica(s int, x, y ShardStatus, saved *State) (rp Replica, prim ShardStatus) {
	rp = Replica{Primary: cluster.PS}
	if saved != nil && s < len(saved.Replicas) {
		rp = saved.Replicas[s]
	}
	for _, z := range []ShardStatus{x, y} {
		if z.Err == nil {
			rp.Epoch = max(rp.Epoch, z.Epoch)
		}
	}
	isPrimary := func(z ShardStatus) bool { return z.Err == nil && z.Role == rolePrimary }
	switch {
	case isPrimary(y) && (!isPrimary(x) || y.Epoch > x.Epoch):
		rp.Primary = cluster.Standby
	case isPrimary(x):
		rp.Primary = cluster.PS
	}
	rp.Epoch = max(rp.Epoch, 1)
	if rp.Primary == cluster.Standby {
		return rp, y
	}
	return rp, x
}

// adoptReplicas takes each shard's primary and epoch from what the
// processes said (found; nil: none said), else from the saved state,
// else the start's.
func (c *Core) adoptReplicas(found []Replica) {
	n := len(c.rep)
	for s := len(c.st.Replicas); s < n; s++ {
		c.st.Replicas = append(c.st.Replicas, Replica{Primary: cluster.PS, Epoch: 1})
	}
	c.st.Replicas = c.st.Replicas[:n] // (a state saved during a PS count change may list the added shards)
	for s := range min(n, len(found)) {
		c.st.Replicas[s] = Replica{Primary: found[s].Primary, Epoch: max(found[s].Epoch, c.st.Replicas[s].Epoch)}
	}
	for s := range c.rep {
		c.rep[s] = replicaRun{}
	}
}
