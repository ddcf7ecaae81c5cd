// Package worker is the training loop of one worker task: pull the
// parameters from every PS shard in parallel, run the forward and backward
// pass on the next batch of its data shard, push each shard its slice of
// the gradient in parallel, repeat until a shard says training is done.
//
// # The core and its driver
//
// Core (core.go) is the loop's decisions as a plain state machine, like
// chief.Core: events come in through its methods, each with the time
// (Start, Pulled, HeadStarted, RowsFinal, Computed, Pushed), and the
// decisions go out as Actions (actions.go): PullRound, CancelPulls,
// TakeBack, Forget, Seek, HeadStart, Compute, Push, Phase, StepDone,
// Finish. It does no I/O and reads no clock. Worker.Run (worker.go,
// driver.go, rpc.go) is the driver: it carries out the actions and feeds
// the outcomes back; pulls and pushes run on goroutines of their own and
// report on a channel, and only the Run goroutine touches the core, the
// net and the batch source. The scripts in testdata/*.txt replay events
// against the core and show its actions (TestScenarios).
//
// A step goes through these states:
//
//	pulling     the step's pull rounds: every shard at the version the
//	            last step reached (sync; any version in async and ssp),
//	            then, while ps.Align asks for it, again the shards behind
//	            (bounded by the catch-up delay) or in an older generation.
//	computing   the passes on the batch at the data position (Compute);
//	            with early pushes, the shards whose slice of the gradient
//	            is final are pushed while the net computes the rest.
//	catchingUp  ps.Align found a shard stalled behind the others: a
//	            gradient computed on what the worker has is pushed to it,
//	            then every shard is pulled again.
//	pushing     the step's other pushes; with the next step's pulls
//	            (overlap) those go out at the same time and wait at the
//	            shards.
//	draining    a call failed or the passes did: the calls under way are
//	            waited for (cancelled if pulls), then Finish with the error.
//	finished    Finish was returned: training done (nil) or the error.
//
// Three states live beside these, each in a file of its own:
//
//   - early pushes (early_push.go): armed while a step's passes run;
//     RowsFinal sends the shards whose rows are final;
//   - the step started ahead (head_start.go): during a step's first pull
//     round, the shards that answered first let the net load the batch
//     and compute their rows of the first product (HeadStart); the step
//     takes it if the round was the step's and the data position did not
//     move, else it is forgotten and the batch put back;
//   - in-place reads (inplace_reads.go): by shard, whether the net reads
//     the parameters where the pull left them and whether a pull sent
//     since may have unmapped them.
//
// # Ordering rules
//
//   - Actions are carried out in the order returned. PullRound and Push
//     start calls and return; every pull and push is answered exactly once
//     (Pulled, Pushed), cancelled ones with their error. HeadStart and
//     Compute run to the end before anything else and end their batch.
//   - Nothing reads the parameters of a shard between the sending of its
//     pull and its answer: the passes and a HeadStart come only after the
//     answers they read, and a shard read in place is taken back (copied
//     into the weights) before it is pulled in a round after the first.
//   - A step's pushes are tagged with the versions its gradient was
//     computed from (the views at its Compute), whatever the next step's
//     pulls answer meanwhile; the data position they carry is one past
//     the step's batch.
//   - The next step's pulls sent with the pushes are kept only if they
//     settle on a step at the step's version or later, after every push
//     was answered; otherwise every shard is pulled again from the views
//     the pushes were tagged with.
//   - A step is done (StepDone) when every push of it, early or not, is
//     answered; a push that fails ends Run, and the next pulls under way
//     are cancelled first.
//   - Finish comes only when no call is under way, after the TakeBacks
//     that leave the net reading its weights.
//
// # Data positions
//
// Where a worker is in its data shard is part of the run's state, kept by
// the shards (docs/recovery.md, "Data positions"): each pull answers with
// the number of the worker's batches whose gradients that shard holds, and
// the worker trains on the batch at the largest such number. So a
// restarted worker resumes where its predecessor's gradients stop, a
// rollback to a checkpoint rewinds the data with the model, and a batch
// whose gradient no shard counted (dropped as stale) is used again.
//
// # Failures
//
// A worker rides through PS restarts: an unavailable shard is retried with
// exponential backoff until RetryTimeout (the driver's calls), after which
// Run fails with the shard's address in the error. A shard with a hot
// standby is reached through failover.go's data plane, which switches
// processes when refused; the core sees only the calls' outcomes.
package worker
