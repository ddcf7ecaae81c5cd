// Package embed holds what every holder of an embedding table agrees on:
// where a row lives (ShardOf), what a row is before anyone trains it
// (InitRow), how a batch's keys collapse to unique rows (Deduper,
// Combine), and how one row is updated by its gradient (Rule).
//
// The functions are pure and deterministic: a row created on first touch
// is the same bytes whichever shard, worker or single-process trainer
// creates it, so sync runs stay reproducible and a table can be resharded
// by moving rows without changing any of them.
package embed
