// Package bench measures pstrain's performance as ratios taken in one run,
// so that they hold on a shared, noisy machine: each figure is set against a
// ceiling measured minutes (not days) apart on the same cores.
//
// The sections, each a function with its own Config:
//
//   - Compute: one worker's forward+backward (nn) against the same BLAS
//     running only the step's matrix products (Products, StepFLOPs).
//   - Wire: push+pull round trips of the whole parameter set against one
//     in-process PS over loopback TCP gRPC, against a raw TCP echo of the
//     same payload (TCPEcho).
//   - Overhead: 1 PS + 1 worker over loopback gRPC against the same model
//     trained in-process with a local optimizer.
//   - Cluster: the real binary's steady samples/s (the stretch a long run
//     trains beyond a short one) for the default, async and 1+1 clusters,
//     against cores x one process's BLAS ceiling (Ceiling, Efficiency).
//   - EndToEnd: the real binary (`pstrain run --report`) to the target
//     accuracy, its time to target over the ideal time
//     (TimeToTargetOverIdeal), and short fixed runs over a grid of
//     workers, PS and modes.
//   - Memory: each PS's peak RSS (from a run report) against the bytes of
//     parameters and optimizer state its shard holds (StateBytes).
//
// Run drives the selected sections and returns a Result, which encodes to
// the JSON of the architecture contract ("Bench JSON") and prints as a table.
// Nothing here keeps package-level state; every measurement loop stops on
// its context or its time budget.
package bench
