// Package ps is one parameter-server shard.
//
// Shard is the state machine: it holds a flat slice of the model's
// parameters (the blocks partition.Plan assigned to it), the optimizer
// state for exactly those elements, and a version, and applies the update
// rule of the run's mode:
//
//   - sync: a gradient tagged with the current version is summed into the
//     step; when the step has min(R, live workers) gradients their mean is
//     applied and the version advances. Gradients tagged with an older
//     version (a backup worker that lost the race) are dropped and counted.
//   - async: every gradient is applied on arrival; its staleness (version at
//     arrival minus the version it was computed from) is reported.
//   - ssp: async, but a worker's pull is held back while it is more than
//     Staleness gradients ahead of the slowest live worker.
//
// The Shard also keeps each worker's data position (DataPosition): one
// past the furthest of the worker's batches whose gradient its parameters
// hold, which pulls report and checkpoints record, so that workers use
// every sample once per epoch through restarts and rollbacks
// (docs/recovery.md, "Data positions").
//
// A shard knows of the run only its Options (mode, replicas, staleness,
// workers, optimizer and learning rate, NaN policy, gradient wire type):
// the chief builds them from the run configuration with OptionsFor and
// sends them in InitRequest.shard_options, and Init refuses options the
// run configuration's rules (config.Run.Validate) would refuse.
//
// Align is the worker's half of the sync rule, kept here beside the
// shard's half: from what each shard answered (version, generation,
// done), which shards to pull again, when a lagging shard needs a
// catch-up gradient, and when the step may start (docs/semantics.md).
//
// Server is the thin gRPC wrapper: it serialises calls into the Shard,
// blocks pulls until the Shard says they are ready, and records metrics.
// Pulls of a version share one immutable byte buffer, so answering many
// workers costs one copy per version at most: none when the push that
// made the version wrote it in its update's pass (Shard.Take,
// Gradient.Out). A pull with retain set (the chief's
// evaluation) keeps its version's state for a Checkpoint with retained
// set, holding that buffer rather than copying it.
package ps
