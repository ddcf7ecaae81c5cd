// Package sweep runs experiment grids: every configuration of a grid of
// `pstrain run` flags, each as a real local cluster (the pstrain binary run
// as a subprocess), one after another, repeated with successive seeds.
//
// While a run trains, its Prometheus file_sd target file is polled and every
// task's /metrics endpoint is sampled (CPU seconds, resident memory, host
// load). The output directory then holds, per run, runs/ID/report.json (the
// run's report, written last: it marks the run finished), samples.csv,
// meta.json and output.log; and for the whole sweep results.csv (one row per
// run) and summary.md (medians and ranges per configuration and per varied
// parameter), rewritten after every run so an interrupted sweep leaves
// complete results for its finished runs. Re-running a sweep skips the runs
// already finished. Run IDs are hashes of the configuration (plus the
// repeat), so reordering or extending a grid still finds earlier runs.
//
// Plots are drawn from these files by package figures.
package sweep
